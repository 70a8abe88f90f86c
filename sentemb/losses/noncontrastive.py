"""The non-contrastive objectives in their original form (paradigm paper Section 4, App. D.2).

All on L2-normalised embeddings, as the paper does. Definitions (docs/objectives.md):
  align_mhe  L^a + ν L^{u,MHE},  L^a = (1/N) Σ_i ‖h_i−h'_i‖²,
             L^{u,MHE} = log(2/(N(N−1)) Σ_{k<l} e^{−‖h_k−h_l‖²})                         (grad: Eq. 7, 8)
  align_mhs  L^a + ν (1/N) Σ_i L_i^{u,MHS},  L_i^{u,MHS} = −min_{j≠i} ‖h_i−h_j‖              (grad: Eq. 7, 9)
  barlow     Σ_k (C_kk−1)² + ν Σ_{k≠l} C_kl²,  C = (1/N) Σ_i h_i h'_iᵀ                      (grad: Eq. 10, Table 2)
  vicreg     L^a + ν1 (v(h)+v(h')) + ν2 (c(h)+c(h')),  v = (1/D) Σ_{k≠l} Cov_kl²,
             c = (1/D) Σ_k max(0, γ − std_k)                                                 (grad: Eq. 11)

Options: `gd: margin` adds the paradigm's gradient dissipation (anchor h_i gets gradient only
while s_ii − max_{k≠i} s_ik < m): the "+GD" step of Table 5. `barlow.standardize` adds Barlow
Twins' batch standardisation (off, as in the paper). The variance hinge's std is sqrt(var + 1e-4)
as in VICReg. Telemetry: GD (1, or the margin's fraction); for MHE/MHS also the hardest
negative's share of W and the mean R of Table 2 (as the implemented batch total gives them: for
MHS R = 2‖h_i−h_j‖/ν; Table 2's extra 1/N mixes a batch-mean alignment with one anchor's MHS).
Barlow's and VICReg's W are signed (linear in the similarity) and Barlow's R is a matrix, so no
share or ratio is logged for them. Inputs: z1, z2 (N, D).
None takes extra negatives (a momentum queue): MHE's and MHS's uniformity is over the batch's own
same-view pairs and Barlow's and VICReg's terms are statistics of the two views, not a denominator
of negatives (`Objective.negatives_refusal` says so before anything is built).

`convention: reference` computes the paradigm paper's public code (reference.py; isotropy/
models.py `_i_forward`, the non-contrastive branch, flags `w_gd` ↔ gd=margin), with ν = the
code's `lambda` (nu1 for VICReg):
  align_mhe  `mhe`: ν (log Σ_{k<l} e^{h_k·h_l} + the same for h') + (1/N) Σ_i ‖h_i − h'_i‖²;
             e^{h_k·h_l} ∝ e^{−‖h_k−h_l‖²/2}, half the text's exponent, and no 2/(N(N−1)).
  align_mhs  `mhs`: ν (mean_i −min_{j≠i} sqrt(‖h_i − sg(h'_j)‖² + 1e-4) + the same from h')
             + mean_i ‖h_i − h'_i‖²: cross-view, detached, where the text takes the nearest
             same-view neighbour (Eq. 9).
  barlow     `barlowtwins`: the gradient surrogate of Eq. 10, both directions summed:
             −Σ_k (2/N)(1 − (1−ν) C_kk) h_ik sg(h'_ik) + ν Σ_j (2 h'_i·h'_j/N²) h_i·sg(h_j);
             no batch standardisation (`standardize` is refused).
  vicreg     `vicreg`: the surrogate of Eq. 11, −(2/N) h_i·sg(h'_i) + ν1 Σ_j (2 a_ij/N²) h_i·sg(h_j),
             both directions summed: no centring, no k ≠ l, no variance hinge (nu2 and gamma
             must keep their defaults).
With gd=margin each view is gated by its own same-view indicator 𝕀{a_ii − max_{j≠i} a_ij < m}
wherever it appears (the code's w_gd), not by the cross-view margin of the text.
"""

from __future__ import annotations

import math

import torch

from sentemb.common.errors import SentembConfigError
from sentemb.common.parts import part
from sentemb.losses import reference as public_code
from sentemb.losses.base import LazyStats, LossOutput, Objective, require_choice, require_finite, require_positive
from sentemb.losses.geometry import (
    PARADIGM_TELEMETRY,
    WEIGHTED_TELEMETRY,
    diagonal_mask,
    gate_anchors,
    margin_indicator,
    negative_softmax,
    negatives_logsumexp,
    one_hot_rows,
    paradigm_stats,
    unit_distance,
    upper_pairs,
)

