"""A weighted sum of configured objectives: ablations, and HiCL's / SARCSE's composite totals.

    L = Σ_t weight_t · L_t(z1, z2)

`terms` maps a label to either an Objective (with `weight` given separately via a mapping
{"weight": w, "objective": obj}) or a mapping {weight, loss: <name>, **fields}: the loss
`name` (default: the label) built from conf/loss/<name>.yaml with those fields overridden.
From the command line:
    python -m sentemb.train loss=sum 'loss.terms={infonce: {weight: 1.0}, mmhe: {weight: 0.5, r: 1.5}}'
Each term's value is returned in `LossOutput.terms` (logged as train/loss/<label>) and its
telemetry under `<label>/<stat>`.
Extra negatives (a momentum queue, `forward(z1, z2, negatives)`) go to every term, so the sum takes
them only if each term does; otherwise it refuses them naming the term (`negatives_refusal`).
Excluded false negatives (`excluded`, DCLR) go to every term the same way: each term removes them as its own
docstring says; L = Σ_t weight_t · L_t(z1, z2, excluded). Labelled hard negatives (triplet data) are extra negatives
placed first; their count (`hard_negatives`) goes to every term whose forward takes it (an InfoNCE term's
hard_negative_weight reads it), so a sum trains on triplets wherever each of its terms takes extra negatives.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf
from torch import nn

from sentemb.common.errors import SentembConfigError
from sentemb.common.parts import part
from sentemb.losses.base import LazyStats, LossOutput, Objective, require_number
from sentemb.losses.registry import build, hard_negative_settings, learning_need, loss_config, negatives_refusal


@part("loss", "sum")
class WeightedSum(Objective):
    def __init__(self, terms: Mapping[str, Any]) -> None:
        super().__init__()
        if isinstance(terms, DictConfig):
            terms = OmegaConf.to_container(terms, resolve=True)
        if not terms:  # None (conf/loss/sum.yaml) or {}
            raise SentembConfigError(
                "loss.terms is empty. Fix: e.g. loss.terms='{infonce: {weight: 1.0}, mmhe: {weight: 0.5}}'"
            )
        self.objectives = nn.ModuleDict()
        self.weights: dict[str, float] = {}
        for label, spec in terms.items():
            self.objectives[label], self.weights[label] = build_term(label, spec)
            if getattr(self.objectives[label], "takes_scores", False):  # the sum passes its terms no scores
                raise SentembConfigError(
                    f"loss.terms.{label}: {type(self.objectives[label]).__name__} learns from scored pairs, and a "
                    f"weighted sum passes its terms no scores. Fix: loss={label} alone, or terms of pairs and negatives"
                )
            if getattr(self.objectives[label], "hard_negative_weight", 0.0) and not takes_keyword(
                self.objectives[label]
            ):
                raise SentembConfigError(  # its weight would never be told which negatives are the labelled ones
                    f"loss.terms.{label}: {type(self.objectives[label]).__name__} has a hard_negative_weight but its "
                    "forward takes no `hard_negatives` count. Fix: add the keyword, or hard_negative_weight=0"
                )

    no_negatives = None  # each term decides (negatives_refusal)

    @classmethod
    def negatives_refusal(cls, config: Mapping[str, Any]) -> str | None:
        """None if every term of `config["terms"]` takes extra negatives, else the first refusing term's reason."""
        terms = config.get("terms") or {}
        if isinstance(terms, DictConfig):
            terms = OmegaConf.to_container(terms, resolve=True)
        for label, spec in terms.items():
            if not isinstance(spec, Mapping):
                continue  # building refuses it with its own message
            if "objective" in spec:  # an already built objective (library use)
                reason = built_refusal(spec["objective"])
            else:  # the term's config as build_term makes it: conf/loss/<name>.yaml with its fields
                fields = {key: value for key, value in spec.items() if key not in ("weight", "loss")}
                reason = negatives_refusal(loss_config(spec.get("loss", label), **fields))
            if reason is not None:
                return term_refusal(label, reason)
        return None

    @classmethod
    def learning_need(cls, config: Mapping[str, Any]) -> str | None:
        """What every term needs (each term's `learning_need`), else None: a term that needs nothing learns."""
        needs = {learning_need(term) for _, term in term_configs(config)}
        return needs.pop() if len(needs) == 1 else None

    @classmethod
    def hard_negative_settings(cls, config: Mapping[str, Any], key: str = "loss") -> list[str]:
        """Each term's settings that act on labelled hard negatives only, as `loss.terms.<label>.<field>=value`."""
        return [
            setting
            for label, term in term_configs(config)
            for setting in hard_negative_settings(term, f"{key}.terms.{label}")
        ]

    def refuses_negatives(self) -> str | None:
        for label, objective in self.objectives.items():
            reason = built_refusal(objective)
            if reason is not None:
                return term_refusal(label, reason)
        return None

    def forward(
        self,
        z1: torch.Tensor,
        z2: torch.Tensor,
        negatives: torch.Tensor | None = None,
        excluded: torch.Tensor | None = None,
        hard_negatives: int = 0,
    ) -> LossOutput:
        # refused here naming the term, before any term runs; `excluded` refused the same way and its shape checked
        self.excluded_negatives(z1, self.extra_negatives(z1, negatives), excluded)
        extra = {} if excluded is None else {"excluded": excluded}
        total, outputs = None, {}
        for label, objective in self.objectives.items():
            # the count of labelled hard negatives (in `negatives` already) only to a term that takes it: one without
            # the keyword scores them as plain negatives, which they are for a loss with no hard_negative_weight
            counted = {"hard_negatives": hard_negatives} if hard_negatives and takes_keyword(objective) else {}
            # a term built elsewhere may take (z1, z2) alone: negatives (and exclusions) are passed only when given
            if negatives is None:
                outputs[label] = output = objective(z1, z2, **extra)
            else:
                outputs[label] = output = objective(z1, z2, negatives, **extra, **counted)
            weighted = self.weights[label] * output.loss
            total = weighted if total is None else total + weighted

        def stats() -> dict[str, float]:  # each term's own telemetry, computed only when this is read
            return {f"{label}/{name}": value for label, out in outputs.items() for name, value in out.stats.items()}

        # detached tensors, not floats: no host synchronisation on steps that do not log them
        values = {label: output.loss.detach() for label, output in outputs.items()}
        return LossOutput(total, LazyStats(stats, total.device), values)


