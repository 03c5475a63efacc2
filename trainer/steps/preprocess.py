"""The preprocess step: raw Parquet/CSV to validated, encoded, standardised data splits."""

from __future__ import annotations

import codecs
import dataclasses
import difflib
import json
import re
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from trainer import storage
from trainer.config import apply_overrides, from_dict, require
from trainer.errors import InputError
from trainer.outputs import atomic_dir, check_output_location
from trainer.steps.tabular import (
    CategoricalFit,
    CsvOptions,
    NoTrainingValues,
    NumericFit,
    RawInput,
    dictionary_codes,
    dtype_name,
    encode_categorical,
    encode_numeric,
    guess_delimiter,
    is_number,
    is_text,
    param,
    read_input,
    role_param,
    split_indices,
)

SCHEMA_FORMAT = "gpupipe.schema/v1"
COLUMN_KINDS = ("numeric", "categorical", "drop")
FLOAT32_MAX = float(np.finfo(np.float32).max)
"""Largest value training (float32) can hold; larger inputs or standardised values overflow."""
MIN_SPLIT_ROWS = 1
"""Rows each split needs: train trains on it, train validates on val, evaluate scores test.
(Train also needs a full batch; only the train step knows the batch size, and checks it.)"""
# An integer (or integral float) target with at most this many distinct values is a class label.
MAX_AUTO_CLASSES = 20
# What a number written as text looks like (RE2 syntax); "inf"/"nan" count, so they are caught
# by the infinite-value check or read as missing instead of being called text.
_NUMBER_RE = r"^\s*[-+]?((\d+(\.\d*)?|\.\d+)([eE][-+]?\d+)?|(?i:inf|infinity|nan))\s*$"
# Fixed writer options: the same table always gives the same bytes.
_PARQUET_OPTIONS: dict[str, Any] = {
    "compression": "snappy",
    "row_group_size": 128 * 1024,
    "write_statistics": True,
}


@dataclass(kw_only=True, slots=True)
class PreprocessConfig:
    """What preprocess reads, how it types the columns, and how it splits the rows."""

    target: str
    """The target column."""
    task: Literal["auto", "classification", "regression"] = "auto"
    """``auto``: text or bool targets, and integer-valued targets with at most 20 distinct values,
    are classification; any other numeric target is regression."""
    column_roles: dict[str, str] = field(default_factory=dict)
    """Declared roles of feature columns: ``numeric``, ``categorical`` or ``drop``. Columns not
    named here are inferred: numbers are numeric, text is categorical. (Pipeline parameter
    ``column_roles_json``.)"""
    val_fraction: float = 0.15
    """Share of rows for the validation split (train validates on it; at least one row)."""
    test_fraction: float = 0.15
    """Share of rows for the test split (evaluate scores it; at least one row)."""
    seed: int = 0
    """Seed of the split; the same input and seed give byte-identical outputs."""
    max_categories: int = 50
    """Categories kept per categorical column (most frequent in train); rarer -> ``__other__``."""
    missing_indicator: bool = True
    """Add a ``<col>__missing`` 0/1 feature for numeric columns with missing values in train."""
    csv_delimiter: str = "auto"
    """Field separator of CSV input: one character, ``tab``, or ``auto`` (a tab for ``.tsv``
    files, else a comma)."""
    csv_header: bool = True
    """CSV files start with a header line; without one columns are ``column_1``, ``column_2`` ..."""
    csv_encoding: str = "utf-8"
    """Text encoding of CSV files (a Python codec name such as ``latin-1`` or ``cp1252``)."""
    csv_null_values: list[str] = field(default_factory=list)
    """CSV values read as missing, besides the empty field, ``NA``, ``N/A``, ``null``, ``NaN``
    and the other pyarrow defaults (e.g. ``["?", "-"]``)."""

    def __post_init__(self) -> None:
        require(bool(self.target), "target", "must name a column", self.target)
        require(
            self.task in ("auto", "classification", "regression"),
            "task",
            "must be one of auto, classification, regression",
            self.task,
        )
        for name, kind in self.column_roles.items():
            require(
                kind in COLUMN_KINDS,
                f"column_roles.{name}",
                f"must be one of {', '.join(COLUMN_KINDS)}",
                kind,
            )
        require(
            self.target not in self.column_roles,
            f"column_roles.{self.target}",
            "must not name the target (the target is typed by the task parameter)",
            self.column_roles.get(self.target),
        )
        require(0 < self.val_fraction < 1, "val_fraction", "must be in (0, 1)", self.val_fraction)
        require(
            0 < self.test_fraction < 1, "test_fraction", "must be in (0, 1)", self.test_fraction
        )
        require(
            self.val_fraction + self.test_fraction < 1,
            "test_fraction",
            f"plus val_fraction={self.val_fraction} must be < 1 (rows must remain for training)",
            self.test_fraction,
        )
        require(self.seed >= 0, "seed", "must be >= 0", self.seed)
        require(self.max_categories > 0, "max_categories", "must be > 0", self.max_categories)
        require(
            self.csv_delimiter in ("auto", "tab")
            or (len(self.csv_delimiter) == 1 and self.csv_delimiter not in '"\r\n'),
            "csv_delimiter",
            "must be one character (not a quote or line break), 'tab' or 'auto'",
            self.csv_delimiter,
        )
        require(
            _is_codec(self.csv_encoding),
            "csv_encoding",
            "must name a text encoding",
            self.csv_encoding,
        )
        for value in self.csv_null_values:
            require(
                isinstance(value, str), "csv_null_values", "must hold strings", self.csv_null_values
            )

    def csv_options(self) -> CsvOptions:
        """How CSV input is parsed."""
        return CsvOptions(
            delimiter=self.csv_delimiter,
            header=self.csv_header,
            encoding=self.csv_encoding,
            null_values=tuple(self.csv_null_values),
        )


