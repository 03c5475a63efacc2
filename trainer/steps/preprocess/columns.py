"""Column typing and validation for preprocess: which columns are features (and of what kind),
the target and its task, and value ranges that float32 holds (the checks after the split are
:mod:`trainer.steps.preprocess.splits`). Every rejection is an ``InputError`` naming the column,
row or file, with advice.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from trainer.base.errors import InputError
from trainer.steps.preprocess.config import PreprocessConfig
from trainer.steps.preprocess.tabular import (
    RawInput,
    dictionary_codes,
    dtype_name,
    guess_delimiter,
    is_number,
    is_text,
    param,
    role_param,
)
from trainer.steps.preprocess.text_values import Notice, numbers_in_text

FLOAT32_MAX = float(np.finfo(np.float32).max)
"""Largest value training (float32) can hold; larger inputs or standardised values overflow."""
MAX_REGRESSION_TARGET = float(np.sqrt(FLOAT32_MAX)) / 2
"""Largest magnitude of a regression target (about 9.2e18): a squared error of values up to
twice this still fits float32, so the loss and evaluate's squared-error metrics stay finite."""


# An integer (or integral float) target with at most this many distinct values is a class label.
MAX_AUTO_CLASSES = 20


# What a number written as text looks like (RE2 syntax); "inf"/"nan" count, so they are caught
# by the infinite-value check or read as missing instead of being called text.
_NUMBER_RE = r"^\s*[-+]?((\d+(\.\d*)?|\.\d+)([eE][-+]?\d+)?|(?i:inf|infinity|nan))\s*$"


def _text_as_numbers(
    data: RawInput, name: str, codes: np.ndarray, values: list[str], *, declared: bool
) -> np.ndarray | None:
    """float64 values of a text column that holds numbers, or None if it holds words.

    Raises:
        InputError: The column is declared numeric (``declared``) but holds words, or it looks
            numeric (most values are numbers) but some are not; names a bad value and its row.
    """
    is_num = pc.match_substring_regex(pa.array(values, pa.string()), _NUMBER_RE)
    numeric = np.append(is_num.to_numpy(zero_copy_only=False).astype(bool), True)  # -1: missing
    counts = np.bincount(codes + 1, minlength=len(values) + 1)[1:]
    n_numbers = int(counts[numeric[:-1]].sum())
    n_words = int(counts.sum()) - n_numbers
    if n_words == 0:
        as_float = pc.cast(pc.utf8_trim_whitespace(pa.array(values, pa.string())), pa.float64())
        return np.append(as_float.to_numpy(zero_copy_only=False), np.nan)[codes]
    if not declared and n_numbers <= n_words:
        return None  # a text column with the odd number in it: categorical
    row = int(np.flatnonzero(~numeric[codes])[0])
    bad = values[codes[row]]
    as_missing = (
        f", or read {bad!r} as missing with {param('csv_null_values', bad)}"
        if data.any_csv and "," not in bad
        else ""
    )
    if declared:
        raise InputError(
            "E_SCHEMA",
            f"column {name!r} is declared numeric (column_roles_json) but holds text: {bad!r} "
            f"is not a number; fix the value, declare the column categorical with "
            f"{role_param(name, 'categorical')}{as_missing}",
            data.locate(row),
        )
    raise InputError(
        "E_MIXED_TYPES",
        f"column {name!r} mixes numbers and text ({n_numbers} numbers, {n_words} other): "
        f"{bad!r} is not a number; fix the value, declare the column categorical with "
        f"{role_param(name, 'categorical')}{as_missing}",
        data.locate(row),
    )


def _numbers(data: RawInput, name: str, col: pa.ChunkedArray, *, target: bool) -> np.ndarray:
    """float64 copy of a numeric column, NaN for missing (null or NaN).

    Raises:
        InputError: If a value is infinite or beyond float32's range (names the row).
    """
    arr = col.combine_chunks() if col.num_chunks != 1 else col.chunk(0)
    if not pa.types.is_float64(arr.type):
        # Unsafe: an integer beyond 2**53 (an id-like count) becomes the nearest float64, as
        # every numeric library rounds it; a safe cast refused it with a traceback (found by
        # tests/unit/test_table_search.py). Its range is checked below like any number's.
        arr = arr.cast(pa.float64(), safe=False)
    x = arr.to_numpy(zero_copy_only=False)  # may be read-only: encoders get a gathered copy
    _check_range(data, name, x, target=target)
    return x


