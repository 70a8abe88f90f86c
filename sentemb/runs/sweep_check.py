"""A sweep checked before its first job: its swept keys exist, its values parse and pass the pre-run checks.

Registered as a Hydra callback for every `python -m sentemb.train` (conf/train.yaml; conf/hparams_search/*.yaml name
the same callback, which merges into one). It checks the sweeper's `hydra.sweeper.params` and the command line's own
sweeps (`-m loss.tau=0.05,0`). Without it a key the composed config lacks (a typo, or `loss.m` under a loss without
m) fails only when the first job starts, with Hydra's advice to append the key (`+loss.m=...`), which then fails in
the loss's constructor; and a value the config cannot take fails its job only after the jobs before it trained,
the sweep exiting 0.
"""

from __future__ import annotations

import copy
import itertools
import sys
from typing import Any

from hydra import compose
from hydra.core.global_hydra import GlobalHydra
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import Glob, IntervalSweep, Override
from hydra.errors import HydraException
from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from sentemb.common.config_fields import pick_advice
from sentemb.common.errors import SentembConfigError
from sentemb.common.hydra_plumbing import compose_config
from sentemb.common.paths import CONF_DIR
from sentemb.training.checks import check_parts

COMMAND_LINE = "the command line"  # the source named for `-m key=a,b` sweeps


def check_sweep(cfg: DictConfig) -> dict[str, list[Any]]:
    """A sweep before its first job: each key swept by `hydra.sweeper.params` or the command line (`-m loss.tau=0.05,0`)
    exists in the composed config, each value parses and passes `check_parts`. A swept config group
    (`loss=infonce,mpt`) is composed once per choice (per combination of choices) and the keys are checked under
    each. Returns {key: its values} (an interval: its two ends)."""
    choices = OmegaConf.select(cfg, "hydra.runtime.choices") or {}
    search = choices.get("hparams_search")
    source = f"hparams_search={search}" if search else "hydra.sweeper.params"
    parser = parser_for_this_run()
    sweeps = [(source, override) for override in sweeper_params(cfg, source, parser)]
    sweeps += [(COMMAND_LINE, override) for override in command_line_sweeps(cfg, parser)]
    values = {override.key_or_group: sweep_values(override, where) for where, override in sweeps}
    groups = {o.key_or_group: values[o.key_or_group] for _, o in sweeps if o.key_or_group in choices}
    keys = [(where, o) for where, o in sweeps if o.key_or_group not in choices]
    label = source if search or any(where == source for where, _ in sweeps) else "the sweep"
    for picked, job in group_choices(cfg, groups, label, parser):
        check_keys_exist(job, keys, picked)
        try:
            check_parts(job)  # e.g. fields a search config sets on the chosen loss
        except SentembConfigError as err:
            jobs = f"the jobs with {picked} would fail: " if picked else ""
            raise SentembConfigError(f"{label}: {jobs}{err}") from None
        for where, override in keys:
            key = override.key_or_group
            for one in values[key] or []:
                trial = copy.deepcopy(job)
                OmegaConf.update(trial, key, one, merge=True, force_add=override.is_add() or override.is_force_add())
                try:
                    check_parts(trial)
                except SentembConfigError as err:
                    raise SentembConfigError(
                        f"{where}: the job with {picked}{' ' if picked else ''}{key}={one} would fail: {err}"
                    ) from None
    return {key: choices_ for key, choices_ in values.items() if choices_ is not None}


def parser_for_this_run() -> OverridesParser:
    """Hydra's override parser; inside a running multirun with its config loader, so `glob(...)` expands."""
    loader = GlobalHydra.instance().config_loader() if GlobalHydra.instance().is_initialized() else None
    return OverridesParser.create(config_loader=loader)


def sweeper_params(cfg: DictConfig, source: str, parser: OverridesParser) -> list[Override]:
    """`hydra.sweeper.params` as Hydra parses them; one that does not parse: a SentembConfigError naming it."""
    overrides = []
    for key, spec in (OmegaConf.select(cfg, "hydra.sweeper.params") or {}).items():
        try:
            overrides.append(parser.parse_override(f"{key}={spec}"))
        except HydraException as err:
            raise SentembConfigError(
                f"{source}: hydra.sweeper.params.{key}={spec} does not parse ({err}). "
                "Fix: a comma list (0.1,0.2), choice(...), range(...) or interval(low, high)"
            ) from None
    return overrides


