"""Tiny-model training jobs through the real Trainer, callbacks, loggers and checkpoints."""

from __future__ import annotations

import contextlib
import csv
import io
import logging
import math
import re
import time
from dataclasses import dataclass
from pathlib import Path

import lightning as L
import numpy as np
import pytest
import torch

import sentemb.train
import sentemb.training.trainer
from sentemb.common.metric_names import (
    BEST_STEP,
    DEV_SPEARMAN,
    DEV_SPEARMAN_BEST_LOGGED,
    DEV_SPEARMAN_BEST_RESCORED,
    DEV_SPEARMAN_FINAL,
    FINAL_STEP,
    TEST_SPEARMAN,
    interval_names,
)
from sentemb.eval.bootstrap import Resampling
from sentemb.eval.sts import STSBenchmark, correlations, read_stsb_split
from sentemb.runs.wandb_runs import finish_wandb
from sentemb.train import train
from sentemb.training.module import SentembModule
from tests.conftest import compose_train, tiny_job, write_small_corpus, write_small_stsb


def run(overrides: list[str], output_dir: Path) -> dict:
    try:
        return train(compose_train(overrides, output_dir=output_dir))
    finally:
        finish_wandb()


def train_with(overrides: list[str], output_dir: Path, *callbacks: L.Callback) -> dict:
    """`run` with `callbacks` added to its Trainer (a run stopped after a step, a capture, a copy of a checkpoint)."""
    build_trainer = sentemb.training.trainer.build_trainer
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(  # train() imports it from its module when it runs
            sentemb.training.trainer,
            "build_trainer",
            lambda cfg, extra_callbacks=(): build_trainer(cfg, [*extra_callbacks, *callbacks]),
        )
        return run(overrides, output_dir)


@dataclass(frozen=True)
class TinyRun:
    overrides: list[str]
    folder: Path
    metrics: dict
    printed: str


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory, data_root) -> TinyRun:
    """`tiny_job` trained once for the tests that only read what it wrote (its metrics, files and printed report): the
    same job each of them ran on its own before, a few seconds each."""
    inputs = tmp_path_factory.mktemp("tiny_inputs")
    overrides = tiny_job(write_small_corpus(inputs, data_root), write_small_stsb(inputs, data_root))
    folder = tmp_path_factory.mktemp("tiny_run")
    with contextlib.redirect_stdout(io.StringIO()) as printed:
        metrics = run(overrides, folder)
    return TinyRun(overrides, folder, metrics, printed.getvalue())


def test_tiny_training_run_keeps_the_best_checkpoint(tiny_run):
    metrics, tmp_path = tiny_run.metrics, tiny_run.folder
    best = Path(metrics["best_checkpoint"])
    assert best.is_file() and best.parent == tmp_path / "checkpoints"
    assert len(list(best.parent.glob("best-*.ckpt"))) == 1, "save_top_k=1 keeps one best checkpoint"
    assert sorted(p.name for p in best.parent.iterdir()) == sorted([best.name, "last.ckpt"]), "no partial files left"
    for name in (DEV_SPEARMAN_BEST_RESCORED, TEST_SPEARMAN):
        assert math.isfinite(metrics[name])
    rows = list(csv.DictReader((tmp_path / "csv" / "version_0" / "metrics.csv").open()))
    dev_steps = [int(r["step"]) for r in rows if r.get(DEV_SPEARMAN)]
    assert dev_steps == [2, 4], "evaluated every 2 steps; the last step (4) is not evaluated twice"
    assert any(r.get("train/loss") for r in rows)


def test_two_views_differ_by_dropout_during_training(tiny_overrides, tmp_path):
    run([*tiny_overrides, "trainer.log_every_n_steps=1"], tmp_path)
    rows = list(csv.DictReader((tmp_path / "csv" / "version_0" / "metrics.csv").open()))
    cos_pos = [float(r["paradigm/cos_pos"]) for r in rows if r.get("paradigm/cos_pos")]
    assert len(cos_pos) == 4 and max(cos_pos) < 0.9999, "dropout must be on in training: the views must differ"


def test_paradigm_telemetry_and_each_term_of_a_sum_are_logged_every_step(tiny_overrides, tmp_path):
    terms = "loss.terms={paradigm: {weight: 1.0, r: met}, mbarlow: {weight: 0.5}}"
    run([*tiny_overrides, "loss=sum", terms], tmp_path)
    rows = [r for r in csv.DictReader((tmp_path / "csv" / "version_0" / "metrics.csv").open()) if r.get("train/loss")]
    assert len(rows) == 4
    for row in rows:
        total = float(row["train/loss"])
        # float32 terms summed by the module vs float64 here; signed terms can cancel a few digits
        assert total == pytest.approx(
            float(row["train/loss/paradigm"]) + 0.5 * float(row["train/loss/mbarlow"]), rel=1e-4
        )
        for term in ("paradigm", "mbarlow"):
            for stat in (
                "gd",
                "hardest_share",
                "ratio",
                "mu_pos",
                "mu_neg",
                "sigma_pos",
                "sigma_neg",
                "alignment",
                "uniformity",
            ):
                assert math.isfinite(float(row[f"paradigm/{term}/{stat}"])), (term, stat)
        assert 0.0 <= float(row["paradigm/paradigm/gd"]) <= 1.0