def _check_range(data: RawInput, name: str, x: np.ndarray, *, target: bool) -> None:
    """Reject infinite values and values that float32 (what training computes in) cannot hold."""
    with np.errstate(invalid="ignore"):
        bad = np.abs(x) > FLOAT32_MAX  # NaN (missing) compares False
    if not bad.any():
        return
    row = int(np.argmax(bad))
    fix = (
        "fix the target value or pick another --param target"
        if target
        else f"fix the value, leave it empty, or drop the column with {role_param(name, 'drop')}"
    )
    if np.isinf(x[row]):
        raise InputError(
            "E_INFINITE", f"column {name!r} holds an infinite value ({x[row]}); {fix}",
            data.locate(row),
        )  # fmt: skip
    raise InputError(
        "E_OVERFLOW",
        f"column {name!r} holds {x[row]:g}, beyond the float32 range (+-{FLOAT32_MAX:.1e}) that "
        f"training computes in; rescale the column (e.g. store thousands or a log), or {fix}",
        data.locate(row),
    )


@dataclass(slots=True)
class _Column:
    """A feature column ready to encode: float64 values or (codes, values) over all rows."""

    name: str
    kind: str
    dtype: str
    numbers: np.ndarray | None = None
    codes: np.ndarray | None = None
    values: list[str] | None = None


def _comma_numbers_notice(
    data: RawInput, cfg: PreprocessConfig, name: str, values: list[str], notes: list[Notice]
) -> bool:
    """Note a text column of numbers written with the other decimal separator (kept as text)."""
    found = numbers_in_text(values)
    if found is None or found.separator == cfg.csv_decimal or not data.any_csv:
        return False
    notes.append(
        Notice(
            "W_DECIMAL",
            f"column {name!r} holds numbers written with decimal {found.separator!r} (e.g. "
            f"{found.example!r}), read as text: it becomes a category of {len(values)} values; "
            f"to read them as numbers set {param('csv_decimal', found.separator)}",
            data.uri,
        )
    )
    return True


def _shown(names: list[str]) -> str:
    return ", ".join(names[:20]) + (", ..." if len(names) > 20 else "")


def _label(v: Any) -> str:
    """A class label as text: integral numbers without a trailing ``.0``."""
    if isinstance(v, float) and v.is_integer():
        return str(int(v))
    return str(v)


def _target_hint(data: RawInput, cfg: PreprocessConfig) -> str:
    """Advice for a target that is not a column: a likely separator, or the likely column."""
    names, target = data.table.column_names, cfg.target
    if data.any_csv and len(names) == 1:
        used = cfg.csv_options().delimiter_for(data.files[0])
        sep = guess_delimiter(names[0], used)
        if (sep if sep != "tab" else "\t") in names[0]:
            return f"; the file looks {sep!r}-separated: set {param('csv_delimiter', sep)}"
    same_case = [n for n in names if n.casefold() == target.casefold()]
    close = same_case or difflib.get_close_matches(target, names, n=1)
    if close:
        return f"; did you mean {close[0]!r}? set {param('target', close[0])}"
    return "; set --param target=<one of the columns>"


