"""Slow checks (`make test-slow`): the real default job, and multi-process DDP."""

from __future__ import annotations

import csv
import re
import subprocess
import sys
from pathlib import Path

import pytest

from sentemb.common.metric_names import DEV_SPEARMAN, DEV_SPEARMAN_BEST_RESCORED, TEST_SPEARMAN
from sentemb.runs.wandb_runs import finish_wandb
from sentemb.train import train
from tests.conftest import compose_train

pytestmark = pytest.mark.slow


def test_default_job_reaches_the_issue_bar(tmp_path):
    # `make train`: MiniLM, CLS+MLP, InfoNCE, 1 epoch of the 12k sample; issue #2 asks for STS-B dev >= 84.0
    try:
        metrics = train(compose_train(["logger=csv"], output_dir=tmp_path))
    finally:
        finish_wandb()
    assert metrics[DEV_SPEARMAN_BEST_RESCORED] >= 84.0
    assert metrics[TEST_SPEARMAN] >= 77.0


def ddp_job(small_corpus: Path, run_dir: Path, *extra: str) -> subprocess.CompletedProcess:
    command = [
        sys.executable, "-m", "sentemb.train", "model=tiny", "trainer=ddp", "trainer.accelerator=cpu",
        "trainer.devices=2", "trainer.precision=32-true", "trainer.max_steps=3", "logger=csv",
        f"data.corpus={small_corpus}", "data.batch_size=8", "eval.every_n_steps=3", "eval.at_start=false",
        "trainer.log_every_n_steps=1", f"hydra.run.dir={run_dir}", *extra,  # every step's loss is compared
    ]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    return result


def logged_losses(run_dir: Path) -> list[float]:
    rows = csv.DictReader((run_dir / "csv" / "version_0" / "metrics.csv").open())
    return [float(r["train/loss"]) for r in rows if r.get("train/loss")]


def test_ddp_on_two_cpu_processes(small_corpus, tmp_path):
    result = ddp_job(small_corpus, tmp_path)
    assert "STS-B test Spearman" in result.stdout
    # rank 0 scores the best checkpoint with the callback's own computation: the logged figure to the last digit
    printed = re.search(
        r"STS-B dev Spearman \(best, step 3\): (\S+) \[\S+, \S+\]   \(logged during training: (\S+)\)", result.stdout
    )
    assert printed and printed[1] == printed[2], result.stdout[-2000:]
    rows = list(csv.DictReader((tmp_path / "csv" / "version_0" / "metrics.csv").open()))
    assert [int(r["step"]) for r in rows if r.get(DEV_SPEARMAN)] == [3]


def test_ddp_with_grad_cache_follows_plain_ddp(small_corpus, tmp_path):
    # Lightning's DDP wrapper, our backward hook and the chunk replay together: 3 steps, dropout 0
    ddp_job(small_corpus, tmp_path / "plain", "model.dropout=0.0")
    ddp_job(small_corpus, tmp_path / "cached", "model.dropout=0.0", "grad_cache=2")
    plain, cached = logged_losses(tmp_path / "plain"), logged_losses(tmp_path / "cached")
    assert len(plain) == 3
    # chunks of 4 rows vs 16: float32 last bits, carried through 3 AdamW updates (~1e-7); asked: 1e-5
    assert cached == pytest.approx(plain, rel=1e-5)