def test_final_report_repeats_the_logged_dev_score_exactly(tiny_run):
    # issue #9: every comparison here is one computation on bit-identical weights, inputs and batches: exact
    tmp_path, metrics = tiny_run.folder, tiny_run.metrics
    cfg = compose_train(tiny_run.overrides, output_dir=tmp_path)  # the config train(cfg) ran
    logged = metrics[DEV_SPEARMAN_BEST_LOGGED]
    assert metrics[DEV_SPEARMAN_BEST_RESCORED] == logged
    rows = list(csv.DictReader((tmp_path / "csv" / "version_0" / "metrics.csv").open()))
    assert max(float(r[DEV_SPEARMAN]) for r in rows if r.get(DEV_SPEARMAN)) == logged
    assert [float(r[DEV_SPEARMAN_BEST_RESCORED]) for r in rows if r.get(DEV_SPEARMAN_BEST_RESCORED)] == [logged]

    printed = re.search(
        r"STS-B dev Spearman \(best, step (\d+)\): (\S+) \[(\S+), (\S+)\]   \(logged during training: (\S+)\)",
        tiny_run.printed,
    )
    assert printed and int(printed[1]) == metrics[BEST_STEP]
    assert printed[2] == printed[5] == f"{logged:.4f}"
    low, high = (metrics[name] for name in interval_names(DEV_SPEARMAN_BEST_RESCORED))
    assert (printed[3], printed[4]) == (f"{low:.2f}", f"{high:.2f}") and low < logged < high

    # the cosines the scores came from, kept for sentemb.compare: the same numbers again, and the same intervals
    stored = np.load(tmp_path / "similarities.npz", allow_pickle=False)
    test = read_stsb_split(Path(cfg.eval.stsb_dir) / "sts-test.csv")
    assert correlations(stored["cosine/STSBenchmark/test"], test.gold)["spearman"] == metrics[TEST_SPEARMAN]
    interval = Resampling().spearman(stored["cosine/STSBenchmark/dev"], dev_only_gold(cfg))
    assert (interval.low, interval.high) == (low, high)

    reloaded = SentembModule.load_from_checkpoint(metrics["best_checkpoint"], map_location="cpu", weights_only=True)
    dev_only = STSBenchmark(Path(cfg.eval.stsb_dir), splits=("dev",))
    both = STSBenchmark(Path(cfg.eval.stsb_dir), splits=("dev", "test"))
    offline = dev_only.evaluate(reloaded.encoder, batch_size=cfg.eval.batch_size)["dev"]["spearman"]
    assert offline == logged
    # each split is encoded on its own sentences: adding the test split leaves dev's computation unchanged
    assert both.evaluate(reloaded.encoder, batch_size=cfg.eval.batch_size)["dev"]["spearman"] == logged


def dev_only_gold(cfg) -> np.ndarray:
    return read_stsb_split(Path(cfg.eval.stsb_dir) / "sts-dev.csv").gold


def test_final_report_warns_when_the_checkpoint_no_longer_scores_the_logged_dev(tiny_overrides, tmp_path, monkeypatch):
    # e.g. a resumed run whose best was logged on another device: report both numbers, never hide the gap, and name
    # what differs from where the checkpoint was scored (here: the thread count), not a guess
    import sentemb.training.trainer

    load = sentemb.training.trainer.encoder_from_checkpoint
    here = sentemb.training.trainer.run_environment

    def load_on_other_hardware(*args, **kwargs):
        encoder, hparams = load(*args, **kwargs)
        with torch.no_grad():
            encoder.backbone.embeddings.word_embeddings.weight.mul_(1.01)
        return encoder, hparams

    monkeypatch.setattr(sentemb.training.trainer, "encoder_from_checkpoint", load_on_other_hardware)
    monkeypatch.setattr(sentemb.training.trainer, "run_environment", lambda device: {**here(device), "threads": 977})
    with pytest.warns(UserWarning, match="scores STS-B dev .* now but .* was logged at step") as caught:
        metrics = run(tiny_overrides, tmp_path)
    assert metrics[DEV_SPEARMAN_BEST_RESCORED] != metrics[DEV_SPEARMAN_BEST_LOGGED]
    gap = next(str(w.message) for w in caught if "was logged at step" in str(w.message))
    assert f"threads {torch.get_num_threads()} -> 977" in gap and "torch kernel" not in gap


