"""An Optuna sweep's own figures (hparams_search=optuna): optimisation history, parameter importances, slice.

A sweep is an Optuna study when its jobs ran under Hydra's Optuna sweeper (`hydra.sweeper._target_` in a
job's `.hydra/hydra.yaml`). The study is rebuilt from the sweep's records, the ones its table reads: a
trial per finished job, its params the job's swept values, its value the job's `optimized_metric`, the
distributions the sweeper's search space (`hydra.sweeper.params`, parsed by the sweeper's own parser).
So the figures need neither the study's storage nor its path: a sweep directory copied elsewhere draws them too.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sentemb.common.file_values import Shape, checked, parse_yaml
from sentemb.common.metric_names import DEV_SPEARMAN_BEST_LOGGED, current_name, read_metric
from sentemb.eval.figures import save_figure
from sentemb.runs.job_files import HYDRA_SUBDIR
from sentemb.runs.record import read_records
from sentemb.runs.sweep_figures import four_digits, plain_ticks

OPTUNA_SWEEPER = "hydra_plugins.hydra_optuna_sweeper.optuna_sweeper.OptunaSweeper"
HISTORY, IMPORTANCES, SLICE = "optuna_history.png", "optuna_importances.png", "optuna_slice.png"
UNFINISHED = ("running", "preempted")  # may still finish: not a trial yet
SWEEPER_KEYS = ("_target_", "params", "search_space", "direction")  # what the figures read of the sweeper's config
SWEEPER = Shape(targets=("",))
HYDRA_FILES_FIX = "Fix: restore the jobs' .hydra/ files as Hydra wrote them, or remove them (no Optuna figures then)"


@dataclass(frozen=True)
class OptunaSweep:
    """What the jobs' Hydra config says of their study."""

    search_space: dict[str, Any]  # name → optuna distribution
    direction: str
    objective: str  # the metric each trial returned (optimized_metric), by today's name


def optuna_sweep(records: list[tuple[Path, dict[str, Any]]]) -> OptunaSweep | None:
    """The study the jobs ran in, from the first job's saved Hydra config; None if no job ran under the Optuna
    sweeper (or none saved its config)."""
    job = next((d / HYDRA_SUBDIR for d, _ in records if (d / HYDRA_SUBDIR / "hydra.yaml").is_file()), None)
    if job is None:
        return None
    # parsed, never resolved (the storage is a resolver call that would create its folder); the keys used are checked
    path = job / "hydra.yaml"
    saved = parse_yaml(path, HYDRA_FILES_FIX)
    sweeper = ((saved or {}).get("hydra") or {}).get("sweeper") if isinstance(saved, dict) else None
    if not isinstance(sweeper, dict) or sweeper.get("_target_") != OPTUNA_SWEEPER:
        return None
    sweeper = checked({k: sweeper.get(k) for k in SWEEPER_KEYS}, f"{path} (hydra.sweeper)", SWEEPER, HYDRA_FILES_FIX)
    from hydra_plugins.hydra_optuna_sweeper._impl import (
        create_optuna_distribution_from_config,
        create_params_from_overrides,
    )

    if sweeper.get("params"):  # as the sweeper does: `params` over the older `search_space`
        space, _fixed = create_params_from_overrides([f"{k}={v}" for k, v in sweeper["params"].items()])
    else:
        space = {k: create_optuna_distribution_from_config(v) for k, v in (sweeper.get("search_space") or {}).items()}
    config = job / "config.yaml"
    saved = parse_yaml(config, HYDRA_FILES_FIX) if config.is_file() else None
    objective = checked(saved.get("optimized_metric"), config, fix=HYDRA_FILES_FIX) if isinstance(saved, dict) else None
    direction = sweeper.get("direction") or "minimize"  # the sweeper's own default
    if isinstance(direction, list):  # a one-objective list; main returns one number
        direction = direction[0]
    # a name no metric has could not have been optimised (every trial failed): the default then
    return OptunaSweep(space, str(direction), (objective and current_name(str(objective))) or DEV_SPEARMAN_BEST_LOGGED)


def _external(value: str, distribution: Any) -> Any:
    """A swept value as the sweeper wrote it (`f"{name}={value}"` of the suggested value) → that value."""
    from optuna.distributions import CategoricalDistribution, IntLogUniformDistribution, IntUniformDistribution

    if isinstance(distribution, CategoricalDistribution):
        return next((c for c in distribution.choices if str(c) == value), value)
    if isinstance(distribution, IntUniformDistribution | IntLogUniformDistribution):
        return int(value)
    return float(value)