def _text_numbers_target(
    data: RawInput, cfg: PreprocessConfig, values: list[str], notes: list[Notice]
) -> None:
    """Refuse (or, with task=classification, note) a text target that holds numbers.

    Numbers read as text would be classes, one per distinct number: 295 classes of a quality
    score written ``5,5`` is never what a person meant. Whole numbers with few distinct values
    (``"0"``, ``"1"``) are labels and pass.
    """
    found = numbers_in_text(values)
    if found is None:
        return
    name, k = cfg.target, len(values)
    integral = bool(np.all(found.numbers == np.floor(found.numbers)))
    if integral and k <= MAX_AUTO_CLASSES:
        return
    how = (
        f"written with decimal {found.separator!r} (e.g. {found.example!r})"
        if found.separator != cfg.csv_decimal
        else f"stored as text (e.g. {found.example!r})"
    )
    if cfg.task == "classification":
        notes.append(
            Notice(
                "W_TARGET",
                f"target {name!r} holds numbers {how}; task=classification makes them {k} classes",
                data.uri,
            )
        )
        return
    fix = (
        f"set {param('csv_decimal', found.separator)} to read them as numbers"
        if found.separator != cfg.csv_decimal and data.any_csv
        else "store the column as numbers"
    )
    raise InputError(
        "E_TARGET",
        f"target {name!r} holds numbers {how}, read as text, which would make {k} classes; "
        f"{fix}, or use them as labels with {param('task', 'classification')}",
        data.uri,
    )


def _numeric_task(data: RawInput, cfg: PreprocessConfig, x: np.ndarray, notes: list[Notice]) -> str:
    """The task for a numeric target, and a note that says why (a warning when it is close)."""
    name = cfg.target
    uniq = np.unique(x)
    integral = bool(np.all(uniq == np.floor(uniq)))
    shown = ", ".join(_label(v) for v in uniq[:5].tolist()) + (", ..." if uniq.size > 5 else "")
    if cfg.task != "auto":
        notes.append(Notice("I_TASK", f"task {cfg.task}: set by the task parameter", name))
        return cfg.task
    if integral and uniq.size <= MAX_AUTO_CLASSES:
        notes.append(
            Notice(
                "I_TASK",
                f"task classification: target {name!r} has {uniq.size} distinct whole numbers "
                f"({shown}), at most {MAX_AUTO_CLASSES}, read as classes; set "
                f"{param('task', 'regression')} if they are quantities",
                name,
            )
        )
        return "classification"
    if uniq.size <= MAX_AUTO_CLASSES:
        notes.append(
            Notice(
                "W_TASK",
                f"task regression: target {name!r} has only {uniq.size} distinct values "
                f"({shown}), not all whole numbers, so they are read as quantities; if they "
                f"are labels, set {param('task', 'classification')}",
                name,
            )
        )
        return "regression"
    why = "values" if not integral else f"whole numbers, more than {MAX_AUTO_CLASSES}"
    notes.append(
        Notice(
            "I_TASK",
            f"task regression: target {name!r} is numeric with {uniq.size} distinct {why}",
            name,
        )
    )
    return "regression"


def _check_regression_target(data: RawInput, name: str, x: np.ndarray) -> None:
    """Refuse a regression target that cannot be learned or scored: one value in every row
    (like a classification target of one class), or values whose squared errors overflow."""
    if x.size == 0:
        raise InputError("E_EMPTY", "dataset has no rows", data.uri)
    lo, hi = float(x.min()), float(x.max())
    if lo == hi:
        raise InputError(
            "E_TARGET",
            f"target column {name!r} has one value ({_label(lo)}) in every row; regression "
            "needs values that vary: pick another --param target",
            data.uri,
        )
    big = np.abs(x) > MAX_REGRESSION_TARGET
    if big.any():
        row = int(np.argmax(big))
        raise InputError(
            "E_OVERFLOW",
            f"regression target {name!r} holds {x[row]:g}, beyond +-{MAX_REGRESSION_TARGET:.1e}: "
            "its squared errors overflow the float32 that training and scoring compute in; "
            "rescale the column (e.g. store it in units of 1e12, or its log) or pick another "
            "--param target",
            data.locate(row),
        )