def test_without_a_logger_the_lr_monitor_is_left_out_with_one_log_line(tiny_overrides, tmp_path, caplog):
    # logger=none used to die at the first step: LearningRateMonitor raises without a logger
    overrides = [o for o in tiny_overrides if not o.startswith("logger=")] + ["logger=none"]
    with caplog.at_level(logging.INFO, logger="sentemb.training.trainer"):
        metrics = run(overrides, tmp_path)
    notes = [r.getMessage() for r in caplog.records if r.name == "sentemb.training.trainer"]
    assert len(notes) == 1 and "callbacks.lr_monitor (LearningRateMonitor) is left out" in notes[0]
    assert Path(metrics["best_checkpoint"]).is_file() and math.isfinite(metrics[TEST_SPEARMAN])
    assert not (tmp_path / "csv").exists()


def test_without_a_checkpoint_callback_the_final_weights_are_scored_and_named_so(tiny_overrides, tmp_path, capsys):
    metrics = run([*tiny_overrides, "callbacks=none"], tmp_path)
    assert not list(tmp_path.rglob("*.ckpt")), "callbacks=none writes no checkpoint (none named like a best one)"
    assert metrics["scored_weights"] == "final" and metrics["best_checkpoint"] is None
    rows = list(csv.DictReader((tmp_path / "csv" / "version_0" / "metrics.csv").open()))
    logged = {int(r["step"]): float(r[DEV_SPEARMAN]) for r in rows if r.get(DEV_SPEARMAN)}
    assert sorted(logged) == [2, 4] and metrics[FINAL_STEP] == 4
    # the final weights are the ones evaluated at the last step: the same computation, the same float
    assert metrics[DEV_SPEARMAN_FINAL] == logged[4]
    assert metrics[DEV_SPEARMAN_BEST_LOGGED] == max(logged.values())
    assert DEV_SPEARMAN_BEST_RESCORED not in metrics, "no best weights were scored"
    assert [float(r[DEV_SPEARMAN_FINAL]) for r in rows if r.get(DEV_SPEARMAN_FINAL)] == [logged[4]]
    out = capsys.readouterr().out
    assert f"STS-B dev Spearman (final weights, step 4): {logged[4]:.4f}" in out
    best_step = max(logged, key=logged.get)
    assert f"(best logged during training: {logged[best_step]:.4f} at step {best_step})" in out
    assert f"STS-B test Spearman (final weights):    {metrics[TEST_SPEARMAN]:.4f}" in out
    assert "the final weights were scored, not the best" in out


def test_evaluation_at_the_last_batch_of_the_epoch(small_corpus, small_stsb, tmp_path):
    # 302 lines, 300 sentences, batch 64: 5 steps; cadence 3 -> evaluations at step 3 and at the end (5)
    overrides = [
        "model=tiny",
        "logger=csv",
        f"data.corpus={small_corpus}",
        f"eval.stsb_dir={small_stsb}",  # when it scores, not what: 200 pairs
        "eval.every_n_steps=3",
        "eval.at_start=false",
    ]
    metrics = run(overrides, tmp_path)
    rows = list(csv.DictReader((tmp_path / "csv" / "version_0" / "metrics.csv").open()))
    assert [int(r["step"]) for r in rows if r.get(DEV_SPEARMAN)] == [3, 5]
    assert metrics[BEST_STEP] in (3, 5)


def test_training_is_deterministic_on_cpu(tiny_overrides, tmp_path):
    first = run(tiny_overrides, tmp_path / "a")
    second = run(tiny_overrides, tmp_path / "b")
    # exact: the same job twice in one process (same seed, data order, threads, kernels)
    assert first[TEST_SPEARMAN] == second[TEST_SPEARMAN]
    a = torch.load(first["best_checkpoint"], weights_only=True)["state_dict"]
    b = torch.load(second["best_checkpoint"], weights_only=True)["state_dict"]
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_wandb_offline_run_has_metrics_and_config(tiny_overrides, tmp_path, monkeypatch):
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    overrides = [o for o in tiny_overrides if not o.startswith("logger=")] + ["logger=wandb"]
    metrics = run(overrides, tmp_path)
    logs = list((tmp_path / "wandb").glob("offline-run-*/run-*.wandb"))
    assert len(logs) == 1, "one offline W&B run per job"
    config, history = wait_for_flush(logs[0], TEST_SPEARMAN)
    for group in ("model", "pooling", "loss", "data", "trainer", "optimizer", "eval", "paths", "seed"):
        assert group in config, f"the W&B config lacks '{group}'"
    assert config["loss"]["tau"] == 0.05 and config["data"]["corpus"].endswith("corpus.txt")
    dev_rows = [row for row in history if DEV_SPEARMAN in row]
    assert [row["trainer/global_step"] for row in dev_rows] == [2, 4]
    # exact: the same floats, carried through W&B's log
    assert max(row[DEV_SPEARMAN] for row in dev_rows) == metrics[DEV_SPEARMAN_BEST_LOGGED]
    finals = [row for row in history if TEST_SPEARMAN in row]
    assert finals and finals[-1][TEST_SPEARMAN] == metrics[TEST_SPEARMAN]
    assert any("train/loss" in row for row in history)


