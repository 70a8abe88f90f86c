"""The non-contrastive objectives after the paradigm's modification (Section 4, Appendix E).

Each anchor gets the three components of the effective losses: the margin GD
d_i = 𝕀{s_ii − max_{k≠i} s_ik < m}, an exponential W dominated by the hardest negative, and a
static ratio r. Gradients (tangential part, docs/objectives.md):
  mmhe     Eq. 14   ∂L/∂h_i = d_i Σ_{j≠i} e^{a_ij/τ}(h_j − r h'_i) / (τ Σ_{k<l} e^{a_kl/τ})      (Eq. 16)
  mmhs     Eq. 15   ∂L/∂h_i = d_i (h_j − r h'_i)/‖h_i − h_j‖, j the nearest same-view neighbour (Eq. 17)
  mbarlow  Eq. 6    ∂L/∂h_i = d_i Σ_{j≠i} w_ij (h_j − r h'_i),  w_ij = e^{h'_i·h'_j/τ}/Σ_{k≠l} e^{h'_k·h'_l/τ}
  mvicreg  Eq. 13   ∂L/∂h_i = d_i Σ_{j≠i} w_ij (h_j − r h'_i),  w_ij = e^{a_ij/τ}/Σ_{k≠l} e^{a_kl/τ}
Bookkeeping (docs/objectives.md): coefficients the paper marks "no gradient" and every negative h_j are
detached; d_i multiplies each anchor's own terms (value and gradient), so a batch in which no
anchor passes the margin gives loss 0 and zero gradients. mMHE's total is L^{u,mMHE} (once, its
anchors gated by d, its value counted while any anchor is active) + Σ_i d_i L_i^{a,mMHE}; mMHS is
the mean over anchors (autograd = Eq. 17 / N); mB and mV are sums over anchors with the global
normalisation of their weights (autograd = Eq. 18/19 exactly), means with `w_norm: row`
(the row-normalised variant printed in Eq. 19).

Options: `r` a number, or `original` for the unmodified ratio (Table 5's "+W" step: the
original alignment coefficient, 1/N for MHE, 1 for MHS, w_p = 2/N for Barlow and VICReg);
`gd: none` drops the margin; `margin_on: same` reads d_i off the same view
(1 − max_{j≠i} a_ij < m) and `symmetric: true` averages both directions (two of the public
code's differences, but not its gating: `convention: reference` is the code itself). mB and
mV take `w: power`, w_ij ∝ max(sim_ij, 1e-4)^power, the code's alternative to e^{sim/τ}.
Inputs: z1, z2 (N, D); defaults are Table 6 (BERT-base).
None takes extra negatives (a momentum queue): their uniformity terms (mmhe, mmhs) and negative
terms (mbarlow, mvicreg) are over the batch's own same-view pairs, not a denominator of negatives.

`convention: reference` computes the paradigm paper's public code (reference.py; isotropy/
models.py `_i_forward`, the non-contrastive branch with w_gd (gd=margin), w_w (these losses'
weights) and w_r (a number r; `r: original` leaves w_r out)), with `nu` = the code's lambda:
  - both directions summed; each view gated by its own same-view indicator
    d_i = 𝕀{a_ii − max_{j≠i} a_ij < m} (a_ii as computed, ≈ 1) wherever it appears, so h'_i's gradient
    through anchor i's positive term is gated by d'_i (the text's d_i gates the whole anchor term);
  - mmhe: ν (U + U') + Σ_i (2 − 2 h_i·h'_i) r (c_i + c'_i)/2, U = log Σ_{k<l} e^{a_kl/τ},
    c_i = Σ_{j≠i} e^{a_ij/τ} / (τ Σ_{k<l} e^{a_kl/τ}): the effective R is ≈ 2r/ν;
  - mmhs: cross-view detached MHS, ν (mean_i −min_{j≠i} D_ij + the same from h') +
    mean_i (2 − 2 h_i·h'_i) r (1/D_i + 1/D'_i)/2, D_ij = sqrt(‖h_i − sg(h'_j)‖² + 1e-4);
  - mbarlow / mvicreg: Σ_i ν r (Σ_{j≠i} w_ij)(−h_i·h'_i) + ν Σ_j w_ij h_i·sg(h_j) per direction,
    w from sg(h'h'ᵀ) (mB) or sg(hhᵀ) (mV) divided by its k ≠ l sum with the diagonal kept in
    the numerator (radial: no gradient on the sphere); `w_norm: row` is refused.
The logged R is that effective ratio. In `paper` mode `nu` must stay 1 (the text has no λ here).
"""

