"""What preprocess decides about feature columns by looking at their values.

Identifiers (unique per row) and constant columns carry nothing a model can generalise from:
they are left out with a warning that names them. A column that predicts the target perfectly
on its own is most often leakage (a value recorded after the outcome): it is named in a warning
and kept, since only the user knows. Dates become numbers (:func:`date_features`). Each
decision is a :class:`Decision`, recorded in ``schema.json`` and shown in the report; a declared
role (``column_roles_json``: ``keep``, ``numeric``, ``categorical``, ``date``, ``drop``)
overrules the identifier and constant decisions.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa

MIN_CHECK_ROWS = 20
"""Fewer rows than this: no column is called an identifier or leakage (too little to tell)."""

# Names that say "this is a key": id, customer_id, CustomerID, user-key, uuid, row_number.
_ID_NAME = re.compile(r"(^|[^a-z])(id|key|uuid|guid)$|^(id|uuid|guid)([^a-z]|$)|[a-z]Id$|ID$")

DATE_PARTS = ("year", "month", "day", "weekday", "elapsed_days")
"""Features of a date column, named ``<column>__<part>``; ``hour`` is added for date-times.
``elapsed_days`` counts days since 1970-01-01 (trends over time); the others are seasons."""

# Text date formats tried in order; the first that reads every value is taken.
_DATE_FORMATS = ("ISO8601", "%d.%m.%Y", "%m/%d/%Y", "%d/%m/%Y", "%m/%d/%y", "%d.%m.%y")


@dataclass(frozen=True, slots=True)
class Decision:
    """One decision about a column, for ``schema.json`` and the report's data section."""

    column: str
    action: str
    """``dropped`` (left out of the features), ``date`` (turned into numbers) or ``warning``
    (kept; a person should look)."""
    reason: str
    """``identifier``, ``constant``, ``leakage``, ``date`` or ``declared``."""
    detail: str
    """The evidence, in words."""

    def to_dict(self) -> dict[str, Any]:
        """Plain-JSON form."""
        return asdict(self)


def looks_like_id_name(name: str) -> bool:
    """Whether a column's name says it is a key (``id``, ``customer_id``, ``CustomerID``)."""
    return bool(_ID_NAME.search(name)) or bool(_ID_NAME.search(name.lower()))


def identifier_reason(
    name: str, *, distinct: int, rows: int, missing: int, integers: np.ndarray | None
) -> str | None:
    """Why a column is an identifier (unique per row), or None.

    Text: every row has its own value. Integers: every row has its own value, and either the
    name says so (``customer_id``) or the values are nearly consecutive (row numbers, serial
    keys): a measurement that happens to be unique (an income in cents) is not a key.

    Args:
        name: The column.
        distinct: Distinct present values.
        rows: Rows in the table.
        missing: Missing values.
        integers: For an integer column its values; None for text.
    """
    if rows < MIN_CHECK_ROWS or missing or distinct != rows:
        return None
    if integers is None:
        return f"text with a different value in each of its {rows} rows"
    span = float(integers.max()) - float(integers.min()) + 1
    if looks_like_id_name(name) or span <= 2 * rows:
        return f"whole numbers with a different value in each of its {rows} rows"
    return None


def constant_reason(distinct: int, missing: int) -> str | None:
    """Why a column is constant (one value in every row), or None.

    A column with one value and some missing rows is kept: whether it is missing may matter.
    """
    return "one value in every row" if distinct == 1 and not missing else None


def _blocks_separate(x: np.ndarray, y: np.ndarray) -> bool:
    """Whether thresholds on ``x`` alone give every row its class (each class one x-range)."""
    order = np.argsort(x, kind="stable")
    xs, ys = x[order], y[order]
    change = ys[1:] != ys[:-1]
    if np.any(change & (xs[1:] == xs[:-1])):
        return False  # one value of x with two classes
    return int(change.sum()) + 1 == np.unique(ys).size


def _pure_groups(codes: np.ndarray, y: np.ndarray) -> bool:
    """Whether every value of ``codes`` has one target value (and values repeat)."""
    groups = np.unique(codes).size
    if groups > codes.size // 2:
        return False  # mostly unique values: purity says nothing
    pairs = np.unique(np.stack([codes.astype(np.float64), y.astype(np.float64)], axis=1), axis=0)
    return len(pairs) == groups


