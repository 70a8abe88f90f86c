"""The configured Lightning Trainer, and the closing report of a training job (the best checkpoint, rescored)."""

from __future__ import annotations

import logging
import os
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import lightning as L
import torch
from hydra.utils import instantiate
from lightning.pytorch.callbacks import Checkpoint, DeviceStatsMonitor, LearningRateMonitor
from omegaconf import DictConfig

from sentemb.common.errors import SentembConfigError
from sentemb.common.metric_names import (
    BEST_STEP,
    CI_SUFFIXES,
    FINAL_STEP,
    SIZED_PATTERN,
    STSB_DEV,
    TEST_ALIGNMENT,
    TEST_SPEARMAN,
    TEST_UNIFORMITY,
    interval_names,
    sized_metric,
)
from sentemb.encoders.build import encoder_from_checkpoint
from sentemb.encoders.checkpoint import read_checkpoint
from sentemb.eval.cache import EmbeddingCache
from sentemb.eval.similarities import SIMILARITIES_NAME, write_similarities
from sentemb.eval.truncation import size_scores, size_table
from sentemb.losses.matryoshka import Matryoshka
from sentemb.training.callbacks import DEV_TASKS, STSBDevEvaluation
from sentemb.training.checkpoints import (
    ENVIRONMENT,
    best_checkpoint_callback,
    checkpoint_plugins,
    environment_differences,
    run_environment,
)
from sentemb.training.trainer_checks import check_device_count, check_trainer_sizes  # noqa: F401 - importable here as before

log = logging.getLogger(__name__)

# Lightning callbacks that only write to a logger: with none they raise at the first step
NEEDS_A_LOGGER = (LearningRateMonitor, DeviceStatsMonitor)


CPU_FIX = (
    "Fix: trainer=default (or trainer=cpu) on this machine; DDP over CPU processes: "
    "trainer=ddp trainer.accelerator=cpu (gloo)"
)


def check_devices(trainer_cfg: Mapping[str, Any]) -> None:
    """trainer.accelerator and trainer.devices name hardware this machine has; Lightning says so only after the
    model loaded (MisconfigurationException)."""
    accelerator = str(trainer_cfg.get("accelerator") or "auto").lower()
    if accelerator not in ("gpu", "cuda", "mps"):
        return
    cuda, mps = torch.cuda.is_available(), torch.backends.mps.is_available()
    if accelerator == "mps" and not mps:
        raise SentembConfigError(f"trainer.accelerator=mps: this machine has no Apple MPS device. {CPU_FIX}")
    if accelerator in ("gpu", "cuda") and not (cuda or (accelerator == "gpu" and mps)):  # Lightning's gpu: CUDA or MPS
        raise SentembConfigError(
            f"trainer.accelerator={accelerator} (trainer=gpu / trainer=ddp / trainer=fsdp): no CUDA GPU is visible "
            f"here (torch.cuda.is_available() is False{visible_devices_note()}). {CPU_FIX}"
        )
    devices = trainer_cfg.get("devices")
    visible = torch.cuda.device_count() if cuda and accelerator != "mps" else 1
    try:
        wanted = devices_wanted(devices)
    except (TypeError, ValueError):  # not a count nor indices: Lightning's own message names it
        return
    if wanted > visible:
        raise SentembConfigError(
            f"trainer.devices={devices} needs {wanted} {accelerator} devices but {visible} "
            f"{'is' if visible == 1 else 'are'} visible. Fix: trainer.devices={visible} (or trainer.devices=-1: all "
            "visible), or run where that many are (CUDA_VISIBLE_DEVICES selects them)"
        )


# the trainer's sizes sentemb's configs set or a user adds (+trainer.<key>): whole numbers from their low bound, or
def visible_devices_note() -> str:
    """`; CUDA_VISIBLE_DEVICES=...` when that variable is set (it may hide every GPU), else nothing."""
    value = os.environ.get("CUDA_VISIBLE_DEVICES")
    return "" if value is None else f"; CUDA_VISIBLE_DEVICES={value!r}"


