"""The unified gradient paradigm as a loss, with each component a config choice.

    L_i = sg(GD_i) Σ_{j≠i} sg(W_ij) (s_ij − sg(R_ij) s_ii)                                  (Eq. 5)
    ∂L_i/∂h_i = GD_i Σ_{j≠i} W_ij (h'_j − R_ij h'_i)                                        (Eq. 4)

Components (spec, Table 1), all detached:
  gd: margin  = 𝕀{s_ii − max_{k≠i} s_ik < m}          (MPT's; the paper's baseline)
      infonce = 1/(1 + e^{s_ii/τ}/Σ_{k≠i} e^{s_ik/τ})
      none    = 1
  w:  softmax = e^{s_ij/τ}/Σ_{k≠i} e^{s_ik/τ};  hardest = 1 for argmax_{k≠i} s_ik;  uniform = 1/(N−1);
      power = max(s_ij, 1e-4)^power / Σ_{k≠i} max(s_ik, 1e-4)^power (the public code's; power 0 = uniform)
  r:  a number = that static ratio (`static` = 1);  arccon = sin(θ_ii+u)/sin θ_ii;
      met = sqrt((1−s_ij)/(1−s_ii))
Defaults are the paper's baseline (m 0.30, τ 0.05, r 1). A batch where no anchor passes the
margin gives loss 0 and zero gradients. Inputs: z1, z2 (N, D); value = mean over anchors.
Example: `Paradigm(gd="margin", w="softmax", r=1.5)(z1, z2).loss`; from the command line
`loss=paradigm loss.gd=none loss.r=arccon` or a sweep `-m loss.r=1.0,1.5,met`.
Extra negatives (a momentum queue) are extra columns j ≠ i of the same components: the max of the
margin, the sums of GD and W (softmax of the same τ, power, uniform 1/(M−1) over M = N + K
candidates, the hardest over all) run over them too (`convention: paper` only).
Excluded false negatives (`excluded`, DCLR) are no j of Eq. 5's Σ_{j≠i}: W_ij = 0 there and every component
reads the other negatives only (the margin's max, GD infonce's and W softmax's sums, power's normalisation,
uniform 1/(the negatives left), the hardest among them); an anchor with none left gives L_i = 0.

`convention: reference` computes the public code's `sg` loss (`sg.w_gd` for gd=margin, `sg`
for gd=none; see reference.sg_loss): both directions summed, each direction's d from its own
anchors' cross-view margin (rows, then columns), the positive s_ii live in both views (so the
effective R is about 2r), each direction the mean over its active rows' N columns (loss 0 where
no row is active, where the code gives NaN), and `power` cast to an integer as the code does.
The code has the margin and no GD, softmax (temp = τ) and power weights (uniform = power 0),
and static ratios only: gd=infonce, w=hardest and r=arccon/met are refused under `reference`.
Extra negatives are refused there: the sg loss has no counterpart with them.
"""

from __future__ import annotations

import math

import torch

from sentemb.common.errors import SentembConfigError
from sentemb.common.parts import part
from sentemb.losses.base import (
    IN_BATCH_NEGATIVES,
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
    hardest_negative,
    has_negative,
    margin_indicator,
    negative_power_weights,
    negative_softmax,
    negatives_logsumexp,
    not_negative,
    one_hot_rows,
    paradigm_stats,
    positive_mask,
    safe_arccos,
)
from sentemb.losses.reference import sg_loss, with_telemetry

GRADIENT_DISSIPATIONS = ("margin", "infonce", "none")
WEIGHTS = ("softmax", "hardest", "uniform", "power")
DYNAMIC_RATIOS = ("arccon", "met")


