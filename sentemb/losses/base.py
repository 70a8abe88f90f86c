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
from collections.abc import Iterable
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from sentemb.common.errors import SentembConfigError


@dataclass
class LossOutput:
    """The scalar to minimise, the floats worth logging (`stats`), and per-term values of a sum."""

    loss: torch.Tensor
    stats: dict[str, float] = field(default_factory=dict)
    terms: dict[str, float] = field(default_factory=dict)


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
