"""SNCSE's soft negatives: each sentence's negation as a third view, and the bidirectional margin loss (BML) on it.

    Δ_i = cos(z_i, z_i^neg) − cos(z_i, z_i⁺)                       (raw cosines, no τ)
    L_BML = (1/B) Σ_i [ ReLU(Δ_i + α) + ReLU(−Δ_i − β) ]             (SNCSE Eq. 5: cos(pos) − cos(neg) ∈ [α, β])
    L = L_loss(z, z⁺) + λ · L_BML

z is the anchor view, z⁺ the positive, z^neg the negation's embedding: the same pooling on the same
training pass (SNCSE's [MASK] state of its prompt; one forward over 3B rows). The negation enters
only this term, never the loss's denominator (SNCSE's released code has that alternative commented
out). Defaults α 0.1, β 0.3; λ 1e-3 for BERT and 5e-4 for RoBERTa (SNCSE's train_SNCSE.sh).
The negations come from `source` (sentemb.data.negation): `rule`, a parser-free approximation of
SNCSE's rule; `spacy`, the rule over spaCy's dependency parse; `file`, JSON lines [sentence, negation]
as SNCSE releases them (`python -m sentemb.negate` writes one).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from sentemb.common.errors import SentembConfigError
from sentemb.common.parts import part

SOURCES = ("rule", "spacy", "file")


def bidirectional_margin(
    anchor: torch.Tensor, positive: torch.Tensor, negation: torch.Tensor, alpha: float, beta: float
) -> torch.Tensor:
    """L_BML of the three views (B, D), in float32 with autocast off (similarities in float32)."""
    with torch.autocast(device_type=anchor.device.type, enabled=False):
        a, p, n = (
            v.float() if v.dtype not in (torch.float32, torch.float64) else v for v in (anchor, positive, negation)
        )
        delta = F.cosine_similarity(a, n, dim=-1) - F.cosine_similarity(a, p, dim=-1)
        return (torch.relu(delta + alpha) + torch.relu(-delta - beta)).mean()


@part("soft_negatives", "sncse")
class SoftNegativeMargin(nn.Module):
    """λ·L_BML as a training term; the data options (`source`, `path`, `lookup_quirk`, `spacy_model`) are read by
    sentemb.data, and kept here so one config node says the whole method."""

    def __init__(
        self,
        alpha: float = 0.1,
        beta: float = 0.3,
        weight: float = 1e-3,
        source: str = "rule",
        path: str | None = None,
        lookup_quirk: bool = False,
        spacy_model: str = "en_core_web_sm",
    ) -> None:
        super().__init__()
        for key, value in (("alpha", alpha), ("beta", beta), ("weight", weight)):
            if not (isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)):
                raise SentembConfigError(
                    f"soft_negatives.{key}={value!r} must be a finite number (SNCSE: α 0.1, β 0.3)"
                )
        if weight < 0:
            raise SentembConfigError(
                f"soft_negatives.weight={weight} must be >= 0 (SNCSE's λ: 1e-3 BERT, 5e-4 RoBERTa)"
            )
        if alpha > beta:  # the band [α, β] of cos(pos) − cos(neg) would be empty: both hinges always push
            raise SentembConfigError(
                f"soft_negatives.alpha={alpha} > soft_negatives.beta={beta}: BML keeps cos(pos) − cos(neg) within "
                "[α, β]. Fix: α ≤ β (SNCSE: α 0.1, β 0.3)"
            )
        if source not in SOURCES:
            raise SentembConfigError(
                f"soft_negatives.source={source!r} is not one of {', '.join(SOURCES)}. Fix: soft_negatives.source=rule "
                "(offline), spacy (the parse-based rule), or file with soft_negatives.path"
            )
        self.alpha, self.beta, self.weight = float(alpha), float(beta), float(weight)

    def term(self, anchor: torch.Tensor, positive: torch.Tensor, negation: torch.Tensor) -> tuple[float, torch.Tensor]:
        """(λ, L_BML): an auxiliary (weight, loss) term of the training step."""
        return self.weight, bidirectional_margin(anchor, positive, negation, self.alpha, self.beta)


def check_soft_negatives(node: Mapping[str, Any] | None) -> None:
    """The soft-negative options and their source (the file read, spaCy importable), before any model loads."""
    if not node:
        return
    from sentemb.data.negation import check_soft_negative_source  # the data layer checks its own source

    options = {key: value for key, value in node.items() if key != "name"}
    SoftNegativeMargin(**options)
    check_soft_negative_source(
        options.get("source", "rule"), options.get("path"), options.get("spacy_model", "en_core_web_sm")
    )
