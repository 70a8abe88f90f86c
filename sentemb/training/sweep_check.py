"""A sweep config checked before its first job: its swept keys exist, its values parse and pass the pre-run checks.

Registered as a Hydra callback by conf/hparams_search/*.yaml. Without it a key the composed config lacks (a typo,
or `loss.m` under a loss without m) fails only when the first job starts, with Hydra's advice to append the key
(`+loss.m=...`), which then fails in the loss's constructor.
"""

from __future__ import annotations

import copy
import sys
from typing import Any

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import IntervalSweep
from hydra.errors import HydraException
from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from sentemb.common.config_fields import pick_advice
from sentemb.common.errors import SentembConfigError
from sentemb.training.checks import check_parts


def check_sweep(cfg: DictConfig) -> dict[str, list[Any]]:
    """A sweep's `hydra.sweeper.params` before its first job: each swept key exists in the composed config,
    each value parses and passes `check_parts`. Returns {key: its values} (an interval: its two ends)."""
    params = OmegaConf.select(cfg, "hydra.sweeper.params") or {}
    choices = OmegaConf.select(cfg, "hydra.runtime.choices") or {}
    search = choices.get("hparams_search")
    source = f"hparams_search={search}" if search else "hydra.sweeper.params"
    missing = [str(key) for key in params if not has_key(cfg, str(key))]
    if missing:
        group = missing[0].split(".", 1)[0]
        swept = [str(key).split(".", 1)[1] for key in params if str(key).startswith(f"{group}.")]
        lacks = f"{group}={choices[group]}" if choices.get(group) else "the composed config"
        raise SentembConfigError(
            f"{source} sweeps {', '.join(missing)}, which {lacks} does not have. "
            f"Fix: {pick_advice(group, swept)} (or an experiment= preset that picks one)"
        )
    try:
        check_parts(cfg)  # e.g. fields a search config sets on the chosen loss
    except SentembConfigError as err:
        raise SentembConfigError(f"{source}: {err}") from None
    parser = OverridesParser.create()
    values: dict[str, list[Any]] = {}
    for key, spec in params.items():
        try:
            override = parser.parse_override(f"{key}={spec}")
            value = override.value()
            values[str(key)] = (
                [value.start, value.end]
                if isinstance(value, IntervalSweep)
                else list(override.sweep_iterator())
                if override.is_sweep_override()
                else [value]
            )
        except HydraException as err:
            raise SentembConfigError(
                f"{source}: hydra.sweeper.params.{key}={spec} does not parse ({err}). "
                "Fix: a comma list (0.1,0.2), choice(...), range(...) or interval(low, high)"
            ) from None
        for one in values[str(key)]:
            trial = copy.deepcopy(cfg)
            OmegaConf.update(trial, str(key), one, merge=True)
            try:
                check_parts(trial)
            except SentembConfigError as err:
                raise SentembConfigError(f"{source}: the job with {key}={one} would fail: {err}") from None
    return values


def has_key(cfg: DictConfig, key: str) -> bool:
    """Whether dotted `key` is a field of `cfg` (its value unresolved: it may interpolate the runtime)."""
    parent, _, leaf = key.rpartition(".")
    node = OmegaConf.select(cfg, parent, throw_on_resolution_failure=False) if parent else cfg
    return isinstance(node, DictConfig) and leaf in node


class SweepCheck(Callback):
    """Hydra callback of the conf/hparams_search/ configs: `check_sweep` before the first job is launched."""

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        try:
            check_sweep(config)
        except SentembConfigError as err:
            sys.exit(f"sentemb: {err}")  # the message says what and how to fix; no traceback, no job started
