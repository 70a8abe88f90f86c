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

`convention`: `paper` (default) trains on each sentence as given, with its own negation; `reference` builds
the released training's rows (Sense-GVT/SNCSE train_SNCSE.py, prepare_features): " ." appended to a sentence
without final punctuation before its anchor and positive prompts, the released lookup of its negation
(`lookup_quirk`), and the template pieces as that code tokenises them (`SNCSE_REFERENCE_TEMPLATES`, which
`check_config` requires of the pooling).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch
import torch.nn.functional as F

from sentemb.common.errors import SentembConfigError
from sentemb.common.parts import part
from sentemb.encoders.poolings.base import TrainingViews
from sentemb.encoders.poolings.templates import SNCSE_REFERENCE_TEMPLATES
from sentemb.training.auxiliary.base import AuxiliaryTerm

SOURCES = ("rule", "spacy", "file")
CONVENTIONS = ("paper", "reference")
TEMPLATE_KEYS = ("template", "positive_template")  # the prompt pooling's anchor and later views' templates


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


NEGATION = "negation"  # the view SNCSE reads: each sentence's negation (sentemb.data.views makes it)


@part("auxiliary", "sncse")
class SoftNegativeMargin(AuxiliaryTerm):
    """λ·L_BML as a training term on the `negation` view; the data options (`source`, `path`, `lookup_quirk`,
    `spacy_model`, `convention`) are the negation view's (`data_views`), kept here so one config node says the whole
    method. `lookup_quirk` null: the convention's (the released lookup under `reference`, the paper's under
    `paper`)."""

    label = "soft_negative"
    reads = (NEGATION,)

    def __init__(
        self,
        alpha: float = 0.1,
        beta: float = 0.3,
        weight: float = 1e-3,
        source: str = "rule",
        path: str | None = None,
        lookup_quirk: bool | None = None,
        spacy_model: str = "en_core_web_sm",
        convention: str = "paper",
    ) -> None:
        super().__init__()
        for key, value in (("alpha", alpha), ("beta", beta), ("weight", weight)):
            if not (isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)):
                raise SentembConfigError(
                    f"auxiliary.sncse.{key}={value!r} must be a finite number (SNCSE: α 0.1, β 0.3)"
                )
        if weight < 0:
            raise SentembConfigError(
                f"auxiliary.sncse.weight={weight} must be >= 0 (SNCSE's λ: 1e-3 BERT, 5e-4 RoBERTa)"
            )
        if alpha > beta:  # the band [α, β] of cos(pos) − cos(neg) would be empty: both hinges always push
            raise SentembConfigError(
                f"auxiliary.sncse.alpha={alpha} > auxiliary.sncse.beta={beta}: BML keeps cos(pos) − cos(neg) within "
                "[α, β]. Fix: α ≤ β (SNCSE: α 0.1, β 0.3)"
            )
        if source not in SOURCES:
            raise SentembConfigError(
                f"auxiliary.sncse.source={source!r} is not one of {', '.join(SOURCES)}. Fix: "
                "auxiliary.sncse.source=rule (offline), spacy (the parse-based rule), or file with auxiliary.sncse.path"
            )
        if convention not in CONVENTIONS:
            raise SentembConfigError(
                f"auxiliary.sncse.convention={convention!r} is not one of {', '.join(CONVENTIONS)}. Fix: "
                "auxiliary.sncse.convention=paper (or reference: the released training's rows)"
            )
        if lookup_quirk is not None and not isinstance(lookup_quirk, bool):
            raise SentembConfigError(
                f"auxiliary.sncse.lookup_quirk={lookup_quirk!r} must be true, false or null (the convention's)"
            )
        if convention == "reference" and lookup_quirk is False:
            raise SentembConfigError(
                "auxiliary.sncse.lookup_quirk=false with auxiliary.sncse.convention=reference: the released training "
                "always looks negations up its own way. Fix: auxiliary.sncse.lookup_quirk=null, or "
                "auxiliary.sncse.convention=paper"
            )
        self.alpha, self.beta, self.weight = float(alpha), float(beta), float(weight)
        self.convention = convention
        given = {"source": source, "path": path, "lookup_quirk": lookup_quirk, "spacy_model": spacy_model}
        self.negation_options = {**given, "convention": convention}

    def data_views(self) -> dict[str, dict[str, Any]]:
        """The negation view, made from this node's data options."""
        return {NEGATION: dict(self.negation_options)}

    def check_config(self, cfg: Mapping[str, Any]) -> None:
        """The negations' source (the file read, spaCy importable), and under `reference` the pooling's templates
        (`check_reference_pooling`), before any model loads."""
        from sentemb.data.negation import check_soft_negative_source  # the data layer checks its own source

        if self.convention == "reference":
            check_reference_pooling(cfg.get("pooling") or {})
        options = self.negation_options
        check_soft_negative_source(options["source"], options["path"], options["spacy_model"])

    def term(self, views: TrainingViews) -> tuple[float, torch.Tensor]:
        """(λ, L_BML) of the anchor, positive and negation views."""
        negation = views.view(NEGATION, asked_by="auxiliary=sncse")
        return self.weight, bidirectional_margin(views.z1, views.z2, negation, self.alpha, self.beta)


def check_reference_pooling(pooling: Mapping[str, Any]) -> None:
    """auxiliary.sncse.convention=reference embeds the [MASK] state of SNCSE's two prompts, their pieces spaced as its
    training tokenises them (`SNCSE_REFERENCE_TEMPLATES`: the spaces change RoBERTa's tokens, not BERT's)."""
    anchor, positive = SNCSE_REFERENCE_TEMPLATES
    given = (pooling.get("name"), *(pooling.get(key) for key in TEMPLATE_KEYS))
    if given != ("prompt", anchor, positive):
        # as a shell takes them: each override in double quotes, the template's own quotes escaped
        quoted = " ".join(
            f"\"pooling.{key}='{text}'\"".replace(' " ', ' \\" ')
            for key, text in zip(TEMPLATE_KEYS, (anchor, positive), strict=True)
        )
        raise SentembConfigError(
            f"auxiliary.sncse.convention=reference with pooling={given[0]}, pooling.template={given[1]!r}, "
            f"pooling.positive_template={given[2]!r}: the released training embeds the [MASK] state of its prompts, "
            f"tokenised in pieces with a space inside each quote. Fix: pooling=prompt {quoted}, or "
            "auxiliary.sncse.convention=paper"
        )
