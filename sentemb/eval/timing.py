"""Wall time of an evaluation's stages, so the cost of each (the intervals' against the rest) is measured in the run
it belongs to and written beside its results (`timing_s`)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager


class Stopwatch:
    """`with clock("stage"): ...` adds the block's wall time to `clock.seconds["stage"]`."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    @contextmanager
    def __call__(self, stage: str) -> Iterator[None]:
        started = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[stage] = self.seconds.get(stage, 0.0) + time.perf_counter() - started
