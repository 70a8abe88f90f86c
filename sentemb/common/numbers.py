"""The one check of every number a config or a file gives sentemb: its type (a number, a whole number, never a bool)
and its bounds, refused as a SentembConfigError naming the key and the fix. Torch-free, so the pre-run checks of the
data, trainer and eval settings use it before anything heavy is imported (sentemb.losses.base re-exports it)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from sentemb.common.errors import SentembConfigError


@dataclass(frozen=True)
class Bounds:
    """The values a number may take: from `low` to `high` (None: unbounded), each end open or closed."""

    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False

    def __contains__(self, value: float) -> bool:
        above = self.low is None or (value > self.low if self.low_open else value >= self.low)
        below = self.high is None or (value < self.high if self.high_open else value <= self.high)
        return above and below

    def __str__(self) -> str:
        """`> 0`, `>= 1`, `<= 64`, `in (0, 1)`, `in [0, 1)`; '' when unbounded."""
        low, high = (shown(end) for end in (self.low, self.high))
        if self.low is not None and self.high is not None:
            return f"in {'(' if self.low_open else '['}{low}, {high}{')' if self.high_open else ']'}"
        if self.low is not None:
            return f"{'>' if self.low_open else '>='} {low}"
        return f"{'<' if self.high_open else '<='} {high}" if self.high is not None else ""


def shown(end: float | None) -> str:
    """A bound as written in a message: whole numbers without a decimal point (4194304, not 4.19e+06)."""
    if end is None:
        return ""
    return str(int(end)) if float(end).is_integer() else f"{end:g}"


ANY = Bounds()
POSITIVE = Bounds(0.0, low_open=True)
NON_NEGATIVE = Bounds(0.0)
OPEN_UNIT = Bounds(0.0, 1.0, low_open=True, high_open=True)


def shown_value(value: object, limit: int = 80) -> str:
    """A setting's value as a message shows it: an integer past 30 digits by its size (str() of one past 4,300
    digits raises ValueError), a long text clipped."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 100:
        return f"<a whole number of about {int(value.bit_length() * math.log10(2)) + 1} digits>"
    text = str(value)
    return text if len(text) <= limit else f"{text[: limit - 3]}..."


def require_number(key: str, value: object, bounds: Bounds = ANY, fix: str = "") -> float:
    """`value` as a float when it is a finite number (never a bool) within `bounds`, else a SentembConfigError naming
    the config key `key` (e.g. `head.weight`) and `fix`. The one check of every float hyper-parameter of the parts:
    inf and nan pass a bare `>= 0` test (inf) or make every comparison false, and are refused here by name."""
    number = isinstance(value, int | float) and not isinstance(value, bool)
    if number and is_finite(value) and value in bounds:
        return float(value)
    wanted = f"a number {bounds}" if str(bounds) else "a finite number"
    not_finite = ", not inf or nan" if isinstance(value, float) and not math.isfinite(value) and str(bounds) else ""
    raise SentembConfigError(f"{key}={shown_value(value)} must be {wanted}{not_finite}.{f' Fix: {fix}' if fix else ''}")


def is_finite(value: float) -> bool:
    """A finite number a float can hold: an integer past float's range (10**400) is not, and is refused as such."""
    try:
        return math.isfinite(value)
    except OverflowError:
        return False


def is_whole(value: object) -> bool:
    """A whole number (an int, never a bool)."""
    return isinstance(value, int) and not isinstance(value, bool)


def require_whole(key: str, value: object, bounds: Bounds, fix: str = "") -> int:
    """`value` when it is a whole number (never a bool) within `bounds`, else a SentembConfigError naming `key`: sizes
    a part allocates by (channels, rows), bounded above so that a typo cannot allocate until the machine dies."""
    if is_whole(value) and value in bounds:
        return value
    raise SentembConfigError(
        f"{key}={shown_value(value)} must be a whole number {bounds}.{f' Fix: {fix}' if fix else ''}"
    )


def require_flag(key: str, value: object, fix: str = "") -> bool:
    """`value` when it is true or false, else a SentembConfigError naming `key`: a word such as `abc` would otherwise
    count as true wherever a setting is read with bool()."""
    if isinstance(value, bool):
        return value
    raise SentembConfigError(f"{key}={shown_value(value)} must be true or false.{f' Fix: {fix}' if fix else ''}")
