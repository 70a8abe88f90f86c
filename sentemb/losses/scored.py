"""Objectives for scored sentence pairs (sentence1, sentence2, score): CoSENT, AnglE and the cosine regression.

Inputs: z1, z2 of shape (N, D), the raw embeddings of each labelled pair's two sentences (row i of z1 with row
i of z2), and `scores`, an (N,) float tensor of the pairs' gold scores, already scaled to [0, 1] by the data (its
declared score range: an STS 0–5 label arrives as label / 5). Each pair is scored on its own; there are no
negatives, so extra negatives (a momentum queue) and excluded false negatives are refused.
Example: `CoSENT(scale=20.0)(z1, z2, scores=scores).loss`.

CoSENT (Su Jianlin, 2022, "CoSENT"; sentence-transformers' CoSENTLoss), with c_i = cos(z1_i, z2_i), λ = `scale`:

    L = log(1 + Σ_{(i, j): s_i > s_j} e^{λ (c_j − c_i)})

AnglE (Li & Li, 2023, "AnglE-optimized Text Embeddings", the angle objective; sentence-transformers' AnglELoss):
the same ranking form with the normalised angle a_i in place of c_i. Each embedding is a complex vector, its first
D/2 dimensions the real parts and its last D/2 the imaginary ones (x = u + iv for z1_i, y = p + iq for z2_i); the
quotient x/y, divided by ‖x‖/‖y‖ (whole-vector norms, as AnglE's public code and sentence-transformers'
`pairwise_angle_sim` divide by Σ_k |y_k|², not by each |y_k|²), summed over its real and imaginary parts:

    re_k = (u_k p_k + v_k q_k) / ‖y‖²,   im_k = (v_k p_k − u_k q_k) / ‖y‖²
    a_i = |Σ_k (re_k + im_k)| / (‖x‖ / ‖y‖) = |Σ_k (u_k p_k + v_k q_k + v_k p_k − u_k q_k)| / (‖x‖ ‖y‖)
    L_angle = log(1 + Σ_{(i, j): s_i > s_j} e^{λ (a_j − a_i)})
    L = angle_weight · L_angle + cosine_weight · L_cos        (L_cos: the CoSENT term above, AnglE's cosine objective)

The right-hand form shows a_i depends on the directions alone, so it is computed on unit vectors. The paper writes
the angle term with Δθ as a difference to be small for similar pairs; its public code (and sentence-transformers)
rank a_i as a similarity, as here. AnglE's in-batch-negatives term L_ibn is not part of this loss (no negatives);
`cosine_weight: 0` is sentence-transformers' AnglELoss exactly. a_i is not symmetric in the two sentences: z1 is the
quotient's numerator.

Cosine regression (sentence-transformers' CosineSimilarityLoss; Reimers & Gurevych, 2019, SBERT's regression
objective): L = (1/N) Σ_i (c_i − s_i)².

CoSENT and AnglE use the scores' order only (which pair ranks above which), so the scaling does not change them;
the regression compares c_i with the score itself. A batch with no pair of pairs in strict order (N < 2, or every
score equal) gives L = log(1 + 0) = 0 with zero gradients; every pair-of-pairs term is masked to −∞ inside one
logsumexp with the 1 as e^0, so no batch needs a host synchronisation to find that out. Similarities are
computed in float32 (float64 stays float64) with autocast off, like every objective's (base.py).
`convention`: only the paper form; these losses have no `convention` or `symmetric` field.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from sentemb.common.parts import part
from sentemb.losses.base import (
    RANKED_SCORES,
    LazyStats,
    LossOutput,
    Objective,
    normalize,
    require_non_negative,
    require_positive,
)
from sentemb.losses.inputs import PAIRS, SCORES, LossInputs

SCORED_DATA = ("data=stsb_train",)  # what a scored loss runs beside: scored pairs (a built-in set of them)


class ScoredPairObjective(Objective):
    """Base class of the losses on scored pairs: they read `scores` (`LossInputs.scores`, or `loss(z1, z2,
    scores=scores)`); subclasses implement `scored(h1, h2, scores)` on unit vectors (float32/float64, autocast off) with
    scores in the same dtype."""

    reads = frozenset({*PAIRS, SCORES})
    no_negatives = "it scores each labelled pair on its own, with no negatives' denominator"
    conventions = ("paper",)  # no `convention` field: the paper form only
    has_symmetric = False

    def scored(self, h1: torch.Tensor, h2: torch.Tensor, scores: torch.Tensor) -> LossOutput:  # pragma: no cover
        raise NotImplementedError

    def check_width(self, z1: torch.Tensor) -> None:
        """A loss that splits the embedding (AnglE) refuses a width it cannot split; the others take any."""

    def check_reads(self, inputs: LossInputs) -> None:
        """Its scores there, one per pair, in [0, 1] (`checked_scores`)."""
        checked_scores(type(self).__name__, inputs.anchors, inputs.scores)

    def compute(self, inputs: LossInputs) -> LossOutput:
        z1, z2 = inputs.anchors, inputs.positives
        self.check_width(z1)
        with torch.autocast(device_type=z1.device.type, enabled=False):
            h1, h2 = normalize(z1), normalize(z2)
            return self.scored(h1, h2, inputs.scores.to(device=h1.device, dtype=h1.dtype))


def checked_scores(owner: str, z1: torch.Tensor, scores: torch.Tensor | None) -> torch.Tensor:
    """`scores` if it is an (N,) floating-point tensor in [0, 1] (N the pairs of `z1`), else a ValueError saying why."""
    if scores is None:
        raise ValueError(
            f"{owner} needs each pair's gold score: call it as loss(z1, z2, scores=scores) with an (N,) float tensor "
            "in [0, 1] (a scored-pairs data set, its scores scaled by its declared range)"
        )
    n = z1.shape[0]
    if not isinstance(scores, torch.Tensor) or not scores.is_floating_point() or tuple(scores.shape) != (n,):
        described = f"{scores.dtype} {tuple(scores.shape)}" if isinstance(scores, torch.Tensor) else type(scores)
        raise ValueError(f"{owner}: scores must be an ({n},) float tensor, one per pair, got {described}")
    # one host synchronisation for both: nan fails every comparison, ±inf is out of [0, 1]
    if not bool(((scores >= 0) & (scores <= 1)).all()):
        low, high, finite = float(scores.min()), float(scores.max()), bool(torch.isfinite(scores).all())
        bad = f"outside [0, 1] (from {low:g} to {high:g})" if finite else "non-finite (nan or inf)"
        raise ValueError(
            f"{owner}: scores are {bad}; they must be finite and already scaled to [0, 1] by the data's declared "
            "score range"
        )
    return scores


def pair_cosines(h1: torch.Tensor, h2: torch.Tensor) -> torch.Tensor:
    """c_i = cos(z1_i, z2_i) from unit vectors: (N,)."""
    return (h1 * h2).sum(dim=1)


def ranking_loss(similarity: torch.Tensor, scores: torch.Tensor, scale: float) -> torch.Tensor:
    """log(1 + Σ_{s_i > s_j} e^{λ (sim_j − sim_i)}), as one logsumexp over [0, the ordered terms] (the 1 is e^0)."""
    differences = scale * (similarity[None, :] - similarity[:, None])  # [i, j] = λ (sim_j − sim_i)
    ordered = scores[:, None] > scores[None, :]  # ties and the diagonal contribute no term
    terms = differences.masked_fill(~ordered, -math.inf).flatten()  # −∞: e^{−∞} = 0, and a zero gradient
    return torch.logsumexp(torch.cat((terms.new_zeros(1), terms)), dim=0)


def batch_mean(values: torch.Tensor) -> float:
    """The mean as a float for telemetry; 0 for an empty batch (the mean of nothing would log nan)."""
    return float(values.mean()) if values.numel() else 0.0


def misordered_share(similarity: torch.Tensor, scores: torch.Tensor) -> float:
    """The share of the strictly ordered pairs of pairs whose similarities rank the other way (0 when none)."""
    ordered = scores[:, None] > scores[None, :]
    wrong = ordered & (similarity[:, None] < similarity[None, :])
    return float(wrong.sum() / ordered.sum()) if bool(ordered.any()) else 0.0


@part("loss", "cosent", companions=SCORED_DATA)
class CoSENT(ScoredPairObjective):
    telemetry = ("pair_cosine_mean", "misordered")
    learns_from = RANKED_SCORES  # every term is a pair of pairs in strict order: none where all scores are equal

    def __init__(self, scale: float = 20.0) -> None:
        super().__init__()
        self.scale = require_positive("scale", scale, "20.0")  # λ = 1/τ: 20 is τ = 0.05

    def scored(self, h1: torch.Tensor, h2: torch.Tensor, scores: torch.Tensor) -> LossOutput:
        cosines = pair_cosines(h1, h2)
        loss = ranking_loss(cosines, scores, self.scale)

        def stats() -> dict[str, Any]:
            return {"pair_cosine_mean": batch_mean(cosines), "misordered": misordered_share(cosines, scores)}

        return LossOutput(loss, LazyStats(stats, h1.device))


def angle_similarity(h1: torch.Tensor, h2: torch.Tensor) -> torch.Tensor:
    """a_i = |Σ_k Re + Im of (x/y)_k| / (‖x‖/‖y‖) from unit vectors (‖x‖ = ‖y‖ = 1): |Σ_k (up + vq + vp − uq)|."""
    u, v = h1.chunk(2, dim=1)  # first half real, second half imaginary
    p, q = h2.chunk(2, dim=1)
    real = u * p + v * q  # Re(x_k · conj(y_k)); divided by ‖y‖² = 1
    imaginary = v * p - u * q  # Im(x_k · conj(y_k))
    return (real + imaginary).sum(dim=1).abs()


@part("loss", "angle", companions=SCORED_DATA)
class AnglE(ScoredPairObjective):
    telemetry = ("pair_cosine_mean", "pair_angle_mean", "misordered")
    learns_from = RANKED_SCORES  # CoSENT's ranking form (above)

    def __init__(self, scale: float = 20.0, cosine_weight: float = 0.0, angle_weight: float = 1.0) -> None:
        super().__init__()
        self.scale = require_positive("scale", scale, "20.0")  # the angle term's λ, and the cosine term's
        self.cosine_weight = require_non_negative("cosine_weight", cosine_weight, "0.0")  # 0: no L_cos
        self.angle_weight = require_non_negative("angle_weight", angle_weight, "1.0")

    @classmethod
    def width_refusal(cls, width: int) -> str | None:
        if width % 2:
            return f"AnglE splits each embedding into real and imaginary halves: D must be even, got D = {width}"
        return None

    def check_width(self, z1: torch.Tensor) -> None:
        refusal = self.width_refusal(z1.shape[1])
        if refusal:
            raise ValueError(f"{refusal}. Fix: a model or head with an even embedding width, or loss=cosent")

    def scored(self, h1: torch.Tensor, h2: torch.Tensor, scores: torch.Tensor) -> LossOutput:
        angles = angle_similarity(h1, h2)
        cosines = pair_cosines(h1, h2)
        angle_term = ranking_loss(angles, scores, self.scale)
        loss = self.angle_weight * angle_term
        terms = {"angle": angle_term.detach()}
        if self.cosine_weight:  # the default 0 computes no L_cos (sentence-transformers' AnglELoss)
            cosine_term = ranking_loss(cosines, scores, self.scale)
            loss = loss + self.cosine_weight * cosine_term
            terms["cosine"] = cosine_term.detach()

        def stats() -> dict[str, Any]:
            return {
                "pair_cosine_mean": batch_mean(cosines),
                "pair_angle_mean": batch_mean(angles),
                "misordered": misordered_share(angles, scores),
            }

        return LossOutput(loss, LazyStats(stats, h1.device), terms)


@part("loss", "cosine_mse", companions=SCORED_DATA)
class CosineMSE(ScoredPairObjective):
    """(1/N) Σ_i (c_i − s_i)²; a single pair (N = 1) is a regression target too, N = 0 gives 0. Equal scores are
    targets too (every cosine pulled to that score), so it learns from any scored rows (`learns_from` None)."""

    telemetry = ("pair_cosine_mean",)

    def scored(self, h1: torch.Tensor, h2: torch.Tensor, scores: torch.Tensor) -> LossOutput:
        cosines = pair_cosines(h1, h2)
        # an empty batch: 0 with gradients, where the mean of no pair would be nan
        loss = (cosines - scores).pow(2).mean() if cosines.numel() else 0.0 * (h1.sum() + h2.sum())

        def stats() -> dict[str, Any]:
            return {"pair_cosine_mean": batch_mean(cosines)}

        return LossOutput(loss, LazyStats(stats, h1.device))
