"""The non-contrastive objectives after the paradigm's modification (Section 4, Appendix E).

Each anchor gets the three components of the effective losses: the margin GD
d_i = 𝕀{s_ii − max_{k≠i} s_ik < m}, an exponential W dominated by the hardest negative, and a
static ratio r. Gradients (tangential part, spec objectives.md):
  mmhe     Eq. 14   ∂L/∂h_i = d_i Σ_{j≠i} e^{a_ij/τ}(h_j − r h'_i) / (τ Σ_{k<l} e^{a_kl/τ})      (Eq. 16)
  mmhs     Eq. 15   ∂L/∂h_i = d_i (h_j − r h'_i)/‖h_i − h_j‖, j the nearest same-view neighbour (Eq. 17)
  mbarlow  Eq. 6    ∂L/∂h_i = d_i Σ_{j≠i} w_ij (h_j − r h'_i),  w_ij = e^{h'_i·h'_j/τ}/Σ_{k≠l} e^{h'_k·h'_l/τ}
  mvicreg  Eq. 13   ∂L/∂h_i = d_i Σ_{j≠i} w_ij (h_j − r h'_i),  w_ij = e^{a_ij/τ}/Σ_{k≠l} e^{a_kl/τ}
Bookkeeping (spec): coefficients the paper marks "no gradient" and every negative h_j are
detached; d_i multiplies each anchor's own terms (value and gradient), so a batch in which no
anchor passes the margin gives loss 0 and zero gradients. mMHE's total is L^{u,mMHE} (once, its
anchors gated by d, its value counted while any anchor is active) + Σ_i d_i L_i^{a,mMHE}; mMHS is
the mean over anchors (autograd = Eq. 17 / N); mB and mV are sums over anchors with the global
normalisation of their weights (autograd = Eq. 18/19 exactly), means with `w_norm: row`
(the row-normalised variant printed in Eq. 19).

Options: `r` a number, or `original` for the unmodified ratio (Table 5's "+W" step: the
original alignment coefficient, 1/N for MHE, 1 for MHS, w_p = 2/N for Barlow and VICReg);
`gd: none` drops the margin; `margin_on: same` reads d_i off the same view
(1 − max_{j≠i} a_ij < m) and `symmetric: true` averages both directions, as the paper's
public code does. Inputs: z1, z2 (N, D); defaults are Table 6 (BERT-base).
"""

from __future__ import annotations

import math

import torch

from sentemb.losses.base import LossOutput, Objective, parse_ratio, require_choice, require_finite, require_positive
from sentemb.losses.geometry import (
    gate_anchors,
    global_negative_softmax,
    hardest_negative,
    margin_indicator,
    negative_softmax,
    negatives_logsumexp,
    one_hot_rows,
    paradigm_stats,
    same_view_margin_indicator,
    unit_distance,
    upper_pairs,
)