def _is_codec(name: str) -> bool:
    try:
        return codecs.lookup(name) is not None
    except LookupError:
        return False


@dataclass(slots=True)
class PreprocessResult:
    """What preprocess produced; also recorded in ``schema.json``."""

    train_rows: int
    val_rows: int
    test_rows: int
    features: list[str]
    task: str
    classes: list[str] | None
    data_hash: str

    def to_dict(self) -> dict[str, Any]:
        """Plain-JSON form (for KFP outputs and logs)."""
        return dataclasses.asdict(self)


# --------------------------------------------------------------------------------------------
# Column typing and validation
# --------------------------------------------------------------------------------------------


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
        arr = arr.cast(pa.float64())
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


def _feature_columns(data: RawInput, cfg: PreprocessConfig) -> tuple[list[_Column], list[str]]:
    """Type and validate every feature column; returns (columns, dropped column names)."""
    table = data.table
    roles = cfg.column_roles
    absent = [n for n in roles if n not in table.column_names]
    if absent:
        raise InputError(
            "E_SCHEMA",
            f"column_roles_json names column {absent[0]!r}, which is not in the data "
            f"(columns: {_shown(table.column_names)}); fix the name or remove it",
            data.uri,
        )
    others = [n for n in table.column_names if n != cfg.target]
    names = [n for n in others if roles.get(n) != "drop"]
    dropped = [n for n in others if roles.get(n) == "drop"]
    out = []
    for name in names:
        col = table.column(name)
        declared = roles.get(name)
        if col.null_count == len(col):
            raise InputError(
                "E_ALL_MISSING",
                f"column {name!r} has no values (all {len(col)} missing); fill it, or drop it "
                f"with {role_param(name, 'drop')}",
                data.uri,
            )
        dtype = dtype_name(col.type)
        if is_number(col.type):
            if declared == "categorical":
                col = col.cast(pa.string())
                codes, values = dictionary_codes(col)
                out.append(_Column(name, "categorical", dtype, codes=codes, values=values))
                continue
            x = _numbers(data, name, col, target=False)
        elif is_text(col.type):
            codes, values = dictionary_codes(col)
            if declared == "categorical":
                out.append(_Column(name, "categorical", dtype, codes=codes, values=values))
                continue
            maybe = _text_as_numbers(data, name, codes, values, declared=declared == "numeric")
            if maybe is None:
                out.append(_Column(name, "categorical", dtype, codes=codes, values=values))
                continue
            x = maybe
            _check_range(data, name, x, target=False)
        else:
            raise InputError(
                "E_SCHEMA",
                f"column {name!r} has unsupported type {dtype} (numbers and text are supported); "
                f"drop it with {role_param(name, 'drop')}",
                data.uri,
            )
        if np.isnan(x).all():
            raise InputError(
                "E_ALL_MISSING",
                f"column {name!r} has no values (all {len(x)} missing or NaN); fill it, or drop "
                f"it with {role_param(name, 'drop')}",
                data.uri,
            )
        out.append(_Column(name, "numeric", dtype, numbers=x))
    if not out:
        why = (
            f"column_roles_json drops every other column ({_shown(dropped)}); declare one "
            f"numeric or categorical, e.g. {role_param(dropped[0], 'numeric')}"
            if dropped
            else "the data holds only the target; add feature columns"
        )
        raise InputError(
            "E_SCHEMA", f"no feature columns besides target {cfg.target!r}: {why}", data.uri
        )
    return out, dropped


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
    close = difflib.get_close_matches(target, names, n=1)
    if close:
        return f"; did you mean {close[0]!r}? set {param('target', close[0])}"
    return "; set --param target=<one of the columns>"