def devices_wanted(devices: Any) -> int:
    """How many devices trainer.devices asks for (a list of indices: the highest + 1); 0: any ("auto", -1)."""
    if isinstance(devices, str):
        text = devices.strip()
        if "," in text:
            return devices_wanted([int(part) for part in text.split(",") if part.strip()])
        devices = int(text) if text.lstrip("-").isdigit() else 0
    if isinstance(devices, bool) or devices is None:
        return 0
    if isinstance(devices, int):
        return max(devices, 0)
    indices = [int(index) for index in devices]  # a list of device indices (ListConfig from YAML)
    return max(indices) + 1 if indices else 0


def build_trainer(cfg: DictConfig, extra_callbacks: list[L.Callback] = (), **overrides: Any) -> L.Trainer:
    """The configured Trainer with the configured callbacks and loggers (plus `extra_callbacks`).

    Without a logger (logger=none), callbacks that only write to one (the LR monitor) are left out, with a
    log line. Without a checkpoint callback (callbacks=none), no checkpoint is written at all, and the
    closing report scores the final weights (`report_best`).
    """
    loggers = [instantiate(c) for c in (cfg.get("logger") or {}).values()]
    # `callbacks.<name>=null` removes one, as `~callbacks.<name>` does
    configured = {name: instantiate(node) for name, node in (cfg.get("callbacks") or {}).items() if node is not None}
    if not loggers:
        for name, callback in list(configured.items()):
            if isinstance(callback, NEEDS_A_LOGGER):
                del configured[name]
                log.info(
                    "no logger configured (logger=none): callbacks.%s (%s) is left out, it only writes to a logger",
                    name,
                    type(callback).__name__,
                )
    callbacks = [*extra_callbacks, *configured.values()]
    checkpointing_set = "enable_checkpointing" in {*cfg.trainer, *overrides}
    if not checkpointing_set and not any(isinstance(c, Checkpoint) for c in callbacks):
        # Lightning would add a ModelCheckpoint of the last weights, named like a best one: callbacks=none means none
        overrides["enable_checkpointing"] = False
    if "plugins" not in {*cfg.trainer, *overrides}:  # configured plugins are the user's; the atomic write otherwise
        overrides["plugins"] = checkpoint_plugins()
    trainer = instantiate(cfg.trainer, callbacks=callbacks, logger=loggers or False, **overrides)
    visible = torch.cuda.device_count()
    if visible > 1 and trainer.world_size == 1:
        warnings.warn(
            f"{visible} GPUs are visible but the trainer uses one: pass trainer=ddp trainer.devices={visible} "
            "to train on all of them (negatives are then gathered across GPUs)",
            stacklevel=1,
        )
    # deterministic=True also makes torch NaN-fill every new tensor, a debugging aid that costs ~2% of a
    # CPU step; the algorithms stay the deterministic ones without it
    torch.utils.deterministic.fill_uninitialized_memory = False
    return trainer


