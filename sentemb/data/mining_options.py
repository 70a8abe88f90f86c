"""`mine.*` (conf/mine.yaml): the options of hard-negative mining, each checked before any model loads (torch-free).

The names and meanings are sentence-transformers' `mine_hard_negatives` (sentence_transformers/util/
hard_negatives.py, v6.2): num_negatives, range_min, range_max (null: derived as it derives it), absolute_margin,
relative_margin, max_score, sampling_strategy (`sampling`), output_format (`output`: triplet | n-tuple), use_faiss
(`faiss`), batch_size (encoding) and faiss_batch_size (`chunk_size`: here the rows and columns of each block of the
exact search too).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from sentemb.common.errors import SentembConfigError
from sentemb.common.numbers import Bounds, require_flag, require_number, require_whole

SAMPLINGS = ("top", "random")
OUTPUTS = ("triplet", "n-tuple")
MAX_RANGE = 100_000  # candidates kept per anchor: a typo (range_max=1e9) would allocate queries x range_max scores
MAX_CHUNK = 1 << 16  # rows of a block of the exact search: chunk_size^2 float32 scores at once (16 GiB at the bound)
MAX_BATCH = 1 << 16


@dataclass(frozen=True)
class MineOptions:
    """The checked `mine` node (see the module docstring; every field as sentence-transformers names it)."""

    num_negatives: int = 3
    range_min: int = 0
    range_max: int | None = None
    absolute_margin: float | None = None
    relative_margin: float | None = None
    max_score: float | None = None
    sampling: str = "top"
    output: str = "triplet"
    faiss: bool = False
    batch_size: int = 32
    chunk_size: int = 4096
    max_length: int | None = None
    seed: int = 42

    @classmethod
    def checked(cls, node: Mapping[str, Any], seed: Any = 42) -> MineOptions:
        """The `mine` node as options, every one refused with its key and the fix when it cannot be used."""
        known = set(cls.__dataclass_fields__) - {"seed"}
        unknown = sorted(set(node) - known)
        if unknown:
            listed = ", ".join(f"mine.{k}" for k in sorted(known))
            raise SentembConfigError(f"mine.{unknown[0]} is not an option of mining. Fix: one of {listed}")
        defaults = cls()

        def whole(name: str, bounds: Bounds, optional: bool = False) -> int | None:
            value, fix = node.get(name, getattr(defaults, name)), f"mine.{name}={getattr(defaults, name)}"
            if optional and value is None:
                return None
            return require_whole(f"mine.{name}", value, bounds, fix.replace("None", "null"))

        options = cls(
            num_negatives=whole("num_negatives", Bounds(1, MAX_RANGE)),
            range_min=whole("range_min", Bounds(0, MAX_RANGE)),
            range_max=whole("range_max", Bounds(1, MAX_RANGE), optional=True),
            absolute_margin=optional_number("mine.absolute_margin", node.get("absolute_margin"), Bounds(0.0, 2.0)),
            relative_margin=optional_number("mine.relative_margin", node.get("relative_margin"), Bounds(0.0, 1.0)),
            max_score=optional_number("mine.max_score", node.get("max_score"), Bounds(-1.0, 1.0)),
            sampling=choice("mine.sampling", node.get("sampling", "top"), SAMPLINGS),
            output=choice("mine.output", node.get("output", "triplet"), OUTPUTS),
            faiss=require_flag("mine.faiss", node.get("faiss", False), "mine.faiss=false (exact search in chunks)"),
            batch_size=whole("batch_size", Bounds(1, MAX_BATCH)),
            chunk_size=whole("chunk_size", Bounds(1, MAX_CHUNK)),
            max_length=whole("max_length", Bounds(1, 1 << 20), optional=True),
            seed=require_whole("seed", seed, Bounds(0, 2**63 - 1), "seed=42"),
        )
        options.check_window()
        if options.absolute_margin is not None and options.relative_margin is not None:
            raise SentembConfigError(
                f"mine.absolute_margin={options.absolute_margin} and mine.relative_margin={options.relative_margin} "
                "are both set: a candidate would have to pass two thresholds, one of which hides the other. Fix: keep "
                "one (NV-Retriever's TopK-PercPos: mine.relative_margin=0.05 mine.absolute_margin=null)"
            )
        return options

    def check_window(self) -> None:
        """range_min < range_max, and room for num_negatives between them (sentence-transformers' own checks)."""
        if self.range_max is None:
            return
        if self.range_min >= self.range_max:
            raise SentembConfigError(
                f"mine.range_min={self.range_min} >= mine.range_max={self.range_max}: no candidate rank lies between "
                f"them. Fix: mine.range_max={self.range_min + 10 * self.num_negatives} (or a lower mine.range_min)"
            )
        if self.num_negatives > self.range_max - self.range_min:
            raise SentembConfigError(
                f"mine.num_negatives={self.num_negatives} > mine.range_max - mine.range_min = "
                f"{self.range_max - self.range_min}: not that many candidates lie in the window. Fix: "
                f"mine.range_max={self.range_min + self.num_negatives} or more, or fewer mine.num_negatives"
            )

    def window(self, max_positives: int) -> int:
        """range_max, or, when null, what sentence-transformers derives (hard_negatives.py: range_min +
        10·num_negatives + max_positives when a margin or max_score may drop candidates, else range_min +
        num_negatives + max_positives)."""
        if self.range_max is not None:
            return self.range_max
        filtered = self.absolute_margin is not None or self.relative_margin is not None or self.max_score is not None
        return self.range_min + self.num_negatives * (10 if filtered else 1) + max_positives

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def optional_number(key: str, value: Any, bounds: Bounds) -> float | None:
    return None if value is None else require_number(key, value, bounds, f"{key}=<a number {bounds}>, or null (off)")


def choice(key: str, value: Any, allowed: tuple[str, ...]) -> str:
    if isinstance(value, str) and value in allowed:
        return value
    raise SentembConfigError(f"{key}={value!r} is not one of {', '.join(allowed)}. Fix: {key}={allowed[0]}")