from __future__ import annotations

import math

import torch

from sentemb.common.errors import SentembConfigError
from sentemb.common.parts import part
from sentemb.losses import reference as public_code
from sentemb.losses.base import (
    LazyStats,
    LossOutput,
    Objective,
    parse_ratio,
    require_choice,
    require_finite,
    require_non_negative,
    require_positive,
    require_reference_option,
)
from sentemb.losses.geometry import (
    WEIGHTED_TELEMETRY,
    gate_anchors,
    global_negative_softmax,
    hardest_negative,
    margin_indicator,
    negative_power_weights,
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

    telemetry = WEIGHTED_TELEMETRY

    no_negatives = (
        "its uniformity terms are over the batch's own same-view pairs, not a denominator of negatives, "
        "so a queue has nowhere to go"
    )

    def __init__(
        self, m: float, r: float | str, gd: str, margin_on: str, symmetric: bool, nu: float, convention: str
    ) -> None:
        super().__init__()
        self.m = require_finite("m", m, "0.30")
        self.r = parse_ratio(r, ("original",))
        self.gd = require_choice("gd", gd, ("margin", "none"))
        self.margin_on = require_choice("margin_on", margin_on, ("cross", "same"))
        self.nu = require_positive("nu", nu, "1.0")
        self.set_convention(convention, symmetric)
        if self.convention == "paper" and self.nu != 1.0:
            raise SentembConfigError(
                f"loss.nu={nu}: nu is the public code's lambda (loss.convention=reference); the paper's modified "
                "losses have no such weight. Fix: loss.nu=1.0, or loss.convention=reference"
            )

    @property
    def code_ratio(self) -> float | None:
        """The code's w_r: the number r, or None (`r: original`, no w_r)."""
        return None if self.r == "original" else self.r

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


@part("loss", "mmhe")
class ModifiedMHE(ModifiedObjective):
    def __init__(
        self,
        m: float = 0.30,
        tau: float = 0.05,
        r: float | str = 1.75,
        gd: str = "margin",
        margin_on: str = "cross",
        symmetric: bool = False,
        nu: float = 1.0,
        convention: str = "paper",
    ) -> None:
        super().__init__(m, r, gd, margin_on, symmetric, nu, convention)
        self.tau = require_positive("tau", tau, "0.05")

    def reference(self, h1: torch.Tensor, h2: torch.Tensor) -> LossOutput:
        loss, parts = public_code.mhe_loss(
            h1, h2, gd=self.gd == "margin", weighted=True, ratio=self.code_ratio, m=self.m, tau=self.tau, nu=self.nu
        )
        return public_code.with_telemetry(loss, parts, h1, h2)

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

        def stats() -> dict[str, float]:
            ratio = 2 * self.tau * coefficient / row_share
            return paradigm_stats(s, h1, h2, gd=d, weights=negative_softmax(a / self.tau), ratio=ratio)

        return LossOutput(loss, LazyStats(stats, s.device))


@part("loss", "mmhs")
class ModifiedMHS(ModifiedObjective):
    def __init__(
        self,
        m: float = 0.30,
        r: float | str = 1.75,
        gd: str = "margin",
        margin_on: str = "cross",
        symmetric: bool = False,
        nu: float = 1.0,
        convention: str = "paper",
    ) -> None:
        super().__init__(m, r, gd, margin_on, symmetric, nu, convention)

    def reference(self, h1: torch.Tensor, h2: torch.Tensor) -> LossOutput:
        loss, parts = public_code.mhs_loss(h1, h2, gd=self.gd == "margin", ratio=self.code_ratio, m=self.m, nu=self.nu)
        return public_code.with_telemetry(loss, parts, h1, h2)

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

        def stats() -> dict[str, float]:
            weights = one_hot_rows(index, n, s.dtype)
            return paradigm_stats(s, h1, h2, gd=d, weights=weights, ratio=2 * coefficient * nearest)

        return LossOutput(loss, LazyStats(stats, s.device))


class ModifiedDecorrelation(ModifiedObjective):
    """mB and mV: −h_i·w_p,i h'_i + Σ_{j≠i} h_i·w_ij sg(h_j), gated by d_i (Eq. 6, 13)."""

    no_negatives = (
        "its negative term Σ_j w_ij h_i·sg(h_j) is over the batch's own same-view pairs, with weights normalised "
        "over those pairs, not a denominator of negatives"
    )

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
        w: str = "exp",
        power: float = 4.0,
        nu: float = 1.0,
        convention: str = "paper",
    ) -> None:
        super().__init__(m, r, gd, margin_on, symmetric, nu, convention)
        self.tau = require_positive("tau", tau, "0.05")
        self.w_norm = require_choice("w_norm", w_norm, ("global", "row"))
        self.w = require_choice("w", w, ("exp", "power"))
        self.power = require_non_negative("power", power, "4")
        if self.convention == "reference":
            require_reference_option("w_norm", w_norm, ("global",), "the public code's weights")

    def reference(self, h1: torch.Tensor, h2: torch.Tensor) -> LossOutput:
        kind = "barlow" if self.weights_from == "h2" else "vicreg"
        loss, parts = public_code.decorrelation_loss(
            h1,
            h2,
            kind=kind,
            gd=self.gd == "margin",
            weights=self.w,
            ratio=self.code_ratio,
            m=self.m,
            tau=self.tau,
            power=self.power,
            nu=self.nu,
        )
        return public_code.with_telemetry(loss, parts, h1, h2)

    @torch.no_grad()
    def weights(self, base: torch.Tensor) -> torch.Tensor:
        """w_ij ∝ e^{base_ij/τ} (or max(base_ij, 1e-4)^power) off the diagonal, normalised globally or per row."""
        if self.w == "exp":
            logits = base / self.tau
            return global_negative_softmax(logits) if self.w_norm == "global" else negative_softmax(logits)
        return negative_power_weights(base, self.power, normalise=self.w_norm)

    def directional(self, h1: torch.Tensor, h2: torch.Tensor) -> LossOutput:
        n = h1.shape[0]
        s, a, d = self.similarities_and_indicator(h1, h2)
        with torch.no_grad():
            weights = self.weights(h2 @ h2.T if self.weights_from == "h2" else a)
            positive_weight = torch.full_like(d, 2.0 / n) if self.r == "original" else self.r * weights.sum(dim=1)
        per_anchor = -positive_weight * s.diagonal() + (weights * (h1 @ h1.detach().T)).sum(dim=1)
        gated = d * per_anchor
        loss = gated.sum() if self.w_norm == "global" else gated.mean()

        def stats() -> dict[str, float]:
            ratio = positive_weight / weights.sum(dim=1)
            return paradigm_stats(s, h1, h2, gd=d, weights=weights, ratio=ratio)

        return LossOutput(loss, LazyStats(stats, s.device))


@part("loss", "mbarlow")
class ModifiedBarlowTwins(ModifiedDecorrelation):
    __doc__ = ModifiedDecorrelation.__doc__
    weights_from = "h2"


@part("loss", "mvicreg")
class ModifiedVICReg(ModifiedDecorrelation):
    __doc__ = ModifiedDecorrelation.__doc__
    weights_from = "a"