def report_best(trainer: L.Trainer, dev_eval: STSBDevEvaluation, output_dir: Path | None = None) -> dict[str, Any]:
    """Reload the best checkpoint, score STS-B dev and test with it (and SICK-R dev under eval.select=sickr_dev),
    log and print them.

    The best checkpoint is the one ModelCheckpoint kept for the dev set eval.select names (`dev_eval.monitor`),
    and the report says which; it must hold the best logged step's weights (`check_kept_step`). Dev is scored by
    the callback's own `dev_spearman` (same sentences, batches, batch size and device), so on the same machine it
    is the logged best to the last bit; a resumed run whose best was logged elsewhere may differ in the last bits,
    and a warning says what differs (`rescore_difference`). Without a
    ModelCheckpoint keeping the best dev score (callbacks=none), the final weights are scored
    instead, and the report says so (`report_final`). Each score has its bootstrap interval (`<name>_ci_low`,
    `<name>_ci_high`), and the cosines they came from go to `<output_dir>/similarities.npz` (sentemb.compare reads
    them).
    """
    checkpoint = best_checkpoint_callback(trainer, dev_eval.monitor)
    if checkpoint is None:
        return report_final(trainer, dev_eval, output_dir)
    selected = dev_eval.selected
    best_path = checkpoint.best_model_path
    if not best_path or dev_eval.selected_best is None:
        raise RuntimeError(
            f"training ended at step {trainer.global_step} without a best checkpoint: no {selected.label} evaluation "
            "ran, so ModelCheckpoint kept nothing"
        )
    saved = read_checkpoint(best_path)
    best_step, logged_dev = dev_eval.selected_best
    check_kept_step(saved.get("global_step"), best_step, best_path, selected.label)
    best, _ = encoder_from_checkpoint(saved, trainer.strategy.root_device)
    metrics = _scores(trainer, best, dev_eval, "best_rescored", BEST_STEP, best_step, output_dir)
    dev = metrics[selected.best_rescored]
    kept_score = checkpoint.best_model_score
    if kept_score is not None and float(kept_score) != logged_dev:
        warnings.warn(
            f"{best_path} was kept for score {float(kept_score)!r}, but the best logged {selected.label} score "
            f"is {logged_dev!r} (step {best_step}): the checkpoint and the log disagree",
            stacklevel=1,
        )
    if dev != logged_dev:
        warnings.warn(
            f"the best checkpoint scores {selected.label} {dev!r} now but {logged_dev!r} was logged at step "
            f"{best_step}: {rescore_difference(saved, trainer.strategy.root_device)}",
            stacklevel=1,
        )
    _log_final(trainer, metrics)
    if trainer.is_global_zero:
        print(final_report(best_step, metrics, dev_eval, best_path))
    return {
        **metrics,
        "best_checkpoint": best_path,
        **dev_eval.logged_bests(),
        "scored_weights": "best",
        "selected_on": dev_eval.select,
    }


def check_kept_step(kept_step: Any, best_step: int, best_path: str, label: str) -> None:
    """The kept best checkpoint holds the weights of the best logged step: else its score would be reported beside
    another step's weights, so the job stops (recorded as failed) rather than report them."""
    if kept_step != best_step:
        raise RuntimeError(
            f"{best_path} holds the weights of step {kept_step}, but the best logged {label} score is step "
            f"{best_step}'s: reporting it would pair one step's score with another's weights, so nothing is reported. "
            f"Score the step you want with python -m sentemb.evaluate checkpoint=<its .ckpt>"
        )


def rescore_difference(saved: Mapping[str, Any], device: torch.device) -> str:
    """Why a checkpoint's dev score now may differ from the one logged when it was kept: what differs between where
    it was scored then (its `environment`) and now, and only that."""
    differences = environment_differences(saved.get(ENVIRONMENT), run_environment(device))
    if differences is None:
        return (
            "the checkpoint does not record where it was scored (written before sentemb recorded it), so the "
            "device, thread count, torch version or CPU kernels may differ from the training run's"
        )
    if differences:
        return f"it is scored elsewhere than when it was kept ({'; '.join(differences)}), which changes the last bits"
    return (
        "on the same device, threads, torch and CPU kernels as when it was kept, so no known cause: please report it "
        "with this run's .hydra/ and log"
    )


def report_final(trainer: L.Trainer, dev_eval: STSBDevEvaluation, output_dir: Path | None = None) -> dict[str, Any]:
    """No best checkpoint was kept: score STS-B dev (and SICK-R dev under eval.select=sickr_dev) and test with the
    final weights (in memory), log and print them.

    The dev evaluation at the last step ran on these same weights, so the final dev score repeats it to
    the last bit (a warning says otherwise). The best dev score logged during training is reported beside
    it, since its weights are gone; `stsb/dev/spearman_best_logged` (what sweeps optimise) stays that logged best.
    """
    step = trainer.global_step
    encoder = trainer.lightning_module.encoder
    metrics = _scores(trainer, encoder, dev_eval, "final", FINAL_STEP, step, output_dir)
    for dev_set in dev_eval.dev_sets:
        dev, logged_final = metrics[dev_set.final], dict(dev_eval.history_of(dev_set)).get(step)
        if logged_final is not None and dev != logged_final:
            warnings.warn(
                f"the final weights score {dev_set.label} {dev!r} now but {logged_final!r} was logged at step {step}",
                stacklevel=1,
            )
    _log_final(trainer, metrics)
    if trainer.is_global_zero:
        print(final_weights_report(step, metrics, dev_eval))
    return {**metrics, "best_checkpoint": None, **dev_eval.logged_bests(), "scored_weights": "final"}


