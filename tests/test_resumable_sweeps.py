"""Sweeps survive interruptions: a re-run into the sweep directory trains only what is left; DDP sweeps run once."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest

from sentemb.runs.record import read_records, write_record
from sentemb.runs.rerun_policy import plan_restart
from tests.test_sweep import TINY_JOB, sweep

GRID = ["loss.tau=0.05,0.1", "seed=1,2"]
# SIGTERM to the sweep process after step 1 of job 2 (the third of four): the sweep stops there
KILL_JOB_2 = ["+callbacks.kill._target_=tests.interruptions.SignalAt", "+callbacks.kill.step=1"]
KILL_JOB_2 += ["+callbacks.kill.job=2"]


def sweep_rows(sweep_dir: Path) -> list[dict[str, str]]:
    """sweep.csv without wall_time_s (a clock reading, never equal between two sweeps)."""
    rows = list(csv.DictReader((sweep_dir / "sweep.csv").open()))
    return [{k: v for k, v in row.items() if k != "wall_time_s"} for row in rows]


@pytest.mark.slow  # multi-process run (CLI subprocesses, sweeps): make test-slow
def test_a_sweep_killed_during_job_3_trains_only_jobs_3_and_4_when_run_again(small_corpus, tmp_path):
    args = [*TINY_JOB, "logger=csv", f"data.corpus={small_corpus}", *GRID]
    full = tmp_path / "full"
    sweep(args, full)

    sweep_dir = tmp_path / "interrupted"
    command = [sys.executable, "-m", "sentemb.train", "-m", *args, *KILL_JOB_2, f"hydra.sweep.dir={sweep_dir}"]
    stopped = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert stopped.returncode == 128 + 15, stopped.stderr[-3000:]
    status = {d.name: r["status"] for d, r in read_records(sweep_dir)}
    assert status == {"0": "ok", "1": "ok", "2": "preempted"}, "job 4 never started"
    finished = {n: (sweep_dir / n / "metrics.json").read_text() for n in ("0", "1")}

    again = sweep([*args, *KILL_JOB_2], sweep_dir)  # the same command
    log = again.stdout + again.stderr
    for n in ("0", "1"):  # not retrained: record untouched, no second log version
        assert (sweep_dir / n / "metrics.json").read_text() == finished[n]
        assert [p.name for p in (sweep_dir / n / "csv").iterdir()] == ["version_0"]
        assert f"{sweep_dir / n}: finished (metrics.json: ok); its record is reused" in log
    resumed = json.loads((sweep_dir / "2" / "metrics.json").read_text())
    assert resumed["status"] == "ok" and resumed["resumed"] == ["preempted"]
    assert f"Restored all states from the checkpoint at {sweep_dir / '2' / 'checkpoints' / 'last.ckpt'}" in log
    assert sorted(p.name for p in (sweep_dir / "2" / "csv").iterdir()) == ["version_0", "version_1"]
    assert [p.name for p in (sweep_dir / "3" / "csv").iterdir()] == ["version_0"]
    assert sweep_rows(sweep_dir) == sweep_rows(full) and len(sweep_rows(full)) == 4


def test_failed_jobs_are_skipped_on_a_rerun_unless_retry_failed(tmp_path):
    overrides = ["loss.tau=0.05"]
    write_record(tmp_path, {"status": "failed", "message": "boom", "metrics": {}, "overrides": overrides})
    plan = plan_restart(tmp_path, overrides, in_sweep=True, retry_failed=False, auto_resume=True)
    assert plan.action == "skip" and "sweep.retry_failed=true" in plan.reason
    assert plan_restart(tmp_path, overrides, in_sweep=True, retry_failed=True, auto_resume=True).action == "fresh"
    assert plan_restart(tmp_path, overrides, in_sweep=False, retry_failed=False, auto_resume=True).action == "fresh"


def test_an_interrupted_job_resumes_only_from_its_own_checkpoint_and_only_if_auto_resume(tmp_path):
    overrides = ["loss.tau=0.05"]
    write_record(tmp_path, {"status": "failed", "message": "interrupted", "interrupted": True, "metrics": {},
                            "overrides": overrides})  # fmt: skip
    plan = plan_restart(tmp_path, overrides, in_sweep=False, retry_failed=False, auto_resume=True)
    assert plan.action == "fresh" and "no " in plan.reason, "no last.ckpt was written: nothing to resume"
    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "checkpoints" / "last.ckpt").write_bytes(b"")
    plan = plan_restart(tmp_path, overrides, in_sweep=False, retry_failed=False, auto_resume=True)
    assert (plan.action, plan.checkpoint) == ("resume", tmp_path / "checkpoints" / "last.ckpt")
    assert plan_restart(tmp_path, overrides, in_sweep=False, retry_failed=False, auto_resume=False).action == "fresh"


def test_a_run_directory_of_another_configuration_is_refused(tmp_path):
    from sentemb.common.errors import SentembConfigError

    write_record(tmp_path, {"status": "ok", "message": "", "metrics": {}, "overrides": ["loss.tau=0.05"]})
    expected = r"belongs to a job run with \['loss.tau=0.05'\], not \['loss.tau=0.1'\]"
    with pytest.raises(SentembConfigError, match=expected):
        plan_restart(tmp_path, ["loss.tau=0.1"], in_sweep=True, retry_failed=False, auto_resume=True)


@pytest.mark.slow  # multi-process run (CLI subprocesses, sweeps): make test-slow
def test_ddp_sweep_launches_once_and_a_job_failing_on_rank_1_only_fails_without_hanging(small_corpus, tmp_path):
    ddp = ["trainer=ddp", "trainer.accelerator=cpu", "trainer.precision=32-true", "trainer.devices=2"]
    fail = ["+callbacks.fail._target_=tests.interruptions.FailOnRank", "+callbacks.fail.rank=1,-1"]
    result = sweep([*TINY_JOB, "logger=csv", f"data.corpus={small_corpus}", "data.batch_size=8", *ddp, *fail],
                   tmp_path / "ddp", timeout=300)  # fmt: skip
    log = result.stdout + result.stderr
    assert log.count("Launching 2 jobs locally") == 1 and log.count("(sweep report in") == 1
    records = {d.name: r for d, r in read_records(tmp_path / "ddp")}
    assert set(records) == {"0", "1"}, "one record per job, in the job's directory"
    assert records["0"]["status"] == "failed"
    assert records["0"]["message"].startswith("RankFailed: rank 1: RuntimeError: made to fail on rank 1 at step 1")
    assert records["1"]["status"] == "ok" and records["1"]["swept"] == {"callbacks.fail.rank": "-1"}
    for job in ("0", "1"):  # each job's two ranks ran in the job's directory, nowhere else
        assert sorted(p.name for p in (tmp_path / "ddp" / job).glob("rank*.log")) == ["rank0.log", "rank1.log"]
    rows = list(csv.DictReader((tmp_path / "ddp" / "sweep.csv").open()))
    assert [r["status"] for r in rows] == ["failed", "ok"]


@pytest.mark.slow  # multi-process run (CLI subprocesses, sweeps): make test-slow
def test_an_interrupted_optuna_study_continues_in_its_sweep_directory(small_corpus, tmp_path):
    import optuna

    args = [*TINY_JOB, "logger=csv", "loss=mmhe", "hparams_search=optuna", f"data.corpus={small_corpus}"]
    kill = ["+callbacks.kill._target_=tests.interruptions.SignalAt", "+callbacks.kill.step=1", "+callbacks.kill.job=1"]
    command = [sys.executable, "-m", "sentemb.train", "-m", *args, *kill, "hydra.sweeper.n_trials=3"]
    stopped = subprocess.run([*command, f"hydra.sweep.dir={tmp_path}"], capture_output=True, text=True, timeout=600)
    assert stopped.returncode == 128 + 15, stopped.stderr[-3000:]
    first = {d.name: r for d, r in read_records(tmp_path)}
    assert sorted(r["status"] for r in first.values()) == ["ok", "preempted"]

    sweep([*args, "hydra.sweeper.n_trials=2"], tmp_path)  # the study goes on: 2 more trials
    study = optuna.load_study(study_name="sentemb", storage=f"sqlite:///{tmp_path / 'optuna.db'}")
    states = [t.state.name for t in study.trials]
    assert len(states) == 4 and states.count("COMPLETE") == 3, states
    records = {d.name: r for d, r in read_records(tmp_path)}
    assert len(records) == 4 and all(records[name] == record for name, record in first.items()), "none overwritten"
