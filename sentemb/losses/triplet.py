"""MPT, MET and MAT: triplet losses against the hardest in-batch negative (Nie et al., ICLR 2023).

    L_i = max(0, d(h_i, h'_i) − min_{j≠i} d(h_i, h'_j) + margin)
    MPT: d(a, b) = −a·b              ∂L_i/∂h_i = 𝕀 (h'_j − h'_i)                                  (Eq. 3)
    MET: d(a, b) = ‖a − b‖           ∂L_i/∂h_i = 𝕀 (h'_j/‖h_i−h'_j‖ − h'_i/‖h_i−h'_i‖)            (Eq. 3)
    MAT: d(a, b) = arccos(a·b), margin m·π
                                     ∂L_i/∂h_i = 𝕀 (h'_j/sin θ_ij − h'_i/sin θ_ii)

j is the hardest negative (largest s_ij); 𝕀 = 1 while the triplet still violates the margin.
MET's distances are sqrt(clamp(2 − 2s, ε)) and MAT's angles arccos of s clamped into
(−1+ε, 1−ε), so cos = 1 gives a finite gradient. Paradigm components (Table 1): GD = 𝕀,
W on the hardest negative only (MPT 1, MET 1/‖h_i−h'_j‖, MAT 1/sin θ_ij), R = 1 (MPT),
sqrt((1−s_ij)/(1−s_ii)) (MET), sin θ_ij / sin θ_ii (MAT). Inputs: z1, z2 (N, D); the value
is the mean over anchors. Example: `MPT(m=0.23)(z1, z2).loss`, `MET(m=0.45)`, `MAT(m=0.15)`.
Extra negatives (a momentum queue) are extra candidates for the hardest negative: j ranges over
the other sentences' h'_j and every queue row (under `reference` too: the same losses). Excluded false
negatives (`excluded`, DCLR) are never the hardest: the min_{j≠i} of L_i runs over the other candidates,
and an anchor with none left has no triplet (L_i = 0, still counted in the mean).

`convention: reference` (the paper's public code, isotropy/models.py `_i_forward`, branches
`mpt`, `met`, `mat`; one direction as here): MPT is the same computation. MET clamps 2 − 2s at
1e-4 instead of 1e-6 before the root, which changes the value and gradient only for pairs
closer than 0.01. MAT, which only the code defines (angular triplet, default m = 0.15), takes
arccos unclamped there (NaN at |s| ≥ 1 from rounding); both conventions clamp, which changes a
value only where |s| > 1 − 1e-6.
"""

from __future__ import annotations

import math

import torch

from sentemb.common.parts import part
from sentemb.losses.base import IN_BATCH_NEGATIVES, LazyStats, LossOutput, Objective, require_finite
from sentemb.losses.geometry import (
    WEIGHTED_TELEMETRY,
    hardest_negative,
    has_negative,
    margin_indicator,
    not_negative,
    one_hot_rows,
    paradigm_stats,
    safe_arccos,
    unit_distance,
)

REFERENCE_MET_EPS = 1e-4  # the public code's clamp_min(2 − 2s, 1e-4) before the root


@part("loss", "mpt")
class MPT(Objective):
    telemetry = WEIGHTED_TELEMETRY
    no_negatives = None
    learns_from = IN_BATCH_NEGATIVES  # exactly 0 where every other candidate is masked as a duplicate

    def __init__(self, m: float = 0.23, symmetric: bool = False, convention: str = "paper") -> None:
        super().__init__()
        self.m = require_finite("m", m, "0.23")
        self.set_convention(convention, symmetric)

    def directional(self, h1: torch.Tensor, h2: torch.Tensor, excluded: torch.Tensor | None = None) -> LossOutput:
        s = h1 @ h2.T
        hardest, index = hardest_negative(s, excluded)  # −∞ where every negative is excluded: relu gives 0
        loss = torch.relu(-s.diagonal() + hardest + self.m).mean()

        def stats() -> dict[str, float]:
            gd = margin_indicator(s, self.m, excluded)
            rows = None if excluded is None else has_negative(s, excluded)
            weights = one_hot_rows(index, s.shape[1], s.dtype, rows)
            return paradigm_stats(s, h1, h2, gd=gd, weights=weights, ratio=1.0, excluded=excluded)

        return LossOutput(loss, LazyStats(stats, s.device))


class DistanceTriplet(Objective):
    """max(0, d_ii − min_{j≠i} d_ij + margin) for a distance d of the cosine matrix; W = ∂d/∂s at the hardest."""

    telemetry = WEIGHTED_TELEMETRY

    no_negatives = None
    learns_from = IN_BATCH_NEGATIVES  # exactly 0 where every other candidate is masked as a duplicate

    def distances(self, s: torch.Tensor) -> torch.Tensor:  # pragma: no cover - abstract
        raise NotImplementedError

    def slope(self, s: torch.Tensor) -> torch.Tensor:  # pragma: no cover - abstract
        """−∂d/∂s."""
        raise NotImplementedError

    def margin(self) -> float:
        return self.m

    def directional(self, h1: torch.Tensor, h2: torch.Tensor, excluded: torch.Tensor | None = None) -> LossOutput:
        s = h1 @ h2.T
        distance = self.distances(s)
        positive = distance.diagonal()
        # j over all M columns but the excluded (+∞ where none is left: relu gives 0)
        nearest, index = distance.masked_fill(not_negative(s, excluded), math.inf).min(dim=1)
        loss = torch.relu(positive - nearest + self.margin()).mean()

        def stats() -> dict[str, float]:
            gd = (nearest - positive < self.margin()).to(s.dtype)
            # R = (∂d_ii/∂s_ii) / (∂d_ij/∂s_ij) at the hardest negative: MET √((1−s_ij)/(1−s_ii)), MAT sin θ_ij/sin θ_ii
            ratio = self.slope(s.diagonal()) / self.slope(s.gather(1, index[:, None])[:, 0])
            rows = None if excluded is None else has_negative(s, excluded)
            weights = one_hot_rows(index, s.shape[1], s.dtype, rows)
            return paradigm_stats(s, h1, h2, gd=gd, weights=weights, ratio=ratio, excluded=excluded)

        return LossOutput(loss, LazyStats(stats, s.device))


@part("loss", "met")
class MET(DistanceTriplet):
    def __init__(self, m: float = 0.45, symmetric: bool = False, convention: str = "paper") -> None:
        super().__init__()
        self.m = require_finite("m", m, "0.45")
        self.set_convention(convention, symmetric)

    def distances(self, s: torch.Tensor) -> torch.Tensor:
        return unit_distance(s, REFERENCE_MET_EPS) if self.convention == "reference" else unit_distance(s)

    def slope(self, s: torch.Tensor) -> torch.Tensor:
        """−∂‖a−b‖/∂s = 1/‖a−b‖."""
        return 1.0 / self.distances(s)


@part("loss", "mat")
class MAT(DistanceTriplet):
    def __init__(self, m: float = 0.15, symmetric: bool = False, convention: str = "paper") -> None:
        super().__init__()
        self.m = require_finite("m", m, "0.15")
        self.set_convention(convention, symmetric)

    def distances(self, s: torch.Tensor) -> torch.Tensor:
        return safe_arccos(s)

    def margin(self) -> float:
        return self.m * math.pi  # m is a fraction of π, as in the code

    def slope(self, s: torch.Tensor) -> torch.Tensor:
        """−∂θ/∂s = 1/sin θ."""
        return 1.0 / torch.sin(safe_arccos(s))