def leakage_reason(
    *,
    numbers: np.ndarray | None,
    codes: np.ndarray | None,
    y: np.ndarray,
    classification: bool,
) -> str | None:
    """Why a column predicts the target perfectly on its own, or None.

    Numeric: identical to the target, an exact linear function of it (regression), or one
    threshold per class that separates every row (classification). Categorical: each value
    has a single target value (classes or numbers) while values repeat across rows.

    Args:
        numbers: A numeric column's float64 values (NaN: missing), or None.
        codes: A categorical column's codes (-1: missing, a value of its own), or None.
        y: The target (class ids or values), every row.
        classification: The task.
    """
    if numbers is not None:
        present = ~np.isnan(numbers)
        x, t = numbers[present], y[present].astype(np.float64)
        if x.size < MIN_CHECK_ROWS or np.unique(x).size < 2:
            return None
        # The target is float32 (regression) or class ids: compare at its precision.
        if x.size == y.size and np.array_equal(x.astype(np.float32), y.astype(np.float32)):
            return "identical to the target"
        if classification:
            if _blocks_separate(x, t):
                return "thresholds on it alone separate every class"
            return None
        if np.std(t) > 0:
            with np.errstate(invalid="ignore", divide="ignore"):
                r = float(np.corrcoef(x, t)[0, 1])
            if abs(r) >= 1 - 1e-9:
                return "an exact linear function of the target"
        return None
    assert codes is not None
    if codes.size < MIN_CHECK_ROWS or np.unique(codes).size < 2:
        return None
    if _pure_groups(codes, y):
        what = "one class" if classification else "one target value"
        return f"each of its values has {what}"
    return None


def date_features(values: pa.ChunkedArray | pa.Array) -> dict[str, np.ndarray] | None:
    """Numeric features of a date column (typed or text), or None if it does not read as dates.

    Returns:
        ``{part: float64 values}`` for :data:`DATE_PARTS` (and ``hour`` when any value has a
        time of day); NaN where the value is missing.
    """
    times = _as_datetimes(values)
    if times is None:
        return None
    out = {
        "year": times.year.to_numpy(dtype=np.float64, na_value=np.nan),
        "month": times.month.to_numpy(dtype=np.float64, na_value=np.nan),
        "day": times.day.to_numpy(dtype=np.float64, na_value=np.nan),
        "weekday": times.day_of_week.to_numpy(dtype=np.float64, na_value=np.nan),
    }
    epoch = pd.Timestamp("1970-01-01", tz=times.tz)
    out["elapsed_days"] = ((times - epoch) / pd.Timedelta(days=1)).to_numpy(
        dtype=np.float64, na_value=np.nan
    )
    seconds = (times - times.normalize()) / pd.Timedelta(hours=1)
    hours = seconds.to_numpy(dtype=np.float64, na_value=np.nan)
    if np.nanmax(hours, initial=0.0) > 0:
        out["hour"] = hours
    return out


def _as_datetimes(values: pa.ChunkedArray | pa.Array) -> pd.DatetimeIndex | None:
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks() if values.num_chunks != 1 else values.chunk(0)
    t = values.type
    if pa.types.is_dictionary(t):  # how preprocess reads text columns
        values = values.dictionary_decode()
        t = values.type
    if pa.types.is_date(t) or pa.types.is_timestamp(t):
        if pa.types.is_date(t):
            values = values.cast(pa.timestamp("s"))
        return pd.DatetimeIndex(values.to_pandas())
    if not (pa.types.is_string(t) or pa.types.is_large_string(t)):
        return None
    text = pd.Series(values.to_pandas(), dtype=object)
    present = text.notna()
    if not present.any():
        return None
    distinct = pd.Series(text[present].str.strip().unique())
    for fmt in _DATE_FORMATS:
        parsed = pd.to_datetime(distinct, format=fmt, errors="coerce")
        if parsed.notna().all():
            lookup = dict(zip(distinct, parsed, strict=True))
            mapped = text.str.strip().map(lookup)
            index = pd.DatetimeIndex(mapped)
            return index.tz_convert(None) if index.tz is not None else index
    return None