def _scores(
    trainer: L.Trainer, encoder: Any, dev_eval: STSBDevEvaluation, which: str, step_name: str, step: int,
    output_dir: Path | None,
) -> dict[str, float]:  # fmt: skip
    """Every scored dev set (the callback's own computation: STS-B dev, and SICK-R dev when it selects) and the
    test tasks of `encoder`, each with its interval; `which`: which weights they are, as the dev sets' metric
    (`best_rescored`: the best checkpoint, `final`: the final weights), `step_name` their step's metric. Rank 0
    writes the cosines to `<output_dir>/similarities.npz`."""
    metrics: dict[str, float] = {}
    dev_similarities = {}
    for dev_set in dev_eval.dev_sets:
        cosines = dev_similarities[dev_set] = dev_eval.dev_similarities(encoder, dev_set)
        dev = dev_eval.dev_spearman(encoder, cosines, dev_set)["spearman"]
        interval = dev_eval.resampling.spearman(cosines, dev_eval.dev_pairs(dev_set).gold, estimate=dev)
        name = getattr(dev_set, which)
        metrics |= {name: dev, **dict(zip(interval_names(name), (interval.low, interval.high), strict=True))}
    test, similarities = dev_eval.held_out.score(dev_eval.embedder(encoder), dev_eval.batch_size)
    metrics |= sized_scores(trainer, encoder, dev_eval)
    if output_dir is not None and trainer.is_global_zero:
        data = dict(dev_eval.held_out.data)
        for dev_set, cosines in dev_similarities.items():
            task = DEV_TASKS[dev_set]
            data[task] = {**data.get(task, {}), "dev": dev_eval.dev_pairs(dev_set)}
            similarities.setdefault(task, {})["dev"] = cosines
        try:
            write_similarities(Path(output_dir) / SIMILARITIES_NAME, data, similarities)
        except OSError as err:  # a cache for sentemb.compare: the job's scores stand without it
            warnings.warn(
                f"{output_dir}/{SIMILARITIES_NAME} not written ({err}); sentemb.compare re-encodes", stacklevel=1
            )
    return {**metrics, **test, step_name: step}


def trained_sizes_of(module: Any) -> list[int]:
    """The Matryoshka sizes the module's loss trains (matryoshka.dims), largest first; [] without them."""
    return list(module.loss.dims) if isinstance(getattr(module, "loss", None), Matryoshka) else []


def sized_scores(trainer: L.Trainer, encoder: Any, dev_eval: STSBDevEvaluation) -> dict[str, float]:
    """With matryoshka.dims: STS-B dev and test Spearman at every trained size (`stsb/<split>/spearman_dim_<d>`), each
    split encoded once at the full width on its own sentences (as its own score is) and cut per size."""
    sizes = trained_sizes_of(trainer.lightning_module)
    if not sizes:
        return {}
    splits = {"dev": dev_eval.dev_pairs(STSB_DEV), "test": dev_eval.held_out.data["STSBenchmark"]["test"]}
    encoded = {}
    for split, pairs in splits.items():
        cache = EmbeddingCache(encoder, batch_size=dev_eval.batch_size, show_progress=False)
        cache.prefetch(pairs.first + pairs.second)  # this split's sentences only, in the order its own score encodes
        encoded[split] = (cache(pairs.first), cache(pairs.second), pairs.gold)
    scores = size_scores(encoded, sizes)
    return {sized_metric(split, size): value for split, row in scores.items() for size, value in row.items()}


