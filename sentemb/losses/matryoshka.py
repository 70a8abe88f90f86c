"""Matryoshka sizes around any loss (Kusupati et al. 2022, "Matryoshka Representation Learning"; sentence-transformers'
MatryoshkaLoss): the loss summed over the first d dimensions of every embedding it reads, for each size d.

    L = Σ_k w_k · L(inputs truncated to their first d_k dimensions)       (w_k = 1 unless `weights` says otherwise)

Each role's embeddings (anchors, positives, hard negatives, a negatives part's extra rows) are cut to their prefix;
the loss normalises them itself, so each prefix is renormalised as MRL's nested loss does. The masks (duplicates,
false negatives, absent rows) and the scores are the same at every size. The encoder runs once per step; with
GradCache the cached embeddings are cut the same way (the wrapper only sees the step's embeddings). Each size's loss
is logged as `dim_<d>`; the telemetry is the inner loss's at the largest size.
"""

from __future__ import annotations

from collections.abc import Sequence

from torch import nn

from sentemb.common.errors import SentembConfigError
from sentemb.common.numbers import NON_NEGATIVE, Bounds, require_number, require_whole
from sentemb.losses.base import LazyStats, LossOutput, Objective
from sentemb.losses.inputs import LossInputs

SIZES = Bounds(1, 1 << 20)  # an embedding width: at least 1, far below any model's


def check_dims(dims: object, weights: object = None, width: int | None = None) -> tuple[list[int], list[float]]:
    """`matryoshka.dims` (whole numbers ≥ 1, strictly descending, the first at most `width` where known) and
    `matryoshka.weights` (one finite number ≥ 0 per size, not all 0; null: 1 each), checked before any model loads."""
    if not isinstance(dims, Sequence) or isinstance(dims, str) or not dims:
        raise SentembConfigError(
            f"matryoshka.dims={dims!r} must be a list of sizes, largest first. Fix: e.g. "
            "matryoshka.dims=[384,192,96,48]"
        )
    fix = "e.g. matryoshka.dims=[384,192,96,48]: sizes of at least 1"
    sizes = [require_whole(f"matryoshka.dims[{i}]", d, SIZES, fix) for i, d in enumerate(dims)]
    if any(later >= earlier for earlier, later in zip(sizes, sizes[1:], strict=False)):
        raise SentembConfigError(
            f"matryoshka.dims={sizes} is not strictly descending. Fix: "
            f"matryoshka.dims={sorted(set(sizes), reverse=True)}"
        )
    if width is not None and sizes[0] > width:
        raise SentembConfigError(
            f"matryoshka.dims={sizes}: {sizes[0]} is wider than the sentence vector ({width}). Fix: sizes up to {width}"
        )
    if weights is None:
        return sizes, [1.0] * len(sizes)
    if not isinstance(weights, Sequence) or isinstance(weights, str) or len(weights) != len(sizes):
        raise SentembConfigError(
            f"matryoshka.weights={weights!r} must hold one weight per size ({len(sizes)}). Fix: "
            "matryoshka.weights=null (1 each), or one number per matryoshka.dims entry"
        )
    scaled = [require_number(f"matryoshka.weights[{i}]", w, NON_NEGATIVE, "e.g. 1.0") for i, w in enumerate(weights)]
    if not any(scaled):
        raise SentembConfigError("matryoshka.weights are all 0: no size would train. Fix: at least one weight > 0")
    return sizes, scaled


def truncated(inputs: LossInputs, size: int) -> LossInputs:
    """The inputs with every embedding cut to its first `size` dimensions (masks and scores unchanged)."""
    extra = None if inputs.extra is None else inputs.extra[:, :size]
    return inputs.with_roles(
        anchors=inputs.anchors[:, :size],
        positives=inputs.positives[:, :size],
        hard_negatives=tuple(hard[:, :size] for hard in inputs.hard_negatives),
        extra=extra,
    )


class Matryoshka(Objective):
    """A loss around a loss: `inner` at each size of `dims` (module docstring). What it reads and takes is the inner
    loss's, checked once on the full inputs."""

    wraps_losses = True

    def __init__(self, inner: Objective, dims: Sequence[int], weights: Sequence[float] | None = None) -> None:
        super().__init__()
        self.dims, self.weights = check_dims(dims, weights)
        self.inner: nn.Module = inner
        self.convention = inner.convention

    def refuses_negatives(self) -> str | None:
        return self.inner.refuses_negatives()

    def refuses_hard_negatives(self) -> str | None:
        return self.inner.refuses_hard_negatives()

    def takes_negatives(self) -> bool:
        return self.inner.takes_negatives()

    def offered_telemetry(self) -> tuple[str, ...]:
        return self.inner.offered_telemetry()

    def accept(self, inputs: LossInputs) -> None:
        self.inner.accept(inputs)
        if inputs.anchors.shape[1] < self.dims[0]:
            raise ValueError(
                f"matryoshka.dims starts at {self.dims[0]}, wider than these embeddings ({inputs.anchors.shape[1]})"
            )

    def compute(self, inputs: LossInputs) -> LossOutput:
        total, outputs = None, {}
        for size, weight in zip(self.dims, self.weights, strict=True):
            outputs[size] = output = self.inner.compute(truncated(inputs, size))
            total = weight * output.loss if total is None else total + weight * output.loss
        largest = outputs[self.dims[0]]
        terms = {f"dim_{size}": output.loss.detach() for size, output in outputs.items()}
        return LossOutput(total, LazyStats(lambda: dict(largest.stats), total.device), terms)