def _target(data: RawInput, cfg: PreprocessConfig) -> tuple[np.ndarray, str, list[str] | None]:
    """The target as (int64 class ids or float32 values, task, class labels or None)."""
    table, name = data.table, cfg.target
    if name not in table.column_names:
        raise InputError(
            "E_COLUMN",
            f"target column {name!r} not found (columns: {_shown(table.column_names)})"
            + _target_hint(data, cfg),
            data.uri,
        )
    col = table.column(name)
    if pa.types.is_boolean(col.type):
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
        if cfg.task == "regression":
            raise InputError(
                "E_TARGET",
                f"regression target {name!r} must be numeric, got {dtype_name(col.type)}; set "
                f"{param('task', 'classification')} or pick another --param target",
                data.uri,
            )
        codes, values = dictionary_codes(col)
        order = np.argsort(np.array(values, dtype=object), kind="stable")
        classes = [values[i] for i in order]
        rank = np.empty(len(values), dtype=np.int64)
        rank[order] = np.arange(len(values))
        y, task = rank[codes], "classification"
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
        task = cfg.task
        if task == "auto":
            integral = bool(np.all(x == np.floor(x)))
            few = integral and len(np.unique(x)) <= MAX_AUTO_CLASSES
            task = "classification" if few else "regression"
        if task == "regression":
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
    if len(classes) < 2:
        raise InputError(
            "E_TARGET",
            f"target column {name!r} has one class ({classes[0]!r}); classification needs at "
            "least two: pick another --param target",
            data.uri,
        )
    return y.astype(np.int64), task, classes


# --------------------------------------------------------------------------------------------
# The step
# --------------------------------------------------------------------------------------------


def _numeric_stats(x: np.ndarray) -> dict[str, Any]:
    present = x[~np.isnan(x)]
    return {
        "count": int(present.size),
        "missing": int(x.size - present.size),
        "min": float(present.min()),
        "max": float(present.max()),
        "mean": float(present.mean()),
        "std": float(present.std()),
    }


def _categorical_stats(codes: np.ndarray, values: list[str], top: int = 10) -> dict[str, Any]:
    counts = np.bincount(codes[codes >= 0], minlength=len(values))
    order = np.lexsort((np.array(values, dtype=object).astype(str), -counts))[:top]
    return {
        "count": int(counts.sum()),
        "missing": int(np.count_nonzero(codes < 0)),
        "distinct": len(values),
        "top": [{"value": values[i], "count": int(counts[i])} for i in order if counts[i] > 0],
    }


def _target_stats(y: np.ndarray, classes: list[str] | None) -> dict[str, Any]:
    if classes is not None:
        counts = np.bincount(y, minlength=len(classes))
        return {"rows": int(y.size), "classes": dict(zip(classes, counts.tolist(), strict=True))}
    if y.size == 0:
        return {"rows": 0}
    y64 = y.astype(np.float64)
    return {
        "rows": int(y.size),
        "mean": float(y64.mean()),
        "std": float(y64.std()),
        "min": float(y64.min()),
        "max": float(y64.max()),
    }


def _write_parquet(uri: str, table: pa.Table, dictionary_columns: list[str]) -> None:
    # Dictionary pages only where they pay: 0/1 and class-id columns shrink to almost nothing,
    # while trying them on standardised floats (mostly distinct) about doubles the write time.
    with storage.open_output(uri) as f:
        pq.write_table(table, f, use_dictionary=dictionary_columns, **_PARQUET_OPTIONS)


