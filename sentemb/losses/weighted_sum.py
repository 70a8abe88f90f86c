"""A weighted sum of configured objectives: ablations, and HiCL's / SARCSE's composite totals.

    L = Σ_t weight_t · L_t(z1, z2)

`terms` maps a label to either an Objective (with `weight` given separately via a mapping
{"weight": w, "objective": obj}) or a mapping {weight, loss: <name>, **fields}: the loss
`name` (default: the label) built from conf/loss/<name>.yaml with those fields overridden.
From the command line:
    python -m sentemb.train loss=sum 'loss.terms={infonce: {weight: 1.0}, mmhe: {weight: 0.5, r: 1.5}}'
Each term's value is returned in `LossOutput.terms` (logged as train/loss/<label>) and its
telemetry under `<label>/<stat>`.
A sum is a loss around losses: every term receives the step's whole `LossInputs` (losses/inputs.py), so extra
negatives (a momentum queue), excluded false negatives (DCLR) and labelled hard negatives (an InfoNCE term's
hard_negative_weight reads them) go to each term as its own docstring says. The sum takes them only if each term
does; otherwise it refuses them naming the term (`negatives_refusal`). It reads what its terms read, except scores:
a term of scored pairs is refused (its weight against unscored terms has no reading in the seed papers).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from omegaconf import DictConfig, OmegaConf
from torch import nn

from sentemb.common.errors import SentembConfigError
from sentemb.common.parts import part
from sentemb.losses.base import LazyStats, LossOutput, Objective, require_number
from sentemb.losses.inputs import SCORES, LossInputs
from sentemb.losses.registry import (
    build,
    declared_loss,
    hard_negative_settings,
    learning_need,
    loss_config,
    loss_reads,
    negatives_refusal,
)


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
            if SCORES in self.objectives[label].reads:
                raise SentembConfigError(
                    f"loss.terms.{label}: {type(self.objectives[label]).__name__} learns from scored pairs, which a "
                    f"weighted sum does not take. Fix: loss={label} alone, or terms of pairs and negatives"
                )

    no_negatives = None  # each term decides (negatives_refusal)
    wraps_losses = True

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

    @classmethod
    def reads_of(cls, config: Mapping[str, Any]) -> frozenset[str]:
        """What the sum reads: its terms' roles (a teacher's targets, a term's hard negatives), not scores."""
        return frozenset(cls.reads.union(*(loss_reads(term) for _, term in term_configs(config))))

    @classmethod
    def hard_negatives_refusal(cls, config: Mapping[str, Any]) -> str | None:
        """None if every term takes labelled hard negatives (each term's `hard_negatives_refusal`), else the first
        refusing term's reason."""
        for label, term in term_configs(config):
            reason = declared_loss(term).hard_negatives_refusal(term)
            if reason is not None:
                return f"loss=sum takes no hard negatives because its term {label!r} does not: {reason}"
        return None

    def refuses_hard_negatives(self) -> str | None:
        for label, objective in self.objectives.items():
            reason = objective.refuses_hard_negatives() if isinstance(objective, Objective) else "it is no Objective"
            if reason is not None:
                return f"loss=sum takes no hard negatives because its term {label!r} does not: {reason}"
        return None

    def refuses_negatives(self) -> str | None:
        for label, objective in self.objectives.items():
            reason = built_refusal(objective)
            if reason is not None:
                return term_refusal(label, reason)
        return None

    def offered_telemetry(self) -> tuple[str, ...]:
        """Each term's telemetry under `<label>/`."""
        return tuple(f"{label}/{key}" for label, term in self.objectives.items() for key in term.offered_telemetry())

    def compute(self, inputs: LossInputs) -> LossOutput:
        # the sum's own `accept` has refused what a term refuses, naming the term, before any term runs
        total, outputs = None, {}
        for label, objective in self.objectives.items():
            outputs[label] = output = objective(inputs)
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


def built_refusal(objective: Any) -> str | None:
    """A built term's refusal of extra negatives (its own convention); what is no Objective declares none."""
    if not isinstance(objective, Objective):
        return f"{type(objective).__name__} takes no extra negatives: it is no Objective, which declares them."
    return objective.refuses_negatives()


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
        if not isinstance(spec["objective"], Objective):  # what it reads and takes is declared on an Objective
            raise SentembConfigError(
                f"loss.terms.{label}.objective is a {type(spec['objective']).__name__}, not an Objective. Fix: "
                "subclass sentemb.losses.Objective (its directional(h1, h2), or compute(inputs))"
            )
        return spec["objective"], float(weight)
    name = spec.pop("loss", label)
    try:
        return build(name, **spec), float(weight)
    except SentembConfigError as err:
        raise SentembConfigError(f"loss.terms.{label}: {err}") from None
