"""MPT and MET: triplet losses against the hardest in-batch negative (Nie et al., ICLR 2023).

    L_i = max(0, d(h_i, h'_i) − min_{j≠i} d(h_i, h'_j) + m)
    MPT: d(a, b) = −a·b            ∂L_i/∂h_i = 𝕀 (h'_j − h'_i)                                    (Eq. 3)
    MET: d(a, b) = ‖a − b‖         ∂L_i/∂h_i = 𝕀 (h'_j/‖h_i−h'_j‖ − h'_i/‖h_i−h'_i‖)              (Eq. 3)

j is the hardest negative (largest s_ij); 𝕀 = 1 while the triplet still violates the margin.
MET's distances are sqrt(clamp(2 − 2s, ε)) so cos = 1 gives a finite gradient. Paradigm
components (Table 1): GD = 𝕀, W = 1 (MPT) or 1/‖h_i−h'_j‖ (MET) on the hardest negative only,
R = 1 (MPT) or sqrt((1−s_ij)/(1−s_ii)) (MET). Inputs: z1, z2 (N, D); the value is the mean over anchors.
Example: `MPT(m=0.23)(z1, z2).loss`, `MET(m=0.45)(z1, z2).loss`.
"""

from __future__ import annotations

import math

import torch

from sentemb.losses.base import LossOutput, Objective, require_finite
from sentemb.losses.geometry import diagonal_mask, hardest_negative, one_hot_rows, paradigm_stats, unit_distance


class MPT(Objective):
    def __init__(self, m: float = 0.23, symmetric: bool = False) -> None:
        super().__init__()
        self.m = require_finite("m", m, "0.23")
        self.symmetric = symmetric

    def directional(self, h1: torch.Tensor, h2: torch.Tensor) -> LossOutput:
        s = h1 @ h2.T
        hardest, index = hardest_negative(s)
        loss = torch.relu(-s.diagonal() + hardest + self.m).mean()
        with torch.no_grad():
            gd = (s.diagonal() - hardest < self.m).to(s.dtype)
            stats = paradigm_stats(s, h1, h2, gd=gd, weights=one_hot_rows(index, s.shape[0], s.dtype), ratio=1.0)
        return LossOutput(loss, stats)


class MET(Objective):
    def __init__(self, m: float = 0.45, symmetric: bool = False) -> None:
        super().__init__()
        self.m = require_finite("m", m, "0.45")
        self.symmetric = symmetric

    def directional(self, h1: torch.Tensor, h2: torch.Tensor) -> LossOutput:
        s = h1 @ h2.T
        distance = unit_distance(s)
        positive = distance.diagonal()
        nearest, index = distance.masked_fill(diagonal_mask(s.shape[0], s.device), math.inf).min(dim=1)
        loss = torch.relu(positive - nearest + self.m).mean()
        with torch.no_grad():
            gd = (nearest - positive < self.m).to(s.dtype)
            ratio = nearest / positive  # sqrt((1 − s_ij)/(1 − s_ii)) at the hardest negative
            stats = paradigm_stats(s, h1, h2, gd=gd, weights=one_hot_rows(index, s.shape[0], s.dtype), ratio=ratio)
        return LossOutput(loss, stats)