def display_uri(uri: str) -> str:
    """``uri`` without credentials (``s3://key:secret@bucket`` -> ``s3://bucket``), for records."""
    return re.sub(r"^([a-zA-Z][\w+.-]*://)[^/@]*@", r"\1", uri)


def _share_for_one_row(largest: int, other: float) -> float | None:
    """The smallest two-decimal share that gives a split one row of a group of ``largest`` rows.

    None if that share leaves too little for training (with ``other``, the other held-out share).
    """
    for hundredths in range(1, 50):
        share = hundredths / 100
        if share + other >= 0.9:
            return None
        if int(np.floor(largest * share + 0.5)) >= MIN_SPLIT_ROWS:
            return share
    return None


def _check_splits(
    data: RawInput,
    cfg: PreprocessConfig,
    y: np.ndarray,
    classes: list[str] | None,
    train: np.ndarray,
    val: np.ndarray,
    test: np.ndarray,
) -> None:
    """Reject splits that train or evaluate would fail on, with advice on what to change.

    Raises:
        InputError: ``E_SPLIT``: an empty split, or a class absent from the training split.
    """
    n = len(y)
    fractions = {"val_fraction": cfg.val_fraction, "test_fraction": cfg.test_fraction}
    if train.size < MIN_SPLIT_ROWS:
        raise InputError(
            "E_SPLIT",
            f"the training split is empty: val_fraction {cfg.val_fraction} and test_fraction "
            f"{cfg.test_fraction} of {n} rows leave none; add rows, or lower them with "
            f"{param('preprocess_config_json', {'val_fraction': 0.1, 'test_fraction': 0.1})}",
            data.uri,
        )
    if classes is not None:
        in_train = np.bincount(y[train], minlength=len(classes))
        if (in_train == 0).any():
            k = int(np.argmin(in_train))
            total = int(np.count_nonzero(y == k))
            raise InputError(
                "E_SPLIT",
                f"class {classes[k]!r} of target {cfg.target!r} has {total} row(s), all drawn "
                "into the validation and test splits, so the model could not learn it; add rows "
                f"of that class or remove them, or lower the held-out shares with "
                f"{param('preprocess_config_json', {'val_fraction': 0.05, 'test_fraction': 0.05})}",
                data.uri,
            )
    largest = int(np.bincount(y).max()) if classes is not None else n
    group = (
        f"of each class's rows (the largest class has {largest})"
        if classes is not None
        else f"of {n} rows"
    )
    held_out = {"validation": ("val_fraction", val), "test": ("test_fraction", test)}
    empty = [split for split, (_, rows) in held_out.items() if rows.size < MIN_SPLIT_ROWS]
    if not empty:
        return
    keys = [held_out[split][0] for split in empty]
    what = " and ".join(f"{k} {fractions[k]}" for k in keys)
    # Suggest shares that give every empty split a row, if they leave enough for training.
    shares: dict[str, float] = {}
    for key in keys:
        other = sum(shares.get(k, v) for k, v in fractions.items() if k != key)
        share = _share_for_one_row(largest, other)
        if share is None:
            shares = {}
            break
        shares[key] = share
    fix = f", or raise {' and '.join(keys)} with {param('preprocess_config_json', shares)}"
    raise InputError(
        "E_SPLIT",
        f"the {' and '.join(empty)} split{'s are' if len(empty) > 1 else ' is'} empty: "
        f"{what} {group} round{'' if len(keys) > 1 else 's'} to 0 rows; "
        f"add rows{fix if shares else ''}",
        data.uri,
    )


def _check_scaled(
    data: RawInput, fit: NumericFit, scaled: np.ndarray, raw: np.ndarray, perm: np.ndarray
) -> None:
    """Reject a standardised column that overflows float32 (inf where the input was finite).

    Raises:
        InputError: ``E_OVERFLOW`` naming the column, the value and its row in the user's data.
    """
    bad = ~np.isfinite(scaled)
    if not bad.any():
        return
    row = int(perm[int(np.argmax(bad))])
    raise InputError(
        "E_OVERFLOW",
        f"column {fit.name!r}: {raw[row]:g} standardised with the training split's mean "
        f"{fit.mean:g} and std {fit.std:g} overflows float32; fix the value or rescale the "
        f"column (e.g. a log), or drop it with {role_param(fit.name, 'drop')}",
        data.locate(row),
    )


