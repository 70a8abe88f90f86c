"""RankCSE's ranking-consistency term (Liu et al., ACL 2023, RankCSE §3.2): the two dropout views should rank the
batch alike. With s = cos(h_i, h'_j) (N×N, anchors against positives) and τ the students' temperature (--temp),

    p_i = softmax_j(s_ij / τ)            (rankcse/models.py line 289: z1_z2_cos = cos_sim, cos(z1, z2ᵀ)/temp)
    q_i = softmax_j(s_ji / τ)            (line 290: z2_z1_cos = cos(z2, z1ᵀ)/temp, the transpose)
    L   = (1/N) Σ_i JSD(p_i ‖ q_i),  JSD(p‖q) = ½ KL(p‖m) + ½ KL(q‖m),  m = ½(p + q)        (form: js, the paper's)

`form: released` is the community release's arithmetic (perceptiveshawty/RankCSE at 17c5226, rankcse/models.py
lines 48-61, class Divergence, called at line 291): p and q clamped at 1e-7, then

    m̃ = clamp(log ½(p + q), min=1e-7),   L = ½ [KLDivLoss(m̃, log p) + KLDivLoss(m̃, log q)]   (batchmean, log_target)

A log is ≤ 0, so the clamp makes m̃ the constant 1e-7 everywhere (no gradient flows through it) and the released term
is ½ (1/N) Σ_i Σ_j (p log p + q log q) − 1e-7 ·(Σ p + Σ q)/(2N): minus the mean entropy of the two lists, which it
maximises, not a divergence (tests/test_rank_consistency.py measures it). Its `beta_` (line 56) is stored and never
read in forward, so the release weighs the term 1 whatever --beta_ says; here a sum's term weight scales it.

What it reads: the anchors and positives only (the release's lists are z1·z2ᵀ; with a third view its code would crash
on shape, line 291: cos_sim is N×2N, z2_z1_cos N×N). Labelled hard negatives are taken and left out of both lists, so
the term is the same with or without them; a negatives part's extra rows (a queue, noise) belong to neither view's
list and are refused. Under DDP it reads the gathered batch, like every loss (training/module.py `global_loss`). A
trailing batch of one row has a one-element list on both sides: 0, with no gradient (as `Objective.compute`).
Similarities in float32 with autocast off (float64 stays float64).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch
import torch.nn.functional as F

from sentemb.common.errors import SentembConfigError
from sentemb.common.parts import part
from sentemb.losses.base import LazyStats, LossOutput, Objective, normalize, require_choice, require_positive
from sentemb.losses.inputs import LossInputs

FORMS = ("js", "released")
RELEASED_EPS = 1e-7  # rankcse/models.py line 55 (`self.eps`, the log clamp) and line 291 (the softmax clamp)


def view_lists(z1: torch.Tensor, z2: torch.Tensor, tau: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(N, N) logits of the two lists: row i of the first is cos(z1_i, z2_j)/τ, of the second cos(z2_i, z1_j)/τ."""
    h1 = normalize(z1)
    s = h1 @ normalize(z2).to(h1.dtype).T / tau  # line 264's cos_sim: nn.CosineSimilarity / temp
    return s, s.T


def jensen_shannon(log_p: torch.Tensor, log_q: torch.Tensor) -> torch.Tensor:
    """(N,) JSD(p_i ‖ q_i) from log-probabilities (natural log). No log of a probability is taken: log m is
    logaddexp(log p, log q) − log 2, finite wherever log p and log q are, so nothing needs a clamp."""
    log_m = torch.logaddexp(log_p, log_q) - math.log(2.0)
    kl_pm = (log_p.exp() * (log_p - log_m)).sum(dim=1)
    kl_qm = (log_q.exp() * (log_q - log_m)).sum(dim=1)
    return 0.5 * (kl_pm + kl_qm)


def released_divergence(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """rankcse/models.py lines 59-61 (Divergence.forward), p and q already clamped (line 291)."""
    m = (0.5 * (p + q)).log().clamp(min=RELEASED_EPS)  # line 60: the clamp of a log (≤ 0): m ≡ 1e-7
    # line 54: KLDivLoss(reduction='batchmean', log_target=True)(input=m, target=log p) = Σ p (log p − m) / N
    kl_p = F.kl_div(m, p.log(), reduction="batchmean", log_target=True)
    kl_q = F.kl_div(m, q.log(), reduction="batchmean", log_target=True)
    return 0.5 * (kl_p + kl_q)


@part("loss", "rank_consistency")
class RankConsistency(Objective):
    """RankCSE's ranking consistency between the two views' in-batch similarity lists (module docstring): the paper's
    Jensen-Shannon divergence (`form: js`) or the release's arithmetic (`form: released`, an entropy term)."""

    no_negatives = (
        "its two lists are the views' own in-batch similarities (RankCSE's cos(z1, z2ᵀ) and cos(z2, z1ᵀ)), and an "
        "extra row belongs to neither view"
    )
    conventions = ("paper",)  # `form` chooses between the paper and RankCSE's release; the paradigm code has no term
    has_symmetric = False  # JSD is symmetric in the two views already
    telemetry = ("jsd", "entropy")

    def __init__(self, tau: float = 0.05, form: str = "js", convention: str = "paper") -> None:
        super().__init__()
        self.tau = require_positive("tau", tau, "0.05")
        self.form = require_choice("form", form, FORMS)
        if convention != "paper":
            raise SentembConfigError(
                f"loss.convention={convention!r}: loss.convention names the paradigm paper's public code, which has no "
                "ranking-consistency term. Fix: loss.convention=paper (RankCSE's release is loss.form=released)"
            )
        self.set_convention(convention, False)

    @classmethod
    def hard_negatives_refusal(cls, config: Mapping[str, Any]) -> str | None:
        return None  # taken and left out of both lists (module docstring)

    def refuses_hard_negatives(self) -> str | None:
        return None

    def compute(self, inputs: LossInputs) -> LossOutput:
        z1, z2 = inputs.anchors, inputs.positives
        if z1.shape[0] < 2:  # a one-element list on both sides: nothing to rank
            return LossOutput(0.0 * (z1.sum() + z2.sum()).float())
        with torch.autocast(device_type=z1.device.type, enabled=False):
            forward, backward = view_lists(z1, z2, self.tau)
            log_p, log_q = forward.log_softmax(dim=1), backward.log_softmax(dim=1)
            if self.form == "js":
                loss = jensen_shannon(log_p, log_q).mean()
            else:  # line 291: softmax, then clamp(min=1e-7), handed to Divergence
                p = forward.softmax(dim=1).clamp(min=RELEASED_EPS)
                q = backward.softmax(dim=1).clamp(min=RELEASED_EPS)
                loss = released_divergence(p, q)

        def stats() -> dict[str, float]:  # the paper's divergence and the lists' mean entropy, whichever form trains
            entropy = -0.5 * ((log_p.exp() * log_p).sum(dim=1) + (log_q.exp() * log_q).sum(dim=1))
            return {"jsd": float(jensen_shannon(log_p, log_q).mean()), "entropy": float(entropy.mean())}

        return LossOutput(loss, LazyStats(stats, z1.device))