class ModifiedObjective(Objective):
    """Shared: the margin indicator d_i and its options."""

    def __init__(self, m: float, r: float | str, gd: str, margin_on: str, symmetric: bool) -> None:
        super().__init__()
        self.m = require_finite("m", m, "0.30")
        self.r = parse_ratio(r, ("original",))
        self.gd = require_choice("gd", gd, ("margin", "none"))
        self.margin_on = require_choice("margin_on", margin_on, ("cross", "same"))
        self.symmetric = symmetric

    def similarities_and_indicator(
        self, h1: torch.Tensor, h2: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """s = h·h'ᵀ, a = h·hᵀ and the anchors' d_i."""
        s, a = h1 @ h2.T, h1 @ h1.T
        return s, a, self.indicator(s.detach(), a.detach())

    @torch.no_grad()
    def indicator(self, s: torch.Tensor, a: torch.Tensor) -> torch.Tensor:
        if self.gd == "none":
            return torch.ones(s.shape[0], dtype=s.dtype, device=s.device)
        return margin_indicator(s, self.m) if self.margin_on == "cross" else same_view_margin_indicator(a, self.m)


class ModifiedMHE(ModifiedObjective):
    def __init__(
        self,
        m: float = 0.30,
        tau: float = 0.05,
        r: float | str = 1.75,
        gd: str = "margin",
        margin_on: str = "cross",
        symmetric: bool = False,
    ) -> None:
        super().__init__(m, r, gd, margin_on, symmetric)
        self.tau = require_positive("tau", tau, "0.05")

    def directional(self, h1: torch.Tensor, h2: torch.Tensor) -> LossOutput:
        n = h1.shape[0]
        s, a, d = self.similarities_and_indicator(h1, h2)
        gated = gate_anchors(h1, d)
        # L^{u,mMHE} = log(2 Σ_{k<l} e^{−‖h_k−h_l‖²/(2τ)} / (N(N−1))), with ‖h_k−h_l‖² = 2 − 2a_kl
        uniformity = upper_pairs((gated @ gated.T - 1.0) / self.tau).logsumexp(dim=0) - math.log(n * (n - 1) / 2)
        with torch.no_grad():
            row_share = (negatives_logsumexp(a / self.tau) - upper_pairs(a / self.tau).logsumexp(dim=0)).exp()
            # App. E: r Σ_{j≠i} e^{a_ij/τ} / (2τ Σ_{k<l} e^{a_kl/τ}), no gradient
            coefficient = torch.full_like(d, 1.0 / n) if self.r == "original" else self.r * row_share / (2 * self.tau)
        aligned = (d * coefficient * (h1 - h2).pow(2).sum(dim=1)).sum()
        loss = d.max() * uniformity + aligned
        with torch.no_grad():
            ratio = 2 * self.tau * coefficient / row_share
            stats = paradigm_stats(s, h1, h2, gd=d, weights=negative_softmax(a / self.tau), ratio=ratio)
        return LossOutput(loss, stats)


class ModifiedMHS(ModifiedObjective):
    def __init__(
        self,
        m: float = 0.30,
        r: float | str = 1.75,
        gd: str = "margin",
        margin_on: str = "cross",
        symmetric: bool = False,
    ) -> None:
        super().__init__(m, r, gd, margin_on, symmetric)

    def directional(self, h1: torch.Tensor, h2: torch.Tensor) -> LossOutput:
        n = h1.shape[0]
        s, a, d = self.similarities_and_indicator(h1, h2)
        index = hardest_negative(a.detach())[1]  # the nearest same-view neighbour
        separation = unit_distance((h1 * h1[index].detach()).sum(dim=1))  # ‖h_i − sg(h_j)‖
        with torch.no_grad():
            nearest = separation.detach()
            # App. E with Eq. 17's nearest distance: r / (2 sg(min_{j≠i} ‖h_i − h_j‖))
            coefficient = torch.ones_like(d) if self.r == "original" else self.r / (2 * nearest)
        per_anchor = coefficient * (h1 - h2).pow(2).sum(dim=1) - separation
        loss = (d * per_anchor).mean()
        with torch.no_grad():
            weights = one_hot_rows(index, n, s.dtype)
            stats = paradigm_stats(s, h1, h2, gd=d, weights=weights, ratio=2 * coefficient * nearest)
        return LossOutput(loss, stats)


class ModifiedDecorrelation(ModifiedObjective):
    """mB and mV: −h_i·w_p,i h'_i + Σ_{j≠i} h_i·w_ij sg(h_j), gated by d_i (Eq. 6, 13)."""

    weights_from = "h2"  # mB: h'_i·h'_j; mV: a_ij

    def __init__(
        self,
        m: float = 0.30,
        tau: float = 0.05,
        r: float | str = 1.50,
        w_norm: str = "global",
        gd: str = "margin",
        margin_on: str = "cross",
        symmetric: bool = False,
    ) -> None:
        super().__init__(m, r, gd, margin_on, symmetric)
        self.tau = require_positive("tau", tau, "0.05")
        self.w_norm = require_choice("w_norm", w_norm, ("global", "row"))

    def directional(self, h1: torch.Tensor, h2: torch.Tensor) -> LossOutput:
        n = h1.shape[0]
        s, a, d = self.similarities_and_indicator(h1, h2)
        with torch.no_grad():
            base = h2 @ h2.T if self.weights_from == "h2" else a
            logits = base / self.tau
            weights = global_negative_softmax(logits) if self.w_norm == "global" else negative_softmax(logits)
            positive_weight = torch.full_like(d, 2.0 / n) if self.r == "original" else self.r * weights.sum(dim=1)
        per_anchor = -positive_weight * s.diagonal() + (weights * (h1 @ h1.detach().T)).sum(dim=1)
        gated = d * per_anchor
        loss = gated.sum() if self.w_norm == "global" else gated.mean()
        with torch.no_grad():
            ratio = positive_weight / weights.sum(dim=1)
            stats = paradigm_stats(s, h1, h2, gd=d, weights=weights, ratio=ratio)
        return LossOutput(loss, stats)


class ModifiedBarlowTwins(ModifiedDecorrelation):
    __doc__ = ModifiedDecorrelation.__doc__
    weights_from = "h2"


class ModifiedVICReg(ModifiedDecorrelation):
    __doc__ = ModifiedDecorrelation.__doc__
    weights_from = "a"