VARIANCE_EPS = 1e-4  # VICReg's sqrt(var + ε)


class GatedObjective(Objective):
    """An original-form loss with the optional margin gradient dissipation of the paradigm."""

    def __init__(self, gd: str, m: float, symmetric: bool, convention: str) -> None:
        super().__init__()
        self.gd = require_choice("gd", gd, ("none", "margin"))
        self.m = require_finite("m", m, "0.30")
        self.set_convention(convention, symmetric)

    def anchors(self, h1: torch.Tensor, s: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(h1 gated by d, d): with gd=none every anchor is active."""
        if self.gd == "none":
            return h1, torch.ones(h1.shape[0], dtype=h1.dtype, device=h1.device)
        d = margin_indicator(s.detach(), self.m)
        return gate_anchors(h1, d), d

    def decorrelation_reference(self, h1: torch.Tensor, h2: torch.Tensor, kind: str, nu: float) -> LossOutput:
        """The public code's original Barlow Twins / VICReg branch: linear weights, no w_w or w_r (reference.py)."""
        loss, parts = public_code.decorrelation_loss(
            h1, h2, kind=kind, gd=self.gd == "margin", weights="linear", ratio=None, m=self.m, tau=1.0, power=4.0, nu=nu
        )
        return public_code.with_telemetry(loss, parts, h1, h2)


def alignment(h1: torch.Tensor, h2: torch.Tensor) -> torch.Tensor:
    """L^a = (1/N) Σ_i ‖h_i − h'_i‖²."""
    return (h1 - h2).pow(2).sum(dim=1).mean()


class AlignUniform(GatedObjective):
    """L^a + ν · (a uniformity term)."""

    telemetry = WEIGHTED_TELEMETRY

    no_negatives = (
        "its uniformity term is over the batch's own same-view pairs, not a denominator of negatives, "
        "so a queue has nowhere to go"
    )

    def __init__(
        self, nu: float = 1.0, gd: str = "none", m: float = 0.30, symmetric: bool = False, convention: str = "paper"
    ) -> None:
        super().__init__(gd, m, symmetric, convention)
        self.nu = require_positive("nu", nu, "1.0")


@part("loss", "align_mhe")
class AlignMHE(AlignUniform):
    def directional(self, h1: torch.Tensor, h2: torch.Tensor) -> LossOutput:
        n = h1.shape[0]
        s = h1 @ h2.T
        x1, d = self.anchors(h1, s)
        a = x1 @ x1.T
        # −‖h_k − h_l‖² = 2a_kl − 2 on the sphere
        uniformity = upper_pairs(2.0 * a - 2.0).logsumexp(dim=0) - math.log(n * (n - 1) / 2)
        loss = alignment(x1, h2) + self.nu * uniformity

        def stats() -> dict[str, float]:
            # Table 2: W ∝ e^{2a_ij}, R_i = Σ_{k<l} e^{2a_kl} / (ν N Σ_{k≠i} e^{2a_ik})
            ratio = (upper_pairs(2.0 * a).logsumexp(dim=0) - math.log(self.nu * n) - negatives_logsumexp(2.0 * a)).exp()
            return paradigm_stats(s, h1, h2, gd=d, weights=negative_softmax(2.0 * a), ratio=ratio)

        return LossOutput(loss, LazyStats(stats, s.device))

    def reference(self, h1: torch.Tensor, h2: torch.Tensor) -> LossOutput:
        loss, parts = public_code.mhe_loss(
            h1, h2, gd=self.gd == "margin", weighted=False, ratio=None, m=self.m, tau=1.0, nu=self.nu
        )
        return public_code.with_telemetry(loss, parts, h1, h2)


@part("loss", "align_mhs")
class AlignMHS(AlignUniform):
    def directional(self, h1: torch.Tensor, h2: torch.Tensor) -> LossOutput:
        n = h1.shape[0]
        s = h1 @ h2.T
        x1, d = self.anchors(h1, s)
        distance = unit_distance(x1 @ x1.T)
        nearest, index = distance.masked_fill(diagonal_mask(n, h1.device), math.inf).min(dim=1)
        loss = alignment(x1, h2) + self.nu * (-nearest).mean()

        def stats() -> dict[str, float]:
            weights = one_hot_rows(index, n, s.dtype)
            return paradigm_stats(s, h1, h2, gd=d, weights=weights, ratio=2.0 * nearest / self.nu)

        return LossOutput(loss, LazyStats(stats, s.device))

    def reference(self, h1: torch.Tensor, h2: torch.Tensor) -> LossOutput:
        loss, parts = public_code.mhs_loss(h1, h2, gd=self.gd == "margin", ratio=None, m=self.m, nu=self.nu)
        return public_code.with_telemetry(loss, parts, h1, h2)


@part("loss", "barlow")
class BarlowTwins(GatedObjective):
    telemetry = PARADIGM_TELEMETRY
    no_negatives = "its cross-correlation of the two views has no negatives' denominator to add a queue to"

    def __init__(
        self,
        nu: float = 5e-3,
        standardize: bool = False,
        gd: str = "none",
        m: float = 0.30,
        symmetric: bool = False,
        convention: str = "paper",
    ) -> None:
        super().__init__(gd, m, symmetric, convention)
        self.nu = require_positive("nu", nu, "0.005")
        self.standardize = standardize
        if self.convention == "reference" and standardize:
            raise SentembConfigError(
                "loss.standardize=true with loss.convention=reference: the public code's Barlow Twins has no batch "
                "standardisation. Fix: loss.standardize=false, or loss.convention=paper"
            )

    def directional(self, h1: torch.Tensor, h2: torch.Tensor) -> LossOutput:
        n = h1.shape[0]
        s = h1 @ h2.T
        x1, d = self.anchors(h1, s)
        x2 = h2
        if self.standardize:  # Barlow Twins' BatchNorm without affine: zero mean, unit variance per dimension
            x1, x2 = batch_standardize(x1), batch_standardize(x2)
        cross = x1.T @ x2 / n  # C = (1/N) Σ_i h_i h'_iᵀ
        on_diagonal = cross.diagonal()
        loss = (on_diagonal - 1.0).pow(2).sum() + self.nu * (cross.pow(2).sum() - on_diagonal.pow(2).sum())
        return LossOutput(loss, LazyStats(lambda: paradigm_stats(s, h1, h2, gd=d), s.device))

    def reference(self, h1: torch.Tensor, h2: torch.Tensor) -> LossOutput:
        return self.decorrelation_reference(h1, h2, "barlow", self.nu)


@part("loss", "vicreg")
class VICReg(GatedObjective):
    telemetry = PARADIGM_TELEMETRY
    no_negatives = (
        "its variance and covariance terms are statistics of each view over the batch, with no negatives' "
        "denominator to add a queue to"
    )

    def __init__(
        self,
        nu1: float = 1.0,
        nu2: float = 1.0,
        gamma: float = 1.0,
        gd: str = "none",
        m: float = 0.30,
        symmetric: bool = False,
        convention: str = "paper",
    ) -> None:
        super().__init__(gd, m, symmetric, convention)
        self.nu1 = require_positive("nu1", nu1, "1.0")
        self.nu2 = require_positive("nu2", nu2, "1.0")
        self.gamma = require_positive("gamma", gamma, "1.0")
        if self.convention == "reference" and (nu2, gamma) != (1.0, 1.0):
            raise SentembConfigError(
                f"loss.nu2={nu2}, loss.gamma={gamma} with loss.convention=reference: the public code's VICReg has no "
                "variance hinge (its lambda is loss.nu1). Fix: leave nu2 and gamma at 1.0, or loss.convention=paper"
            )

    def directional(self, h1: torch.Tensor, h2: torch.Tensor) -> LossOutput:
        s = h1 @ h2.T
        x1, d = self.anchors(h1, s)
        loss = (
            alignment(x1, h2)
            + self.nu1 * (covariance_term(x1) + covariance_term(h2))
            + self.nu2 * (variance_term(x1, self.gamma) + variance_term(h2, self.gamma))
        )
        return LossOutput(loss, LazyStats(lambda: paradigm_stats(s, h1, h2, gd=d), s.device))

    def reference(self, h1: torch.Tensor, h2: torch.Tensor) -> LossOutput:
        return self.decorrelation_reference(h1, h2, "vicreg", self.nu1)


def batch_standardize(x: torch.Tensor) -> torch.Tensor:
    return (x - x.mean(dim=0)) / torch.sqrt(x.var(dim=0, unbiased=False) + 1e-5)


def covariance_term(x: torch.Tensor) -> torch.Tensor:
    """v = (1/D) Σ_{k≠l} Cov_kl², Cov = (1/(N−1)) Σ_i (h_i − h̄)(h_i − h̄)ᵀ."""
    centered = x - x.mean(dim=0)
    cov = centered.T @ centered / (x.shape[0] - 1)
    return (cov.pow(2).sum() - cov.diagonal().pow(2).sum()) / x.shape[1]


def variance_term(x: torch.Tensor, gamma: float) -> torch.Tensor:
    """c = (1/D) Σ_k max(0, γ − std_k), std the sample standard deviation."""
    std = torch.sqrt(x.var(dim=0, unbiased=True) + VARIANCE_EPS)
    return torch.relu(gamma - std).mean()
