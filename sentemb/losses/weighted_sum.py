"""A weighted sum of configured objectives: ablations, and HiCL's / SARCSE's composite totals.

    L = Σ_t weight_t · L_t(z1, z2)

`terms` maps a label to either an Objective (with `weight` given separately via a mapping
{"weight": w, "objective": obj}) or a mapping {weight, loss: <name>, **fields}: the loss
`name` (default: the label) built from conf/loss/<name>.yaml with those fields overridden.
From the command line:
    python -m sentemb.train loss=sum 'loss.terms={infonce: {weight: 1.0}, mmhe: {weight: 0.5, r: 1.5}}'
Each term's value is returned in `LossOutput.terms` (logged as train/loss/<label>) and its
telemetry under `<label>/<stat>`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf
from torch import nn

from sentemb.common.errors import SentembConfigError
from sentemb.common.parts import part
from sentemb.losses.base import LazyStats, LossOutput, Objective
from sentemb.losses.registry import build


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

    def forward(self, z1: torch.Tensor, z2: torch.Tensor) -> LossOutput:
        total, outputs = None, {}
        for label, objective in self.objectives.items():
            outputs[label] = output = objective(z1, z2)
            weighted = self.weights[label] * output.loss
            total = weighted if total is None else total + weighted

        def stats() -> dict[str, float]:  # each term's own telemetry, computed only when this is read
            return {f"{label}/{name}": value for label, out in outputs.items() for name, value in out.stats.items()}

        # detached tensors, not floats: no host synchronisation on steps that do not log them
        values = {label: output.loss.detach() for label, output in outputs.items()}
        return LossOutput(total, LazyStats(stats, total.device), values)


def build_term(label: str, spec: Any) -> tuple[nn.Module, float]:
    if not isinstance(spec, Mapping):
        raise SentembConfigError(f"loss.terms.{label} must be a mapping like {{weight: 1.0}}, got {spec!r}")
    spec = dict(spec)
    weight = spec.pop("weight", None)
    if not isinstance(weight, int | float) or isinstance(weight, bool):
        raise SentembConfigError(
            f"loss.terms.{label}.weight is missing or not a number. Fix: loss.terms.{label}.weight=1.0"
        )
    if "objective" in spec:  # an already built objective (library use)
        return spec["objective"], float(weight)
    name = spec.pop("loss", label)
    try:
        return build(name, **spec), float(weight)
    except SentembConfigError as err:
        raise SentembConfigError(f"loss.terms.{label}: {err}") from None
