"""What every objective shares: its output type and float32 cosine similarities.

Conventions (../shared/spec/objectives.md): a loss takes the two views' raw embeddings
(z, z') of shape (N, D), normalises them itself, and returns the mean over anchors.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn


@dataclass
class LossOutput:
    """The scalar to minimise and the floats worth logging about this batch."""

    loss: torch.Tensor
    stats: dict[str, float] = field(default_factory=dict)


def normalize(z: torch.Tensor) -> torch.Tensor:
    """Unit vectors in float32, even under fp16/bf16 autocast (spec: similarities in float32)."""
    return F.normalize(z.float(), dim=-1)


def cross_view_similarity(z1: torch.Tensor, z2: torch.Tensor) -> torch.Tensor:
    """s_ij = h_i · h'_j for the (N, N) batch, computed in float32 with autocast off."""
    with torch.autocast(device_type=z1.device.type, enabled=False):
        return normalize(z1) @ normalize(z2).T


class Objective(nn.Module):
    """Base class: `forward(z1, z2) -> LossOutput`."""

    def forward(self, z1: torch.Tensor, z2: torch.Tensor) -> LossOutput:  # pragma: no cover - abstract
        raise NotImplementedError
