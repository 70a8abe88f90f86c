"""Preemption: SIGTERM writes last.ckpt, records `preempted`; the same command resumes to the uninterrupted result."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from sentemb.common.metric_names import BEST_STEP, DEV_SPEARMAN, DEV_SPEARMAN_BEST_RESCORED, TEST_SPEARMAN
from sentemb.runs.offline_wandb import config_and_history, run_id

KILL_AT_3 = ["+callbacks.kill._target_=tests.interruptions.SignalAt", "+callbacks.kill.step=3"]


def train_command(args: list[str], run_dir: Path, expect: int = 0) -> subprocess.CompletedProcess:
    """`python -m sentemb.train ... hydra.run.dir=<run_dir>` as a user (or a requeued SLURM job) runs it."""
    env = {k: v for k, v in os.environ.items() if k not in ("WANDB_MODE", "WANDB_API_KEY")}  # W&B offline
    command = [sys.executable, "-m", "sentemb.train", *args, f"hydra.run.dir={run_dir}"]
    result = subprocess.run(command, capture_output=True, text=True, env=env, timeout=600)
    assert result.returncode == expect, result.stderr[-3000:]
    return result


def losses(run_dir: Path, metric: str = "train/loss") -> dict[int, float]:
    """`metric` by step over every CSV version of the run (a resumed run writes the next version)."""
    out: dict[int, float] = {}
    for version in sorted((run_dir / "csv").glob("version_*")):
        for row in csv.DictReader((version / "metrics.csv").open()):
            if row.get(metric):
                assert int(row["step"]) not in out, f"step {row['step']} logged twice"
                out[int(row["step"])] = float(row[metric])
    return out


def record(run_dir: Path) -> dict:
    return json.loads((run_dir / "metrics.json").read_text())


@pytest.fixture
def job(small_corpus) -> list[str]:
    # 6 steps, mid-epoch, dropout on, dev every 2 steps: SIGTERM after step 3 falls between two dev evaluations;
    # every step logged, since every step's loss is compared
    return ["model=tiny", "logger=[csv,wandb]", f"data.corpus={small_corpus}", "data.batch_size=16",
            "trainer.max_steps=6", "eval.every_n_steps=2", "eval.at_start=false",
            "trainer.log_every_n_steps=1"]  # fmt: skip


def wandb_logs(run_dir: Path) -> list[Path]:
    return sorted(run_dir.glob("wandb/offline-run-*/run-*.wandb"))


def history_steps(log: Path, metric: str, timeout: float = 30.0) -> list[int]:
    """The steps at which `metric` was logged (W&B's service may still be writing after the process ended)."""
    deadline = time.monotonic() + timeout
    while True:
        steps = [row["trainer/global_step"] for row in config_and_history(log)[1] if metric in row]
        if steps or time.monotonic() > deadline:
            return steps
        time.sleep(0.2)


@pytest.mark.slow  # multi-process run (CLI subprocesses, sweeps): make test-slow
def test_sigterm_after_step_3_then_the_same_command_ends_as_the_uninterrupted_run(job, tmp_path):
    full = tmp_path / "full"
    train_command(job, full)

    run = tmp_path / "preempted"
    stopped = train_command([*job, *KILL_AT_3], run, expect=128 + 15)  # SIGTERM's shell status
    assert record(run)["status"] == "preempted" and record(run)["step"] == 3
    assert "SIGTERM at step 3" in record(run)["message"], record(run)
    assert "Traceback" not in stopped.stderr
    checkpoint = torch.load(run / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)
    assert checkpoint["global_step"] == 3, "the checkpoint is the step the signal arrived at, not the last dev step"

    train_command([*job, *KILL_AT_3], run)  # the same command: resumes by itself
    assert record(run)["status"] == "ok" and record(run)["resumed"] == ["preempted"]
    assert sorted(p.name for p in (run / "csv").iterdir()) == ["version_0", "version_1"]
    # the same computation on bit-identical weights, optimizer, data position and RNG: equal, not close
    assert losses(run) == losses(full) and len(losses(full)) == 6
    assert losses(run, DEV_SPEARMAN) == losses(full, DEV_SPEARMAN)
    for key in (DEV_SPEARMAN_BEST_RESCORED, TEST_SPEARMAN, BEST_STEP):
        assert record(run)["metrics"][key] == record(full)["metrics"][key], key

    # W&B: the resumed process continued the same run, from step 4 on
    before, after = wandb_logs(run)
    assert run_id(before) == run_id(after) == (run / "checkpoints" / "wandb_run_id").read_text().strip()
    assert history_steps(before, "train/loss") == [0, 1, 2] and history_steps(after, "train/loss") == [3, 4, 5]


@pytest.mark.slow  # multi-process run (CLI subprocesses, sweeps): make test-slow
def test_a_truncated_last_checkpoint_is_refused_naming_the_previous_good_one(job, tmp_path):
    run = tmp_path / "preempted"
    train_command([*job, *KILL_AT_3, "logger=csv"], run, expect=128 + 15)
    last = run / "checkpoints" / "last.ckpt"
    data = last.read_bytes()
    last.write_bytes(data[: len(data) // 2])  # what a node failure during a (non-atomic) copy leaves
    before = sorted(p.name for p in run.rglob("*"))

    result = train_command([*job, *KILL_AT_3, "logger=csv"], run, expect=1)
    message = result.stderr.strip().splitlines()[-1]
    assert message.startswith(f"sentemb: {last} is truncated or corrupt"), message
    assert f"the previous good checkpoint is {run / 'checkpoints' / 'best-step2.ckpt'}" in message
    assert "Nothing was deleted" in message and "Traceback" not in result.stderr
    assert sorted(p.name for p in run.rglob("*")) == before and record(run)["status"] == "preempted"
