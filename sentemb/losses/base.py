"""What every objective shares: its output type, the normalisation, and hyper-parameter checks.

Conventions (docs/objectives.md): a loss takes the two views' raw embeddings
(z, z') of shape (N, D), normalises them itself, computes similarities in float32 (float64
inputs stay float64, for gradient tests) with autocast off, and uses one direction (h
anchors against h' candidates) unless `symmetric=True`, which averages both directions.

`convention`: `paper` (default) computes the paper's text; `reference` computes what the
paper's public code computes for the same settings (sentemb/losses/reference.py), with that
code's own direction handling, so `symmetric` is not used there.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from sentemb.common.errors import SentembConfigError


class LazyStats(Mapping[str, Any]):
    """A loss's telemetry, computed on first read (without gradients, autocast off) and then kept.

    Training reads it only on logging steps (SentembModule.on_train_batch_end), so the other
    steps pay nothing for it; `compute` holds the step's tensors until then.
    """

    def __init__(self, compute: Callable[[], Mapping[str, Any]], device: torch.device) -> None:
        self._compute: Callable[[], Mapping[str, Any]] | None = compute
        self._device_type = device.type
        self._values: dict[str, Any] = {}

    def _resolved(self) -> dict[str, Any]:
        if self._compute is not None:
            with torch.no_grad(), torch.autocast(device_type=self._device_type, enabled=False):
                self._values = dict(self._compute())
            self._compute = None  # frees the captured tensors
        return self._values

    def __getitem__(self, key: str) -> Any:
        return self._resolved()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._resolved())

    def __len__(self) -> int:
        return len(self._resolved())

    def __repr__(self) -> str:
        return f"LazyStats({self._values if self._compute is None else 'not computed yet'})"


@dataclass
class LossOutput:
    """The scalar to minimise, the floats worth logging (`stats`, often a LazyStats), and per-term values of a sum
    (detached scalars)."""

    loss: torch.Tensor
    stats: Mapping[str, float] = field(default_factory=dict)
    terms: dict[str, torch.Tensor] = field(default_factory=dict)


def normalize(z: torch.Tensor) -> torch.Tensor:
    """Unit vectors; half precision is promoted to float32 (spec: similarities in float32)."""
    if z.dtype not in (torch.float32, torch.float64):
        z = z.float()
    return F.normalize(z, dim=-1)


CONVENTIONS = ("paper", "reference")


class Objective(nn.Module):
    """Base class: `forward(z1, z2) -> LossOutput`; subclasses implement `directional(h1, h2)`.

    `directional` gets unit vectors in float32/float64 (autocast off) and returns the loss
    with h1 as anchors and h2 as candidates; `symmetric=True` averages it with the swapped call.
    Under `convention="reference"` `reference(h1, h2)` is called instead, once, with both views.
    """

    symmetric: bool = False
    convention: str = "paper"

    def directional(self, h1: torch.Tensor, h2: torch.Tensor) -> LossOutput:  # pragma: no cover - abstract
        raise NotImplementedError

    def reference(self, h1: torch.Tensor, h2: torch.Tensor) -> LossOutput:
        """The public code's computation for this loss's settings; the same as the paper's one direction
        unless a subclass says otherwise (InfoNCE, MPT: the code computes the text's loss)."""
        return self.directional(h1, h2)

    def set_convention(self, convention: str, symmetric: bool) -> None:
        """`convention` and `symmetric`, refusing `symmetric` where the public code fixes the directions."""
        self.convention = require_choice("convention", convention, CONVENTIONS)
        if self.convention == "reference" and symmetric:
            raise SentembConfigError(
                f"loss.symmetric=true with loss.convention=reference: {type(self).__name__}'s reference form has "
                "the public code's own direction handling. Fix: loss.symmetric=false, or loss.convention=paper"
            )
        self.symmetric = symmetric

    def forward(self, z1: torch.Tensor, z2: torch.Tensor) -> LossOutput:
        if z1.shape != z2.shape or z1.dim() != 2:
            raise ValueError(
                f"{type(self).__name__} expects two (N, D) views of equal shape, got {z1.shape}, {z2.shape}"
            )
        if z1.shape[0] < 2:
            # a trailing batch of one sentence has no negatives: nothing to learn, nothing to break
            return LossOutput(0.0 * (z1.sum() + z2.sum()).float())
        with torch.autocast(device_type=z1.device.type, enabled=False):
            h1, h2 = normalize(z1), normalize(z2)
            if self.convention == "reference":
                return self.reference(h1, h2)
            output = self.directional(h1, h2)
            if self.symmetric:  # average both directions; telemetry stays that of the h → h' direction
                backward = self.directional(h2, h1)
                output = LossOutput(0.5 * (output.loss + backward.loss), output.stats)
        return output


def require_positive(name: str, value: float, example: str) -> float:
    """`value` if it is a finite number > 0, else a config error naming `loss.<name>`."""
    if not (isinstance(value, int | float) and math.isfinite(value) and value > 0):
        raise SentembConfigError(f"loss.{name}={value} must be a number > 0. Fix: e.g. loss.{name}={example}")
    return float(value)


def require_finite(name: str, value: float, example: str) -> float:
    if not (isinstance(value, int | float) and math.isfinite(value)):
        raise SentembConfigError(f"loss.{name}={value} must be a finite number. Fix: e.g. loss.{name}={example}")
    return float(value)


def require_non_negative(name: str, value: float, example: str) -> float:
    if not (isinstance(value, int | float) and math.isfinite(value) and value >= 0):
        raise SentembConfigError(f"loss.{name}={value} must be a number >= 0. Fix: e.g. loss.{name}={example}")
    return float(value)


def require_reference_option(name: str, value: object, allowed: Iterable[str], source: str) -> None:
    """Under `convention=reference`, `value` must be one the public code has (`allowed`)."""
    allowed = tuple(allowed)
    if value not in allowed:
        raise SentembConfigError(
            f"loss.{name}={value!r} has no counterpart in {source} (loss.convention=reference), which has "
            f"{', '.join(map(str, allowed))}. Fix: loss.{name}={allowed[0]}, or loss.convention=paper"
        )


def require_choice(name: str, value: str, choices: Iterable[str]) -> str:
    choices = tuple(choices)
    if value not in choices:
        raise SentembConfigError(
            f"loss.{name}={value!r} is not one of {', '.join(choices)}. Fix: loss.{name}={choices[0]}"
        )
    return value


def parse_ratio(r: float | str, names: tuple[str, ...], example: str = "1.5") -> float | str:
    """A static ratio (a number > 0) or one of the named alternatives `names`."""
    if isinstance(r, str) and r in names:
        return r
    if isinstance(r, int | float) and not isinstance(r, bool):
        return require_positive("r", r, example)
    raise SentembConfigError(
        f"loss.r={r!r} must be a number > 0 (a static ratio) or one of {', '.join(names)}. Fix: e.g. loss.r={example}"
    )
