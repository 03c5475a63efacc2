"""Feature columns for preprocess: each typed (numeric, categorical, or a date as numbers) as
declared or inferred, identifiers and constant columns left out, leakage named.

The value checks behind the decisions are :mod:`trainer.steps.preprocess.column_checks`; the
typing of one column's values and the target are :mod:`trainer.steps.preprocess.columns`.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa

from trainer.base.errors import InputError
from trainer.steps.preprocess.column_checks import (
    Decision,
    constant_reason,
    date_features,
    identifier_reason,
    leakage_reason,
)
from trainer.steps.preprocess.columns import (
    _check_range,
    _Column,
    _comma_numbers_notice,
    _numbers,
    _shown,
    _text_as_numbers,
)
from trainer.steps.preprocess.config import PreprocessConfig
from trainer.steps.preprocess.tabular import (
    RawInput,
    dictionary_codes,
    dtype_name,
    is_number,
    is_text,
    role_param,
)
from trainer.steps.preprocess.text_values import Notice, is_temporal, looks_like_dates


def _date_columns(data: RawInput, name: str, col: pa.ChunkedArray, dtype: str) -> list[_Column]:
    """A date column as numbers (``<name>__year`` ...); E_SCHEMA if its values are no dates."""
    parts = date_features(col)
    if parts is None:
        raise InputError(
            "E_SCHEMA",
            f"column {name!r} is declared a date but its values do not read as dates (e.g. "
            f"{_first_value(col)!r}); write them as 2024-01-31, or declare it "
            f"{role_param(name, 'categorical')}",
            data.uri,
        )
    return [_Column(f"{name}__{part}", "numeric", dtype, numbers=x) for part, x in parts.items()]


def _first_value(col: pa.ChunkedArray) -> Any:
    present = col.drop_null()
    return present[0].as_py() if len(present) else None


def _checked(name: str, col: pa.ChunkedArray, typed: _Column, decisions: list[Decision]) -> bool:
    """Whether an inferred column stays a feature: identifiers and constants are left out."""
    rows = len(col)
    if typed.numbers is not None:
        x = typed.numbers
        present = x[~np.isnan(x)]
        distinct, missing = np.unique(present).size, int(x.size - present.size)
        integers = present if pa.types.is_integer(col.type) else None
        ident = None
        if integers is not None:
            ident = identifier_reason(
                name, distinct=distinct, rows=rows, missing=missing, integers=integers
            )
    else:
        assert typed.codes is not None and typed.values is not None
        missing = int(np.count_nonzero(typed.codes < 0))
        distinct = len(typed.values)
        ident = identifier_reason(
            name, distinct=distinct, rows=rows, missing=missing, integers=None
        )
    for reason, detail in (("identifier", ident), ("constant", constant_reason(distinct, missing))):
        if detail is not None:
            decisions.append(Decision(name, "dropped", reason, detail))
            return False
    return True


def feature_columns(
    data: RawInput, cfg: PreprocessConfig, notes: list[Notice] | None = None
) -> tuple[list[_Column], list[str], list[Decision]]:
    """Type and validate every feature column; returns (columns, dropped names, decisions).

    An inferred column that is an identifier or constant is left out (a ``dropped`` decision
    and a warning); a date column (typed, or text that reads as dates, or declared ``date``)
    becomes numbers. ``notes`` receives the warnings a person should read.
    """
    notes = notes if notes is not None else []
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
    decisions = [Decision(n, "dropped", "declared", "column_roles_json") for n in dropped]
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
        inferred = declared in (None, "keep")
        dated = declared == "date" or (
            inferred and (pa.types.is_date(col.type) or pa.types.is_timestamp(col.type))
        )
        if not dated and inferred and is_text(col.type):
            dated = looks_like_dates(dictionary_codes(col)[1]) is not None
        if dated:
            parts = _date_columns(data, name, col, dtype)
            out.extend(parts)
            decisions.append(
                Decision(name, "date", "date", "features " + ", ".join(c.name for c in parts))
            )
            continue
        typed = _typed_column(data, cfg, name, col, declared, dtype, notes)
        if declared is None and not _checked(name, col, typed, decisions):
            continue
        out.append(typed)
    for d in decisions:
        if d.action == "dropped" and d.reason != "declared":
            notes.append(Notice(f"W_{d.reason.upper()}", _drop_message(d), data.uri))
    if not out:
        left = [d.column for d in decisions if d.action == "dropped"]
        auto_left = [d.column for d in decisions if d.reason in _INFERRED]
        if auto_left:
            why = (
                f"every other column is left out ({_shown(left)}); declare one numeric, "
                f"categorical or keep, e.g. {role_param(auto_left[0], 'keep')}"
            )
        elif dropped:
            why = (
                f"column_roles_json drops every other column ({_shown(dropped)}); declare one "
                f"numeric or categorical, e.g. {role_param(dropped[0], 'numeric')}"
            )
        else:
            why = "the data holds only the target; add feature columns"
        raise InputError(
            "E_SCHEMA", f"no feature columns besides target {cfg.target!r}: {why}", data.uri
        )
    return out, dropped + [d.column for d in decisions if d.reason in _INFERRED], decisions


_INFERRED = ("identifier", "constant")


def _drop_message(d: Decision) -> str:
    what = "an identifier" if d.reason == "identifier" else "constant"
    return (
        f"column {d.column!r} is {what} ({d.detail}): left out of the features; to use it "
        f"anyway set {role_param(d.column, 'keep')}"
    )


def _typed_column(
    data: RawInput,
    cfg: PreprocessConfig,
    name: str,
    col: pa.ChunkedArray,
    declared: str | None,
    dtype: str,
    notes: list[Notice],
) -> _Column:
    """One non-date feature column, typed as declared or inferred."""
    if is_number(col.type):
        if declared == "categorical":
            codes, values = dictionary_codes(col.cast(pa.string()))
            return _Column(name, "categorical", dtype, codes=codes, values=values)
        x = _numbers(data, name, col, target=False)
    elif is_text(col.type):
        codes, values = dictionary_codes(col)
        if declared == "categorical":
            return _Column(name, "categorical", dtype, codes=codes, values=values)
        if declared in (None, "keep") and _comma_numbers_notice(data, cfg, name, values, notes):
            return _Column(name, "categorical", dtype, codes=codes, values=values)
        maybe = _text_as_numbers(data, name, codes, values, declared=declared == "numeric")
        if maybe is None:
            return _Column(name, "categorical", dtype, codes=codes, values=values)
        x = maybe
        _check_range(data, name, x, target=False)
    elif is_temporal(col.type) and declared == "categorical":
        codes, values = dictionary_codes(col.cast(pa.string()))
        return _Column(name, "categorical", dtype, codes=codes, values=values)
    else:
        raise InputError(
            "E_SCHEMA",
            f"column {name!r} has unsupported type {dtype} (numbers, text and dates are "
            f"supported); drop it with {role_param(name, 'drop')}",
            data.uri,
        )
    if np.isnan(x).all():
        raise InputError(
            "E_ALL_MISSING",
            f"column {name!r} has no values (all {len(x)} missing or NaN); fill it, or drop "
            f"it with {role_param(name, 'drop')}",
            data.uri,
        )
    return _Column(name, "numeric", dtype, numbers=x)


def leakage_warnings(
    data: RawInput,
    columns: list[_Column],
    y: np.ndarray,
    classes: list[str] | None,
    target: str,
    notes: list[Notice],
) -> list[Decision]:
    """Warn about each column that predicts the target perfectly on its own (kept)."""
    found = []
    for c in columns:
        detail = leakage_reason(
            numbers=c.numbers, codes=c.codes, y=y, classification=classes is not None
        )
        if detail is None:
            continue
        found.append(Decision(c.name, "warning", "leakage", detail))
        notes.append(
            Notice(
                "W_LEAKAGE",
                f"column {c.name!r} predicts target {target!r} perfectly on its own ({detail}): "
                "if it is known only after the outcome it is leakage and the model will not "
                f"work on new data; drop it with {role_param(c.name, 'drop')}",
                data.uri,
            )
        )
    return found
