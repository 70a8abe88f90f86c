"""Focal-InfoNCE: self-paced re-weighting of positives and hard negatives (Hou et al.).

    L_i = −log e^{s_ii²/τ} / (Σ_{j≠i} e^{s_ij(s_ij+m)/τ} + e^{s_ii²/τ})          (focal paper Eq. 2)
    ∂L/∂s_ij = (2s_ij + m)/τ · e^{s_ij(s_ij+m)/τ}/Z_i,   ∂L/∂s_ii = (2/τ)(e^{s_ii²/τ}/Z_i − 1) s_ii   (Eq. 4, 5)

Eq. 4 prints the negative's factor as 2(s_ij + m)/τ; the derivative of s(s+m)/τ is (2s + m)/τ,
which is what autograd gives and what the tests check. Mapped onto the paradigm (Eq. 4):
GD = 1 − P_ii (the softmax mass on negatives), W_ij ∝ q_ij (2s_ij + m)/τ with q the softmax over
negatives, R_i = 2 s_ii / Σ_j q_ij (2s_ij + m); `hardest_share` is the largest q_ij.
Inputs: z1, z2 (N, D); the value is the mean over anchors (the paper sums: one constant).
Example: `FocalInfoNCE(tau=0.05, m=0.3)(z1, z2).loss`.
Extra negatives (a momentum queue) are extra columns of the same τ, each with the negatives'
logit s_ij(s_ij+m)/τ. Excluded false negatives (`excluded`, DCLR) leave Eq. 2's denominator (logit −∞: the
term e^{s_ij(s_ij+m)/τ} of that j is gone).

`convention`: only `paper`; the paradigm paper's public code has no focal loss.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from sentemb.common.errors import SentembConfigError
from sentemb.common.parts import part
from sentemb.losses.base import IN_BATCH_NEGATIVES, LazyStats, LossOutput, Objective, require_finite, require_positive
from sentemb.losses.geometry import WEIGHTED_TELEMETRY, negative_softmax, paradigm_stats, positive_mask


@part("loss", "focal")
class FocalInfoNCE(Objective):
    no_negatives = None
    telemetry = WEIGHTED_TELEMETRY
    conventions = ("paper",)  # the paradigm paper's public code has no Focal-InfoNCE
    learns_from = IN_BATCH_NEGATIVES  # exactly 0 where every other candidate is masked as a duplicate

    def __init__(self, tau: float = 0.05, m: float = 0.3, symmetric: bool = False, convention: str = "paper") -> None:
        super().__init__()
        self.tau = require_positive("tau", tau, "0.05")
        self.m = require_finite("m", m, "0.3")
        if convention == "reference":
            raise SentembConfigError(
                "loss.convention=reference: the paradigm paper's public code has no Focal-InfoNCE. "
                "Fix: loss.convention=paper (focal's only form)"
            )
        self.set_convention(convention, symmetric)

    def directional(self, h1: torch.Tensor, h2: torch.Tensor, excluded: torch.Tensor | None = None) -> LossOutput:
        s = h1 @ h2.T
        diagonal = positive_mask(s)  # N×M with extra negatives: every other column is a negative
        logits = torch.where(diagonal, s * s, s * (s + self.m)) / self.tau
        if excluded is not None:  # out of the denominator
            logits = logits.masked_fill(excluded, -math.inf)
        loss = F.cross_entropy(logits, torch.arange(s.shape[0], device=s.device))

        def stats() -> dict[str, float]:
            gd = 1.0 - logits.softmax(dim=1).diagonal()
            q = negative_softmax(logits, excluded)
            ratio = 2.0 * s.diagonal() / (q * (2.0 * s + self.m)).sum(dim=1)  # a row with no negative: dropped
            return paradigm_stats(s, h1, h2, gd=gd, weights=q, ratio=ratio, excluded=excluded)

        return LossOutput(loss, LazyStats(stats, s.device))