def test_wandb_mode_disabled_writes_no_wandb_run(tiny_overrides, tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "disabled")  # the user's word: no W&B at all, not an offline run
    overrides = [o for o in tiny_overrides if not o.startswith("logger=")] + ["logger=wandb", "trainer.max_steps=2"]
    assert compose_train(overrides, tmp_path).logger.wandb.mode == "disabled"
    metrics = run(overrides, tmp_path)
    assert metrics[TEST_SPEARMAN] is not None, "the run trains and is scored as before"
    assert not (tmp_path / "wandb").exists(), "no wandb/ folder, offline run or other"


def wait_for_flush(log: Path, last_metric: str, timeout: float = 30.0) -> tuple[dict, list[dict]]:
    """W&B's service may still be writing the log after wandb.finish() returns: wait for the last metric."""
    # imported here: this module's `run` serves tests/test_gpu.py on GPU machines that have no wandb
    from sentemb.runs.offline_wandb import config_and_history

    deadline = time.monotonic() + timeout
    while True:
        config, history = config_and_history(log)
        if any(last_metric in row for row in history) or time.monotonic() > deadline:
            return config, history
        time.sleep(0.2)


@pytest.mark.slow  # multi-process run (CLI subprocesses, sweeps): make test-slow
def test_multirun_sweep_gives_one_directory_and_wandb_run_per_job(small_corpus, tmp_path):
    import subprocess
    import sys

    command = [
        sys.executable, "-m", "sentemb.train", "-m", "model=tiny", "loss.tau=0.05,0.1",
        f"data.corpus={small_corpus}", "trainer.max_steps=2", "eval.at_start=false", f"hydra.sweep.dir={tmp_path}",
    ]  # fmt: skip
    env = {k: v for k, v in __import__("os").environ.items() if k not in ("WANDB_MODE", "WANDB_API_KEY")}
    subprocess.run(command, check=True, capture_output=True, text=True, env=env)
    for job in ("0", "1"):
        assert len(list((tmp_path / job / "checkpoints").glob("best-*.ckpt"))) == 1
        assert len(list((tmp_path / job / "wandb").glob("offline-run-*"))) == 1
    assert "loss.tau=0.1" in (tmp_path / "1" / ".hydra" / "overrides.yaml").read_text()


def test_pretrained_backbone_trains_with_dropout_on(tmp_path):
    # from_pretrained hands back a model in eval mode; the module must train it with dropout on
    cfg = compose_train(["model=minilm"], output_dir=tmp_path)
    module = SentembModule.from_config(cfg)
    assert all(m.training for m in module.modules())


def test_bf16_mixed_precision_run_is_finite(tiny_overrides, tmp_path):
    # the autocast path of trainer=gpu (fp16) as far as a CPU can take it: bf16 autocast, float32 similarities
    metrics = run([*tiny_overrides, "trainer.precision=bf16-mixed"], tmp_path)
    rows = list(csv.DictReader((tmp_path / "csv" / "version_0" / "metrics.csv").open()))
    assert all(math.isfinite(float(r["train/loss"])) for r in rows if r.get("train/loss"))
    assert math.isfinite(metrics[TEST_SPEARMAN])


@pytest.mark.parametrize("precision", ["32-true", "bf16-mixed"])
def test_a_non_finite_gradient_stops_training_naming_step_and_parameter(
    precision, tiny_overrides, tmp_path, monkeypatch
):
    from sentemb.common.errors import TrainingDiverged

    fit_start = SentembModule.on_fit_start

    def poison_one_gradient(self):  # the loss stays finite, one parameter's gradient does not
        fit_start(self)
        self.encoder.backbone.encoder.layer[0].output.dense.bias.register_hook(lambda grad: grad * float("nan"))

    monkeypatch.setattr(SentembModule, "on_fit_start", poison_one_gradient)
    with pytest.raises(
        TrainingDiverged,
        match=r"step 0: the gradient of encoder\.backbone\.encoder\.layer\.0\.output\.dense\.bias is not finite",
    ):
        run([*tiny_overrides, f"trainer.precision={precision}"], tmp_path)
    assert not list((tmp_path / "checkpoints").glob("*.ckpt")), "no checkpoint of NaN weights"