def term_configs(config: Mapping[str, Any]) -> list[tuple[str, Mapping[str, Any]]]:
    """(label, the term's loss config) of each term of a sum's config given as fields (not an objective built
    elsewhere): conf/loss/<name>.yaml with the term's fields, as `build_term` builds it; nothing is built."""
    terms = config.get("terms") or {}
    if isinstance(terms, DictConfig):
        terms = OmegaConf.to_container(terms, resolve=True)
    configs = []
    for label, spec in terms.items():
        if isinstance(spec, Mapping) and "objective" not in spec:
            fields = {key: value for key, value in spec.items() if key not in ("weight", "loss")}
            configs.append((label, loss_config(spec.get("loss", label), **fields)))
    return configs


def takes_keyword(objective: nn.Module, keyword: str = "hard_negatives") -> bool:
    """Whether a term's forward takes `keyword` (every Objective's does; a module of your own may not)."""
    parameters = inspect.signature(objective.forward).parameters
    return keyword in parameters or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values())


def built_refusal(objective: nn.Module) -> str | None:
    """A built term's refusal of extra negatives; a module that is no Objective declares none, so it refuses."""
    refuses = getattr(objective, "refuses_negatives", None)
    if refuses is None:
        return f"{type(objective).__name__} takes no extra negatives: it does not declare them (refuses_negatives)."
    return refuses()


def term_refusal(label: str, reason: str) -> str:
    """The sum's refusal of extra negatives, naming the term that refuses them and its reason."""
    return f"loss=sum takes no extra negatives because its term {label!r} does not: {reason}"


def build_term(label: str, spec: Any) -> tuple[nn.Module, float]:
    if not isinstance(spec, Mapping):
        raise SentembConfigError(f"loss.terms.{label} must be a mapping like {{weight: 1.0}}, got {spec!r}")
    spec = dict(spec)
    weight = spec.pop("weight", None)
    if weight is None:
        raise SentembConfigError(f"loss.terms.{label}.weight is missing. Fix: loss.terms.{label}.weight=1.0")
    weight = require_number(f"loss.terms.{label}.weight", weight, fix=f"loss.terms.{label}.weight=1.0")
    if "objective" in spec:  # an already built objective (library use)
        return spec["objective"], float(weight)
    name = spec.pop("loss", label)
    try:
        return build(name, **spec), float(weight)
    except SentembConfigError as err:
        raise SentembConfigError(f"loss.terms.{label}: {err}") from None