def config_from_parameters(
    *,
    target: str,
    task: str,
    seed: int,
    column_roles_json: str = "{}",
    csv_delimiter: str = "auto",
    csv_header: bool = True,
    csv_encoding: str = "utf-8",
    csv_null_values: str = "",
    config_json: str = "{}",
) -> PreprocessConfig:
    """The step's config from the pipeline's parameters (what the KFP component receives).

    ``config_json`` (the pipeline's ``preprocess_config_json``) holds further
    :class:`PreprocessConfig` fields, dotted or nested, applied last.

    Args:
        target: Target column.
        task: ``auto``, ``classification`` or ``regression``.
        seed: Split seed.
        column_roles_json: JSON object ``{"column": "numeric" | "categorical" | "drop"}``.
        csv_delimiter: One character, ``tab`` or ``auto``.
        csv_header: Whether CSV files start with a header line.
        csv_encoding: Text encoding of CSV files.
        csv_null_values: Extra CSV values read as missing, comma-separated (``?,-``).
        config_json: JSON object of further fields (``{"val_fraction": 0.2}``).

    Raises:
        InputError: ``E_PARAM`` for a parameter that is not the JSON it must be; ``E_CONFIG``
            for a bad value (naming the field).
    """
    base: dict[str, Any] = {
        "target": target,
        "task": task,
        "seed": seed,
        "column_roles": _json_object(column_roles_json, "column_roles_json"),
        "csv_delimiter": csv_delimiter,
        "csv_header": csv_header,
        "csv_encoding": csv_encoding,
        "csv_null_values": [v.strip() for v in csv_null_values.split(",") if v.strip()],
    }
    overrides = _json_object(config_json, "preprocess_config_json")
    return from_dict(PreprocessConfig, apply_overrides(base, overrides))


def _json_object(text: str, name: str) -> dict[str, Any]:
    try:
        value = json.loads(text or "{}")
    except json.JSONDecodeError as e:
        raise InputError("E_PARAM", f"{name} is not valid JSON ({e.msg}): {text!r}", name) from e
    if not isinstance(value, dict):
        raise InputError("E_PARAM", f"{name} must be a JSON object, got {text!r}", name)
    return value


