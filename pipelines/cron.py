"""Six-field cron expressions as KFP's ScheduledWorkflow controller reads them: checked, evaluated.

KFP hands a recurring run's ``cron`` to robfig/cron with a seconds field: ``second minute hour
day-of-month month day-of-week``. Each field is ``*``, ``?`` (day fields only), a value, a range
``a-b``, any of those with a step ``/n``, or a comma list of them; months and weekdays also take
names (``JAN``, ``MON``). As in robfig/cron, when both day fields are restricted a day matches
either of them, otherwise both must match. Times are UTC, the controller's default time zone.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from trainer.base.errors import InputError

FIELDS = ("seconds", "minutes", "hours", "day-of-month", "month", "day-of-week")
_RANGES = ((0, 59), (0, 59), (0, 23), (1, 31), (1, 12), (0, 6))
_MONTHS = ("JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC")
_DAYS = ("SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT")
_NAMES = {4: {n: i + 1 for i, n in enumerate(_MONTHS)}, 5: {n: i for i, n in enumerate(_DAYS)}}
_HORIZON_DAYS = 366 * 5
"""How far :func:`next_fire` looks before deciding that an expression never fires."""


@dataclass(frozen=True, slots=True)
class Cron:
    """A parsed expression: the allowed values of each field, and which day fields were ``*``."""

    expr: str
    seconds: frozenset[int]
    minutes: frozenset[int]
    hours: frozenset[int]
    days: frozenset[int]
    months: frozenset[int]
    weekdays: frozenset[int]
    days_star: bool
    weekdays_star: bool

    def day_matches(self, t: datetime) -> bool:
        """Whether the date of ``t`` is a day the expression fires on (robfig's rule)."""
        dom = t.day in self.days
        dow = (t.isoweekday() % 7) in self.weekdays
        if self.days_star or self.weekdays_star:
            return dom and dow
        return dom or dow


def _bad(index: int, part: str, why: str, expr: str) -> InputError:
    return InputError(
        "E_CRON",
        f"cron field {index + 1} ({FIELDS[index]}) {part!r}: {why}; "
        "expected six fields 'second minute hour day-of-month month day-of-week', "
        f"e.g. '0 0 2 * * *', got {expr!r}",
        "--cron",
    )


def _value(index: int, text: str, expr: str) -> int:
    names = _NAMES.get(index, {})
    if text.upper() in names:
        return names[text.upper()]
    if not text.isdigit():
        raise _bad(index, text, "not a number" + (" or name" if names else ""), expr)
    lo, hi = _RANGES[index]
    value = int(text)
    if not lo <= value <= hi:
        raise _bad(index, text, f"out of range {lo}-{hi}", expr)
    return value


def _field(index: int, text: str, expr: str) -> tuple[frozenset[int], bool]:
    lo, hi = _RANGES[index]
    values: set[int] = set()
    star = False
    for part in text.split(","):
        base, slash, step_text = part.partition("/")
        step = 1
        if slash:
            if not step_text.isdigit() or int(step_text) == 0:
                raise _bad(index, part, "step must be a positive number", expr)
            step = int(step_text)
        if base in ("*", "?"):
            if base == "?" and index not in (3, 5):
                raise _bad(index, part, "'?' is allowed only in the day fields", expr)
            start, end = lo, hi
            star = star or step == 1
        elif "-" in base:
            a, _, b = base.partition("-")
            start, end = _value(index, a, expr), _value(index, b, expr)
            if start > end:
                raise _bad(index, part, f"range start {start} is after its end {end}", expr)
        elif base:
            start = _value(index, base, expr)
            end = hi if slash else start
        else:
            raise _bad(index, part, "empty value", expr)
        values.update(range(start, end + 1, step))
    return frozenset(values), star


def parse(expr: str) -> Cron:
    """Parse and check a six-field expression.

    Raises:
        InputError: ``E_CRON`` naming the first bad field, its text and the allowed range.
    """
    parts = expr.split()
    if len(parts) != 6:
        raise InputError(
            "E_CRON",
            f"cron expression must have six fields 'second minute hour day-of-month month "
            f"day-of-week' (e.g. '0 0 2 * * *' for 02:00 UTC daily), got {len(parts)}: {expr!r}",
            "--cron",
        )
    fields = [_field(i, p, expr) for i, p in enumerate(parts)]
    return Cron(
        expr=expr,
        seconds=fields[0][0],
        minutes=fields[1][0],
        hours=fields[2][0],
        days=fields[3][0],
        months=fields[4][0],
        weekdays=fields[5][0],
        days_star=fields[3][1],
        weekdays_star=fields[5][1],
    )


def next_fire(cron: Cron, after: datetime) -> datetime | None:
    """The first time strictly after ``after`` (timezone-aware or naive UTC) that ``cron`` fires.

    Returns:
        That time, with the same ``tzinfo`` as ``after``; ``None`` when it never fires within
        five years (e.g. ``0 0 0 31 2 *``).
    """
    t = after.replace(microsecond=0) + timedelta(seconds=1)
    limit = after + timedelta(days=_HORIZON_DAYS)
    while t <= limit:
        if t.month not in cron.months:
            year, month = (t.year + 1, 1) if t.month == 12 else (t.year, t.month + 1)
            t = t.replace(year=year, month=month, day=1, hour=0, minute=0, second=0)
        elif not cron.day_matches(t):
            t = (t + timedelta(days=1)).replace(hour=0, minute=0, second=0)
        elif t.hour not in cron.hours:
            t = (t + timedelta(hours=1)).replace(minute=0, second=0)
        elif t.minute not in cron.minutes:
            t = (t + timedelta(minutes=1)).replace(second=0)
        elif t.second not in cron.seconds:
            t += timedelta(seconds=1)
        else:
            return t
    return None