def command_line_sweeps(cfg: DictConfig, parser: OverridesParser) -> list[Override]:
    """The sweeps among the command line's overrides (`hydra.overrides.task`: `loss.tau=0.05,0`, `loss=a,b`)."""
    task = [str(line) for line in OmegaConf.select(cfg, "hydra.overrides.task") or []]
    return [override for override in parser.parse_overrides(task) if override.is_sweep_override()]


def sweep_values(override: Override, source: str) -> list[Any] | None:
    """The values a swept key or group takes (an interval: its two ends); None where they cannot be listed
    here (`glob(...)` outside a running multirun)."""
    value = override.value()
    if isinstance(value, IntervalSweep):
        return [value.start, value.end]
    if not override.is_sweep_override():
        return [value]
    try:
        return list(override.sweep_iterator())
    except HydraException as err:
        if isinstance(value, Glob):
            return None
        raise SentembConfigError(f"{source}: {override.input_line} cannot be enumerated ({err})") from None


def group_choices(
    cfg: DictConfig, groups: dict[str, list[Any] | None], source: str, parser: OverridesParser
) -> list[tuple[str, DictConfig]]:
    """(`loss=mpt pooling=mean`, that job's composed config) per combination of the swept groups' options
    (a `glob(...)` that cannot be listed here is left to Hydra); no swept group: [("", cfg)]."""
    lists = [[f"{group}={option}" for option in options] for group, options in groups.items() if options]
    if not lists:
        return [("", cfg)]
    task = [str(line) for line in OmegaConf.select(cfg, "hydra.overrides.task") or []]
    fixed = [override.input_line for override in parser.parse_overrides(task) if not override.is_sweep_override()]
    jobs = []
    for combination in itertools.product(*lists):
        picked = " ".join(combination)
        try:
            jobs.append((picked, compose_job(cfg, [*fixed, *combination])))
        except HydraException as err:
            first = str(err).strip().splitlines()[0]
            raise SentembConfigError(
                f"{source}: the jobs with {picked} do not compose ({first}). "
                "Fix: sweep options that exist (conf/<group>/) and keys each of them has"
            ) from None
    return jobs


def compose_job(cfg: DictConfig, overrides: list[str]) -> DictConfig:
    """`overrides` composed as a job of this sweep is (Hydra's runtime config included)."""
    name = str(OmegaConf.select(cfg, "hydra.job.config_name") or "train")
    if GlobalHydra.instance().is_initialized():  # inside the running multirun: its own config search path
        return compose(name, overrides=overrides, return_hydra_config=True)
    return compose_config(CONF_DIR, name, overrides)  # in-process (tests, scripts): conf/ as the command reads it


def check_keys_exist(job: DictConfig, keys: list[tuple[str, Override]], picked: str) -> None:
    """Every swept key (but `+key` appends) is a field of `job`; else named with the options that have it."""
    choices = OmegaConf.select(job, "hydra.runtime.choices") or {}
    for where in dict.fromkeys(where for where, _ in keys):
        swept = [o.key_or_group for w, o in keys if w == where]
        missing = [o.key_or_group for w, o in keys if w == where and not o.is_add() and not o.is_force_add()]
        missing = [key for key in missing if not has_key(job, key)]
        if not missing:
            continue
        group = missing[0].split(".", 1)[0]
        fields = [key.split(".", 1)[1] for key in swept if key.startswith(f"{group}.")]
        lacks = f"{group}={choices[group]}" if choices.get(group) else "the composed config"
        raise SentembConfigError(
            f"{where} sweeps {', '.join(missing)}, which {lacks} does not have"
            f"{f' (the jobs with {picked})' if picked else ''}. "
            f"Fix: {pick_advice(group, fields)} (or an experiment= preset that picks one)"
        )


def has_key(cfg: DictConfig, key: str) -> bool:
    """Whether dotted `key` is a field of `cfg` (its value unresolved: it may interpolate the runtime)."""
    parent, _, leaf = key.rpartition(".")
    node = OmegaConf.select(cfg, parent, throw_on_resolution_failure=False) if parent else cfg
    return isinstance(node, DictConfig) and leaf in node


class SweepCheck(Callback):
    """Hydra callback of every training command (conf/train.yaml): `check_sweep` before a multirun's first job."""

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        try:
            check_sweep(config)
        except SentembConfigError as err:
            sys.exit(f"sentemb: {err}")  # the message says what and how to fix; no traceback, no job started
