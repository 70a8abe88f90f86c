"""ArcCon: InfoNCE with an additive angular margin u on the positive pair.

    L_i = −log e^{cos(θ_ii+u)/τ} / (e^{cos(θ_ii+u)/τ} + Σ_{j≠i} e^{s_ij/τ}),   θ_ii = arccos s_ii
    ∂L_i/∂h_i = Σ_{j≠i} e^{s_ij/τ}(h'_j − R h'_i) / (τ(e^{cos(θ_ii+u)/τ} + Σ_{k≠i} e^{s_ik/τ}))   (Eq. 2)
    R = sin(θ_ii+u)/sin θ_ii

s_ii is clamped into (−1+ε, 1−ε) before arccos, so identical views (cos = 1) stay finite.
Inputs: z1, z2 (N, D). Reference: Zhang et al. 2022 (ACL), paradigm paper Table 1.
Example: `ArcCon(tau=0.05, u=math.pi / 18)(z1, z2).loss`.
Extra negatives (a momentum queue) are extra columns of the same τ (the margin stays on the
positive only); under `reference` too (the same loss). Excluded false negatives (`excluded`, DCLR) leave
the denominator of L_i (logit −∞: that j's e^{s_ij/τ} is gone).

`convention: reference` (the paper's public code, isotropy/models.py `_i_forward`, branch
`arccon`): the same loss, one direction, but arccos of the unclamped positive cosine (NaN where
rounding puts it at or above 1); the clamp is kept, which changes a value only where
|s_ii| > 1 − 1e-6.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from sentemb.common.parts import part
from sentemb.losses.base import IN_BATCH_NEGATIVES, LazyStats, LossOutput, Objective, require_positive
from sentemb.losses.geometry import (
    WEIGHTED_TELEMETRY,
    negative_softmax,
    negatives_logsumexp,
    paradigm_stats,
    positive_mask,
    safe_arccos,
)


@part("loss", "arccon")
class ArcCon(Objective):
    no_negatives = None
    telemetry = WEIGHTED_TELEMETRY
    learns_from = IN_BATCH_NEGATIVES  # exactly 0 where every other candidate is masked as a duplicate

    def __init__(
        self, tau: float = 0.05, u: float = math.pi / 18, symmetric: bool = False, convention: str = "paper"
    ) -> None:
        super().__init__()
        self.tau = require_positive("tau", tau, "0.05")
        self.u = require_positive("u", u, "0.1745 (π/18, 10°)")
        self.set_convention(convention, symmetric)

    def directional(self, h1: torch.Tensor, h2: torch.Tensor, excluded: torch.Tensor | None = None) -> LossOutput:
        s = h1 @ h2.T
        theta_pos = safe_arccos(s.diagonal())
        positive_logit = torch.cos(theta_pos + self.u) / self.tau
        logits = torch.where(positive_mask(s), positive_logit[:, None], s / self.tau)  # N×M with extra negatives
        if excluded is not None:  # out of the denominator
            logits = logits.masked_fill(excluded, -math.inf)
        loss = F.cross_entropy(logits, torch.arange(s.shape[0], device=s.device))

        def stats() -> dict[str, float]:
            gd = torch.sigmoid(negatives_logsumexp(logits) - positive_logit)
            ratio = torch.sin(theta_pos + self.u) / torch.sin(theta_pos)  # Table 1 R, sin θ > 0 by the clamp
            weights = negative_softmax(logits, excluded)
            return paradigm_stats(s, h1, h2, gd=gd, weights=weights, ratio=ratio, excluded=excluded)

        return LossOutput(loss, LazyStats(stats, s.device))