def preprocess(cfg: PreprocessConfig, *, data_uri: str, output_uri: str) -> PreprocessResult:
    """Validate, split, impute, encode and standardise a tabular dataset.

    Reads a Parquet or CSV file (or a folder of them), types every column (declared or
    inferred), splits the rows (seeded; stratified for classification), fits imputation,
    category lists and standardisation on the training split only, and publishes
    ``train.parquet``, ``val.parquet``, ``test.parquet``, ``schema.json`` and ``stats.json``
    under ``output_uri`` atomically. The same input and seed give byte-identical outputs.

    Args:
        cfg: What to read and how.
        data_uri: A data file or a folder of data files (any storage URI).
        output_uri: Folder to publish the outputs to: absent, empty, or an earlier preprocess
            output (which is replaced); anything else is refused (``E_OUTPUT``).

    Returns:
        Split sizes, output feature names, task, class labels and the input's hash.

    Raises:
        InputError: Bad input (a missing, empty or malformed file, duplicate column names, a
            missing target, one class, an all-missing column, infinite values or values that
            overflow float32, mixed types, a declared role that disagrees with the data, a
            split too small to train, validate or test on); the message names the user's file
            or column and the bad value, and says which pipeline parameter fixes it where one
            does. Nothing is written.
    """
    # Before any work: never write into the data, the working directory or anyone's files.
    check_output_location(output_uri, "preprocess", inputs={"data": data_uri})
    data = read_input(data_uri, cfg.csv_options())
    n = data.table.num_rows
    if n == 0:
        raise InputError("E_EMPTY", "dataset is empty: 0 rows", data_uri)
    y, task, classes = _target(data, cfg)
    columns, dropped = _feature_columns(data, cfg)
    train_idx, val_idx, test_idx = split_indices(
        n,
        classes=y if classes is not None else None,
        val_fraction=cfg.val_fraction,
        test_fraction=cfg.test_fraction,
        seed=cfg.seed,
    )
    _check_splits(data, cfg, y, classes, train_idx, val_idx, test_idx)
    # Rows in split order: each split is then a contiguous slice of every output column.
    perm = np.concatenate([train_idx, val_idx, test_idx])
    n_train = train_idx.size
    bounds = {"train": (0, n_train), "val": (n_train, n_train + val_idx.size)}
    bounds["test"] = (bounds["val"][1], n)

    fits: list[NumericFit | CategoricalFit] = []
    outputs: list[np.ndarray] = []
    stats: dict[str, Any] = {}
    for col in columns:
        try:
            if col.numbers is not None:
                stats[col.name] = {"kind": "numeric", **_numeric_stats(col.numbers)}
                fit: NumericFit | CategoricalFit
                fit, arrays = encode_numeric(
                    col.name,
                    col.dtype,
                    col.numbers[perm],
                    n_train,
                    missing_indicator=cfg.missing_indicator,
                )
                _check_scaled(data, fit, arrays[0], col.numbers, perm)
            else:
                assert col.codes is not None and col.values is not None
                stats[col.name] = {
                    "kind": "categorical",
                    **_categorical_stats(col.codes, col.values),
                }
                fit, arrays = encode_categorical(
                    col.name,
                    col.dtype,
                    col.codes[perm],
                    col.values,
                    n_train,
                    max_categories=cfg.max_categories,
                )
        except NoTrainingValues:
            raise InputError(
                "E_ALL_MISSING",
                f"column {col.name!r} has no values in the training split "
                f"({n_train} rows, seed {cfg.seed}); fill it, drop it with "
                f"{role_param(col.name, 'drop')}, or split differently with "
                f"{param('seed', cfg.seed + 1)}",
                data_uri,
            ) from None
        col.numbers = col.codes = None  # encoded: free the raw values early
        fits.append(fit)
        outputs.extend(arrays)
    features = [name for fit in fits for name in fit.outputs]
    clash = sorted({f for f in features if features.count(f) > 1} | ({cfg.target} & set(features)))
    if clash:
        raise InputError(
            "E_SCHEMA",
            f"output feature name {clash[0]!r} is produced twice (a categorical column's "
            "'<column>=<value>' features collide with a column of that name, or with the "
            "target); rename a column in the data",
            data_uri,
        )
    y_perm = y[perm]
    target_type = pa.int64() if classes is not None else pa.float32()
    schema = pa.schema(
        [pa.field(f, pa.float32(), nullable=False) for f in features]
        + [pa.field(cfg.target, target_type, nullable=False)]
    )
    splits = {name: hi - lo for name, (lo, hi) in bounds.items()}
    schema_doc = {
        "format": SCHEMA_FORMAT,
        "target": cfg.target,
        "task": task,
        "features": features,
        "columns": [fit.to_dict() for fit in fits],
        "dropped": dropped,
        "classes": classes,
        "data_hash": data.data_hash,
        "source": display_uri(data_uri),
        "seed": cfg.seed,
        "splits": splits,
    }
    stats_doc = {
        "rows": n,
        "columns": stats,
        "target": {
            name: _target_stats(y_perm[lo:hi], classes) for name, (lo, hi) in bounds.items()
        },
    }
    numeric_outputs = {fit.name for fit in fits if isinstance(fit, NumericFit)}
    dictionary_columns = [f for f in features if f not in numeric_outputs]
    if classes is not None:
        dictionary_columns.append(cfg.target)
    with atomic_dir(output_uri, step="preprocess") as tmp, ThreadPoolExecutor(len(bounds)) as pool:
        writes = []
        for name, (lo, hi) in bounds.items():
            # Slices of contiguous columns: pyarrow wraps them without copying.
            arrays = [pa.array(a[lo:hi]) for a in outputs] + [pa.array(y_perm[lo:hi])]
            table = pa.table(arrays, schema=schema)
            uri = storage.join(tmp, f"{name}.parquet")
            # The Parquet writer releases the GIL: the three splits encode in parallel.
            writes.append(pool.submit(_write_parquet, uri, table, dictionary_columns))
        for write in writes:
            write.result()
        storage.write_json(storage.join(tmp, "schema.json"), schema_doc)
        storage.write_json(storage.join(tmp, "stats.json"), stats_doc)
    return PreprocessResult(
        train_rows=splits["train"],
        val_rows=splits["val"],
        test_rows=splits["test"],
        features=features,
        task=task,
        classes=classes,
        data_hash=data.data_hash,
    )
