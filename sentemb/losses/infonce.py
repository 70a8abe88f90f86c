"""InfoNCE, the loss of unsupervised SimCSE.

    L_i = −log e^{s_ii/τ} / Σ_j e^{s_ij/τ}                      (paradigm paper Eq. 1 context; SimCSE Eq. 1)
    ∂L_i/∂h_i = Σ_{j≠i} e^{s_ij/τ}(h'_j − h'_i) / (τ Σ_k e^{s_ik/τ})                              (Eq. 1)

Paradigm components (Table 1): GD = 1/(1 + e^{s_ii/τ}/Σ_{k≠i} e^{s_ik/τ}), W = softmax over
negatives, R = 1. Inputs: z1, z2 of shape (N, D), two dropout views of the same N sentences; the
other N−1 sentences are the negatives. Reference: Oord et al. 2018; Gao et al., SimCSE (2021).
Example: `InfoNCE(tau=0.05)(z1, z2).loss`.
Extra negatives (ESimCSE's momentum queue, `InfoNCE()(z1, z2, queue)`) are extra columns of the same τ
(ESimCSE Eq.: Σ_j e^{s_ij/τ} + Σ_{k∈Q} e^{h_i·q_k/τ}); under `reference` too (the same computation).
Labelled hard negatives (supervised SimCSE, Gao et al. 2021 Eq. 5) are extra columns the same way; with
`hard_negative_weight` w, anchor i's own hard negative's logit is s/τ + w (SimCSE's released code, its `z3_weight`).
Excluded false negatives (`excluded`, DCLR) leave the denominator: logit −∞, the 0 weight of DCLR's weighted
InfoNCE (DCLR Eq. 6, −log e^{s_ii/τ} / Σ_j α_ij e^{s_ij/τ}, α_ij = 0 for a false negative).

`convention: reference` (the paper's public code, isotropy/models.py `_i_forward`, branch
`infonce`): cross-entropy of the cosine matrix over temp, one direction: the same computation.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from sentemb.common.errors import SentembConfigError
from sentemb.common.parts import part
from sentemb.losses.base import IN_BATCH_NEGATIVES, LazyStats, LossOutput, Objective, require_finite, require_positive
from sentemb.losses.geometry import WEIGHTED_TELEMETRY, negative_softmax, negatives_logsumexp, paradigm_stats
from sentemb.losses.inputs import LossInputs


@part("loss", "infonce")
class InfoNCE(Objective):
    no_negatives = None
    learns_from = IN_BATCH_NEGATIVES  # exactly 0 where every other candidate is masked as a duplicate
    hard_negative_fields = ("hard_negative_weight",)
    telemetry = WEIGHTED_TELEMETRY

    def __init__(
        self, tau: float = 0.05, symmetric: bool = False, convention: str = "paper", hard_negative_weight: float = 0.0
    ) -> None:
        super().__init__()
        self.tau = require_positive("tau", tau, "0.05")
        self.set_convention(convention, symmetric)
        # supervised SimCSE's weight on each anchor's own hard negative (its logit + w; 0 in its released runs)
        self.hard_negative_weight = require_finite("hard_negative_weight", hard_negative_weight, "0.0")
        if self.hard_negative_weight and self.convention == "reference":
            raise SentembConfigError(
                "loss.hard_negative_weight with loss.convention=reference: the paradigm paper's public code has no "
                "labelled hard negatives. Fix: loss.convention=paper, or loss.hard_negative_weight=0"
            )

    def logit_bias(self, inputs: LossInputs, h1: torch.Tensor) -> dict[str, torch.Tensor]:
        """Supervised SimCSE's w on each anchor's own hard negative's logit (its released code's `z3_weight`)."""
        if not self.hard_negative_weight or not inputs.hard_negatives:
            return {}
        return {"bias": inputs.own_hard_negative_bias(self.hard_negative_weight, h1)}

    def directional(
        self,
        h1: torch.Tensor,
        h2: torch.Tensor,
        excluded: torch.Tensor | None = None,
        bias: torch.Tensor | None = None,
    ) -> LossOutput:
        s = h1 @ h2.T  # N×M: column i is anchor i's positive, the rest (queue included) negatives
        logits = s / self.tau
        if bias is not None:  # supervised SimCSE: log(e^w·e^{s/τ}) for an anchor's own hard negative
            logits = logits + bias
        if excluded is not None:  # out of the denominator
            logits = logits.masked_fill(excluded, -math.inf)
        loss = F.cross_entropy(logits, torch.arange(s.shape[0], device=s.device))

        def stats() -> dict[str, float]:
            gd = torch.sigmoid(negatives_logsumexp(logits) - logits.diagonal())  # 1/(1 + e^{s_ii/τ}/Σ_{k≠i})
            weights = negative_softmax(logits, excluded)
            return paradigm_stats(s, h1, h2, gd=gd, weights=weights, ratio=1.0, excluded=excluded)

        return LossOutput(loss, LazyStats(stats, s.device))