def label_variants(
    name: str, classes: list[str] | None, y: np.ndarray, notes: list[Notice]
) -> None:
    """``W_LABELS`` when class labels differ only in surrounding spaces or in case (``yes`` and
    ``yes `` in a hand-edited export): each is a class of its own, and a model split across
    them is worse and says so nowhere. Named with their row counts and how to merge them."""
    if not classes:
        return
    groups: dict[str, list[int]] = {}
    for i, label in enumerate(classes):
        groups.setdefault(label.strip().casefold(), []).append(i)
    clashes = [ix for ix in groups.values() if len(ix) > 1]
    if not clashes:
        return
    counts = np.bincount(np.asarray(y, dtype=np.int64), minlength=len(classes))
    shown = "; ".join(
        " and ".join(f"{classes[i]!r} ({int(counts[i])} rows)" for i in ix) for ix in clashes[:5]
    )
    more = f" (and {len(clashes) - 5} more such groups)" if len(clashes) > 5 else ""
    notes.append(
        Notice(
            "W_LABELS",
            f"target {name!r} has labels that differ only in surrounding spaces or case, each "
            f"a class of its own: {shown}{more}; if they mean one class, merge them in the data "
            "(strip the spaces and use one spelling) and run again",
            name,
        )
    )


def target_column(
    data: RawInput, cfg: PreprocessConfig, notes: list[Notice] | None = None
) -> tuple[np.ndarray, str, list[str] | None]:
    """The target as (int64 class ids or float32 values, task, class labels or None).

    ``notes`` receives the task decision and why (``I_TASK``), and warnings (``W_TASK``:
    few distinct values that are not whole numbers, read as regression).
    """
    notes = notes if notes is not None else []
    table, name = data.table, cfg.target
    if name not in table.column_names:
        raise InputError(
            "E_COLUMN",
            f"target column {name!r} not found (columns: {_shown(table.column_names)})"
            + _target_hint(data, cfg),
            data.uri,
        )
    col = table.column(name)
    boolean = pa.types.is_boolean(col.type)
    if boolean:
        col = col.cast(pa.string())  # "false"/"true": labels, not numbers
    if col.null_count:
        row = int(np.argmax(col.is_null().to_numpy(zero_copy_only=False)))
        raise InputError(
            "E_TARGET",
            f"target column {name!r} has {col.null_count} missing values; every row needs one: "
            "fill them or remove those rows",
            data.locate(row),
        )
    if is_text(col.type):
        codes, values = dictionary_codes(col)
        _text_numbers_target(data, cfg, values, notes)
        if cfg.task == "regression":
            raise InputError(
                "E_TARGET",
                f"regression target {name!r} must be numeric, got {dtype_name(col.type)}; set "
                f"{param('task', 'classification')} or pick another --param target",
                data.uri,
            )
        order = np.argsort(np.array(values, dtype=object), kind="stable")
        classes = [values[i] for i in order]
        rank = np.empty(len(values), dtype=np.int64)
        rank[order] = np.arange(len(values))
        y, task = rank[codes], "classification"
        how = (
            "set by the task parameter"
            if cfg.task != "auto"
            else ("true/false labels" if boolean else "text labels")
        )
        notes.append(Notice("I_TASK", f"task classification: {how}, {len(classes)} classes", name))
    elif is_number(col.type):
        x = _numbers(data, name, col, target=True)
        if np.isnan(x).any():
            row = int(np.argmax(np.isnan(x)))
            raise InputError(
                "E_TARGET",
                f"target column {name!r} has NaN values; every row needs one: fill them or "
                "remove those rows",
                data.locate(row),
            )
        task = _numeric_task(data, cfg, x, notes)
        if task == "regression":
            _check_regression_target(data, name, x)
            return x.astype(np.float32), task, None
        uniq, y = np.unique(x, return_inverse=True)
        classes = [_label(v) for v in uniq.tolist()]
    else:
        raise InputError(
            "E_TARGET",
            f"target column {name!r} has unsupported type {dtype_name(col.type)} (numbers and "
            "text are supported); pick another --param target",
            data.uri,
        )
    if not classes:
        raise InputError("E_EMPTY", "dataset has no rows", data.uri)
    if len(classes) < 2:
        raise InputError(
            "E_TARGET",
            f"target column {name!r} has one class ({classes[0]!r}); classification needs at "
            "least two: pick another --param target",
            data.uri,
        )
    return y.astype(np.int64), task, classes
