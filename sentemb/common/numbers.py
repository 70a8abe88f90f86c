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


def require_number(key: str, value: object, bounds: Bounds = ANY, fix: str = "") -> float:
    """`value` as a float when it is a finite number (never a bool) within `bounds`, else a SentembConfigError naming
    the config key `key` (e.g. `head.weight`) and `fix`. The one check of every float hyper-parameter of the parts:
    inf and nan pass a bare `>= 0` test (inf) or make every comparison false, and are refused here by name."""
    number = isinstance(value, int | float) and not isinstance(value, bool)
    if number and math.isfinite(value) and value in bounds:
        return float(value)
    wanted = f"a number {bounds}" if str(bounds) else "a finite number"
    not_finite = ", not inf or nan" if number and not math.isfinite(value) and str(bounds) else ""
    raise SentembConfigError(f"{key}={value} must be {wanted}{not_finite}.{f' Fix: {fix}' if fix else ''}")


def require_whole(key: str, value: object, bounds: Bounds, fix: str = "") -> int:
    """`value` when it is a whole number (never a bool) within `bounds`, else a SentembConfigError naming `key`: sizes
    a part allocates by (channels, rows), bounded above so that a typo cannot allocate until the machine dies."""
    if isinstance(value, int) and not isinstance(value, bool) and value in bounds:
        return value
    raise SentembConfigError(f"{key}={value} must be a whole number {bounds}.{f' Fix: {fix}' if fix else ''}")