def sizes_report(metrics: dict[str, float]) -> str:
    """The closing report's table of every trained Matryoshka size (none without matryoshka.dims)."""
    sizes = sorted({int(name.rsplit("_", 1)[1]) for name in metrics if SIZED_PATTERN.fullmatch(name)}, reverse=True)
    if not sizes:
        return ""
    rows = {size: {split: metrics[sized_metric(split, size)] for split in ("dev", "test")} for size in sizes}
    table = size_table(rows, {"dev": "STS-B dev Spearman", "test": "STS-B test Spearman"})
    return "\nMatryoshka sizes (the first d dimensions of the scored weights' embeddings):\n" + "\n".join(table)


def _log_final(trainer: L.Trainer, metrics: dict[str, float]) -> None:
    for logger in trainer.loggers:
        logger.log_metrics(metrics, step=trainer.global_step)
        logger.finalize("success")


def final_report(best_step: int, metrics: dict[str, float], dev_eval: STSBDevEvaluation, best_path: str) -> str:
    """The closing lines of a training job; 4 decimals, where batch-neighbour differences would show (~1e-4), each
    score's 95% bootstrap interval in brackets. The first line is the dev set that selected the checkpoint."""
    selected = dev_eval.selected
    logged_dev = dev_eval.selected_best[1]
    lines = [
        f"{selected.label} Spearman (best, step {best_step}): {scored(metrics, selected.best_rescored)}   "
        f"(logged during training: {logged_dev:.4f})"
    ]
    for dev_set in dev_eval.dev_sets:
        if dev_set is not selected:  # scored at the selected step; its own best was logged elsewhere
            step, logged = dev_eval.best_of(dev_set)
            lines.append(
                f"{dev_set.label} Spearman (step {best_step}): {scored(metrics, dev_set.best_rescored)}   "
                f"(best logged during training: {logged:.4f} at step {step})"
            )
    lines.append(f"STS-B test Spearman (best checkpoint):    {scored(metrics, TEST_SPEARMAN)}{geometry(metrics)}")
    return (
        "\n"
        + "\n".join(lines)
        + other_tasks(metrics)
        + sizes_report(metrics)
        + f"\nbest checkpoint: {best_path} (selected on {selected.label}: eval.select={dev_eval.select})\n"
    )


def scored(metrics: dict[str, float], name: str) -> str:
    """`84.6012 [83.12, 85.94]`: a score after training with its 95% bootstrap interval."""
    low, high = (metrics.get(bound) for bound in interval_names(name))
    return f"{metrics[name]:.4f}" + (f" [{low:.2f}, {high:.2f}]" if low is not None else "")


def geometry(metrics: dict[str, float]) -> str:
    """The line of the STS-B test embeddings' alignment and uniformity (Wang & Isola; lower is better), when scored."""
    if TEST_ALIGNMENT not in metrics:
        return ""
    return f"\nSTS-B test alignment {metrics[TEST_ALIGNMENT]:.4f}, uniformity {metrics[TEST_UNIFORMITY]:.4f}"


def other_tasks(metrics: dict[str, float]) -> str:
    """The lines of the eval.test_tasks beyond STS-B."""
    tasks = [name for name in metrics if name.startswith("sts/") and not name.endswith(CI_SUFFIXES)]
    return "".join(f"\n{name.split('/')[1]} test Spearman:    {scored(metrics, name)}" for name in tasks)


def final_weights_report(step: int, metrics: dict[str, float], dev_eval: STSBDevEvaluation) -> str:
    """The closing lines when no best checkpoint was kept: the final weights' scores, and the best only as logged."""
    lines = []
    for dev_set in dev_eval.dev_sets:
        best = dev_eval.best_of(dev_set)
        logged = f"best logged during training: {best[1]:.4f} at step {best[0]}" if best else "no dev score logged"
        lines.append(
            f"{dev_set.label} Spearman (final weights, step {step}): {scored(metrics, dev_set.final)}   ({logged})"
        )
    return (
        "\n"
        + "\n".join(lines)
        + f"\nSTS-B test Spearman (final weights):    {scored(metrics, TEST_SPEARMAN)}{geometry(metrics)}"
        + other_tasks(metrics)
        + sizes_report(metrics)
        + f"\nno checkpoint kept: no ModelCheckpoint monitors {dev_eval.monitor} (callbacks=default keeps the best), "
        "so the final weights were scored, not the best\n"
    )
