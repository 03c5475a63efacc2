"""What a text column really holds: numbers under some decimal separator, dates, or words.

Preprocess reads CSV numbers with one decimal separator (``csv_decimal``); a column written with
the other one (``26,9`` read with ``.``) arrives as text and would silently become a category
with one value per number. These checks name such columns, and :class:`Notice` carries the
warning (or the decision) to the person, as one line like an error line.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

# RE2 syntax. A number with a decimal point, or with a decimal comma (an integer matches both).
DOT_NUMBER_RE = r"^\s*[-+]?(\d+(\.\d*)?|\.\d+)([eE][-+]?\d+)?\s*$"
COMMA_NUMBER_RE = r"^\s*[-+]?(\d+(,\d*)?|,\d+)([eE][-+]?\d+)?\s*$"
# Dates and date-times as people write them: 2024-01-31, 2024/01/31, 31.01.2024, 1/31/24,
# optionally followed by a time (and a zone).
DATE_RE = (
    r"^\s*(\d{4}[-/.]\d{1,2}[-/.]\d{1,2}|\d{1,2}[-/.]\d{1,2}[-/.](\d{4}|\d{2}))"
    r"([ T]\d{1,2}:\d{2}(:\d{2}(\.\d+)?)?\s*(Z|[+-]\d{2}:?\d{2}|[AaPp][Mm])?)?\s*$"
)


@dataclass(frozen=True, slots=True)
class Notice:
    """A warning or a decision a person should read: ``WARNING [step] W_CODE: what (where)``."""

    code: str
    message: str
    where: str

    def line(self, step: str) -> str:
        """The one line printed on stderr."""
        kind = "NOTE" if self.code.startswith("I_") else "WARNING"
        return f"{kind} [{step}] {self.code}: {self.message} ({self.where})"


def _matches(values: list[str], pattern: str) -> np.ndarray:
    return pc.match_substring_regex(pa.array(values, pa.string()), pattern).to_numpy(
        zero_copy_only=False
    )


@dataclass(frozen=True, slots=True)
class NumberText:
    """A text column whose every value is a number written with ``separator``."""

    separator: str
    """``.`` or ``,``."""
    example: str
    """A value that shows the separator (one with a decimal part where there is one)."""
    numbers: np.ndarray
    """float64 per distinct value (the order of the values given)."""


def numbers_in_text(values: list[str]) -> NumberText | None:
    """The numbers a text column's distinct ``values`` hold, if every one is a number.

    Decimal commas are chosen only when some value has one and every value reads that way;
    integers alone read as numbers with either separator (``.`` is reported).
    """
    if not values:
        return None
    dot = _matches(values, DOT_NUMBER_RE)
    comma = _matches(values, COMMA_NUMBER_RE)
    for sep, ok in ((".", dot), (",", comma)):
        if not ok.all():
            continue
        marked = [v for v in values if sep in v]
        if sep == "," and not marked:
            continue
        text = pa.array(values, pa.string())
        if sep == ",":
            text = pc.replace_substring(text, ",", ".")
        numbers = pc.cast(pc.utf8_trim_whitespace(text), pa.float64()).to_numpy(
            zero_copy_only=False
        )
        return NumberText(sep, (marked or values)[0].strip(), numbers)
    return None


def looks_like_dates(values: list[str]) -> str | None:
    """An example value if every one of a text column's distinct ``values`` is a date."""
    if not values:
        return None
    ok = _matches(values, DATE_RE)
    return values[0].strip() if ok.all() else None


def is_temporal(t: pa.DataType) -> bool:
    """A date, time or timestamp column type (Parquet's own dates)."""
    return pa.types.is_temporal(t)