def build_study(records: list[tuple[Path, dict[str, Any]]], sweep: OptunaSweep) -> tuple[Any, list[str]]:
    """An in-memory study with a trial per finished job (failed and diverged ones as failed trials), and the
    notes on what it leaves out."""
    import optuna

    notes = []
    outside = sorted({k for _, r in records for k in r.get("swept") or {}} - {*sweep.search_space, "seed"})
    if outside:
        notes.append(
            f"{', '.join(f'`{k}`' for k in outside)}: swept, but not in the sweeper's search space "
            "(`hydra.sweeper.params`), so the Optuna figures leave it out."
        )
    study = optuna.create_study(direction=sweep.direction)
    for directory, record in records:
        if record["status"] in UNFINISHED:
            continue
        swept = record.get("swept") or {}
        value = read_metric(record.get("metrics") or {}, sweep.objective) if record["status"] == "ok" else None
        try:
            params = {k: _external(swept[k], d) for k, d in sweep.search_space.items() if k in swept}
            state = optuna.trial.TrialState.COMPLETE if value is not None else optuna.trial.TrialState.FAIL
            trial = optuna.trial.create_trial(
                state=state, value=value, params=params, distributions={k: sweep.search_space[k] for k in params}
            )
        except ValueError as err:  # a value outside the search space: the space changed since that job ran
            notes.append(f"job {directory.name} left out: {err}")
            continue
        study.add_trial(trial)
    return study, notes


def _save(axes: Any, path: Path) -> Path:
    import numpy as np

    figure = np.atleast_1d(axes).flat[0].figure  # plot_slice returns one Axes per parameter
    plain_ticks(figure)
    return save_figure(figure, path, dpi=120, bbox_inches="tight")  # not tight_layout: the slice's colorbar defeats it


def importance_figure(study: Any, path: Path, objective: str) -> Path:
    """Optuna's parameter importances as bars, each with its value.

    Optuna's own figure cannot be used here: optuna 2.x (what the Hydra sweeper allows) calls
    matplotlib.cm.get_cmap in it, which matplotlib 3.9 removed, and its default evaluator (fANOVA) reads
    scikit-learn's trees in their pre-1.3 layout; mean decrease impurity is its other evaluator (a seeded forest).
    """
    import matplotlib.pyplot as plt
    import optuna

    evaluator = optuna.importance.MeanDecreaseImpurityImportanceEvaluator(seed=0)
    importances = optuna.importance.get_param_importances(study, evaluator=evaluator)
    names = list(importances)[::-1]  # the most important on top
    fig, ax = plt.subplots(figsize=(6, 0.45 * len(names) + 1.6))
    ax.barh(names, [importances[n] for n in names])
    for y, name in enumerate(names):
        ax.text(importances[name], y, f" {four_digits(importances[name])}", va="center", fontsize=8)
    ax.set(xlabel=f"importance for {objective} (mean decrease impurity)", title="Hyperparameter importances")
    ax.set_xlim(0, 1.15 * max(importances.values(), default=1) or 1)
    return _save(ax, path)


def importance_obstacle(study: Any, objective: str) -> str | None:
    """Why importances cannot be told apart in this study, or None: they need 2 finished trials that differ in a
    swept value and in the objective (else Optuna raises, or gives every parameter 0)."""
    import optuna

    done = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    varying = any(len({str(t.params.get(p)) for t in done}) > 1 for p in {p for t in done for p in t.params})
    if len(done) < 2 or not varying or len({t.value for t in done}) < 2:
        return (
            f"Parameter importances: not drawn: they need at least 2 finished trials that differ in a swept value "
            f"and in `{objective}`; this study has {len(done)} finished."
        )
    return None


def optuna_report(sweep_dir: Path) -> tuple[list[Path], list[str]] | None:
    """The Optuna figures of a sweep and the lines that explain them (`sweep.md`); None if it is no Optuna study."""
    records = read_records(sweep_dir)
    sweep = optuna_sweep(records)
    if sweep is None:
        return None
    import matplotlib
    import optuna

    verbosity = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(optuna.logging.WARNING)  # not "A new study created in memory" per report
    # Optuna's figures set matplotlib's ggplot style for the whole process: kept to these figures
    with matplotlib.rc_context(), warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)  # create_trial, add_trial, plots
        warnings.filterwarnings("ignore", "Attempting to set identical low and high xlims")  # a one-value slice
        try:
            return _figures(sweep_dir, records, sweep)
        finally:
            optuna.logging.set_verbosity(verbosity)


def _figures(
    sweep_dir: Path, records: list[tuple[Path, dict[str, Any]]], sweep: OptunaSweep
) -> tuple[list[Path], list[str]]:
    import optuna
    from optuna.visualization import matplotlib as optuna_plots

    study, notes = build_study(records, sweep)
    done = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    trials = "trial" if len(done) == 1 else "trials"
    lines = [
        f"{len(done)} finished {trials} of {len(study.trials)}; objective `{sweep.objective}` "
        f"({sweep.direction}); search space: {', '.join(f'`{k}`' for k in sweep.search_space) or 'none'}.",
        *notes,
    ]
    if not done:
        return [], [*lines, "No trial finished: no Optuna figures."]
    history = optuna_plots.plot_optimization_history(study, target_name=sweep.objective)
    written = [_save(history, sweep_dir / HISTORY)]
    if not any(t.params for t in done):
        return written, [*lines, "No swept value is in the search space: no slice or importance figure."]
    written.append(_save(optuna_plots.plot_slice(study, target_name=sweep.objective), sweep_dir / SLICE))
    obstacle = importance_obstacle(study, sweep.objective)
    if obstacle is None:
        written.append(importance_figure(study, sweep_dir / IMPORTANCES, sweep.objective))
    else:
        lines.append(obstacle)
    return written, [*lines, f"Figures: {', '.join(p.name for p in written)}."]
