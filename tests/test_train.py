"""Tiny-model training jobs through the real Trainer, callbacks, loggers and checkpoints."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import pytest
import torch

from sentemb.callbacks import DEV_METRIC
from sentemb.eval.sts import STSBenchmark
from sentemb.module import SentembModule
from sentemb.train import finish_wandb, train
from tests.conftest import compose_train


def run(overrides: list[str], output_dir: Path) -> dict:
    try:
        return train(compose_train(overrides, output_dir=output_dir))
    finally:
        finish_wandb()


def test_tiny_training_run_keeps_the_best_checkpoint(tiny_overrides, tmp_path):
    metrics = run(tiny_overrides, tmp_path)
    best = Path(metrics["best_checkpoint"])
    assert best.is_file() and best.parent == tmp_path / "checkpoints"
    assert len(list(best.parent.glob("*.ckpt"))) == 1, "save_top_k=1 keeps one checkpoint"
    for name in ("stsb/best_dev_spearman", "stsb/test_spearman"):
        assert math.isfinite(metrics[name])
    rows = list(csv.DictReader((tmp_path / "csv" / "version_0" / "metrics.csv").open()))
    dev_steps = [int(r["step"]) for r in rows if r.get(DEV_METRIC)]
    assert dev_steps == [2, 4], "evaluated every 2 steps; the last step (4) is not evaluated twice"
    assert any(r.get("train/loss") for r in rows)


def test_logged_dev_score_equals_offline_evaluation_of_best_checkpoint(tiny_overrides, tmp_path):
    cfg = compose_train(tiny_overrides, output_dir=tmp_path)
    metrics = train(cfg)
    reloaded = SentembModule.load_from_checkpoint(metrics["best_checkpoint"], map_location="cpu", weights_only=False)
    offline = STSBenchmark(Path(cfg.eval.stsb_dir), splits=("dev",)).evaluate(reloaded.encoder)["dev"]["spearman"]
    assert offline == metrics["stsb/dev_spearman_best"]
    assert offline == metrics["stsb/best_dev_spearman"]


def test_evaluation_at_the_last_batch_of_the_epoch(small_corpus, tmp_path):
    # 302 lines, 300 sentences, batch 64: 5 steps; cadence 3 -> evaluations at step 3 and at the end (5)
    overrides = [
        "model=tiny",
        "logger=csv",
        f"data.corpus={small_corpus}",
        "eval.every_n_steps=3",
        "eval.at_start=false",
    ]
    metrics = run(overrides, tmp_path)
    rows = list(csv.DictReader((tmp_path / "csv" / "version_0" / "metrics.csv").open()))
    assert [int(r["step"]) for r in rows if r.get(DEV_METRIC)] == [3, 5]
    assert metrics["stsb/best_step"] in (3, 5)


def test_training_is_deterministic_on_cpu(tiny_overrides, tmp_path):
    first = run(tiny_overrides, tmp_path / "a")
    second = run(tiny_overrides, tmp_path / "b")
    assert first["stsb/test_spearman"] == second["stsb/test_spearman"]
    a = torch.load(first["best_checkpoint"], weights_only=False)["state_dict"]
    b = torch.load(second["best_checkpoint"], weights_only=False)["state_dict"]
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_wandb_offline_run_has_metrics_and_config(tiny_overrides, tmp_path, monkeypatch):
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    overrides = [o for o in tiny_overrides if not o.startswith("logger=")] + ["logger=wandb"]
    metrics = run(overrides, tmp_path)
    runs = list((tmp_path / "wandb").glob("offline-run-*"))
    assert len(runs) == 1, "one offline W&B run per job"
    summary = json.loads((runs[0] / "files" / "wandb-summary.json").read_text())
    assert summary["stsb/test_spearman"] == pytest.approx(metrics["stsb/test_spearman"])
    config = (runs[0] / "files" / "config.yaml").read_text()
    for group in ("model", "pooling", "loss", "data", "trainer", "optimizer", "seed"):
        assert f"\n{group}:" in config, f"the W&B config lacks '{group}'"