@part("loss", "paradigm")
class Paradigm(Objective):
    no_negatives = None
    telemetry = WEIGHTED_TELEMETRY
    learns_from = IN_BATCH_NEGATIVES  # exactly 0 where every other candidate is masked as a duplicate
    reference_no_negatives = (
        "the public code's sg loss sums both directions over the batch's square similarity matrices "
        "(each view's positive live in both), which has no counterpart with extra negatives"
    )

    def __init__(
        self,
        gd: str = "margin",
        w: str = "softmax",
        r: float | str = 1.0,
        m: float = 0.30,
        tau: float = 0.05,
        u: float = math.pi / 18,
        power: float = 4.0,
        symmetric: bool = False,
        convention: str = "paper",
    ) -> None:
        super().__init__()
        self.gd = require_choice("gd", gd, GRADIENT_DISSIPATIONS)
        self.w = require_choice("w", w, WEIGHTS)
        self.r = 1.0 if r == "static" else parse_ratio(r, (*DYNAMIC_RATIOS, "static"), "1.0")  # static: R = 1
        self.m = require_finite("m", m, "0.30")
        self.tau = require_positive("tau", tau, "0.05")
        self.u = require_positive("u", u, "0.1745")
        self.power = require_non_negative("power", power, "4")
        self.set_convention(convention, symmetric)
        if self.convention == "reference":
            for key, value, allowed in (("gd", gd, ("margin", "none")), ("w", w, ("softmax", "power", "uniform"))):
                require_reference_option(key, value, allowed, "the code's sg loss")
            if isinstance(self.r, str):
                raise SentembConfigError(
                    f"loss.r={r!r} has no counterpart in the code's sg loss (loss.convention=reference), whose "
                    "ratio is a number. Fix: loss.r=1.0, or loss.convention=paper"
                )

    @torch.no_grad()
    def gradient_dissipation(self, s: torch.Tensor, excluded: torch.Tensor | None = None) -> torch.Tensor:
        if self.gd == "margin":
            return margin_indicator(s, self.m, excluded)
        if self.gd == "infonce":
            logits = s / self.tau
            return torch.sigmoid(negatives_logsumexp(logits, excluded) - logits.diagonal())
        return torch.ones(s.shape[0], dtype=s.dtype, device=s.device)

    @torch.no_grad()
    def weight(self, s: torch.Tensor, excluded: torch.Tensor | None = None) -> torch.Tensor:
        columns = s.shape[1]  # M = N + K candidates with extra negatives
        if self.w == "softmax":
            return negative_softmax(s / self.tau, excluded)
        if self.w == "hardest":
            rows = None if excluded is None else has_negative(s, excluded)
            return one_hot_rows(hardest_negative(s, excluded)[1], columns, s.dtype, rows)
        if self.w == "power":
            return negative_power_weights(s, self.power, excluded=excluded)
        if excluded is None:
            return (~positive_mask(s)).to(s.dtype) / (columns - 1)
        negatives = (~not_negative(s, excluded)).to(s.dtype)
        return negatives / negatives.sum(dim=1, keepdim=True).clamp_min(1.0)  # 1 / (the row's negatives left)

    @torch.no_grad()
    def ratio(self, s: torch.Tensor) -> torch.Tensor:
        positive = s.diagonal()
        if self.r == "arccon":
            theta = safe_arccos(positive)
            return (torch.sin(theta + self.u) / torch.sin(theta))[:, None].expand_as(s)
        if self.r == "met":
            return torch.sqrt((1.0 - s).clamp_min(0.0) / (1.0 - positive).clamp_min(1e-6)[:, None])
        return torch.full_like(s, self.r)

    def directional(self, h1: torch.Tensor, h2: torch.Tensor, excluded: torch.Tensor | None = None) -> LossOutput:
        s = h1 @ h2.T
        gd, weights, ratio = self.gradient_dissipation(s, excluded), self.weight(s, excluded), self.ratio(s)
        per_anchor = gd * (weights * (s - ratio * s.diagonal()[:, None])).sum(dim=1)  # W = 0 on excluded columns

        def stats() -> dict[str, float]:
            return paradigm_stats(s, h1, h2, gd=gd, weights=weights, ratio=ratio, excluded=excluded)

        return LossOutput(per_anchor.mean(), LazyStats(stats, s.device))

    def reference(self, h1: torch.Tensor, h2: torch.Tensor) -> LossOutput:
        weights = "power" if self.w in ("power", "uniform") else "softmax"
        power = 0.0 if self.w == "uniform" else self.power
        loss, parts = sg_loss(
            h1, h2, gd=self.gd == "margin", weights=weights, m=self.m, tau=self.tau, r=self.r, power=power
        )
        d1, d2 = parts["d1"], parts["d2"]
        # the positive term counted from both directions: R_i = r (1 + d'_i k / k'), k = active rows
        parts["ratio"] = self.r * (1 + d2 * d1.sum() / d2.sum().clamp_min(1))
        return with_telemetry(loss, parts, h1, h2)
