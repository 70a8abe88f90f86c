"""A run folder is written only by a job that runs: a refused or skipped command changes no byte of it.

Hydra would save .hydra/ and open `<job name>.log` before the job decides (sentemb.runs.rerun_policy);
conf/train.yaml turns both off and sentemb.runs.job_files writes them once the job is accepted. The fast
tests call the real `python -m sentemb.train` entry point (Hydra's machinery) in this process.
"""

from __future__ import annotations

import copy
import logging
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from hydra.core.hydra_config import HydraConfig
from omegaconf import open_dict, read_write

import sentemb.runs.lifecycle
import sentemb.train
from sentemb.common.metric_names import DEV_SPEARMAN_BEST_LOGGED
from sentemb.runs.job_files import save_hydra_files
from sentemb.runs.lifecycle import optimized_metric
from sentemb.runs.record import read_record, write_record
from tests.conftest import compose_train, tree

FINISHED = ["model=tiny", "logger=csv", "trainer.max_steps=2"]


@pytest.fixture
def finished_run(tmp_path: Path) -> Path:
    """A finished run's folder as a real one looks (record ok, .hydra/, log, checkpoints), made by hand; its record
    holds a metric under its name before the metric-name scheme (stsb/dev_spearman_best), as old runs do."""
    run = tmp_path / "run"
    write_record(
        run, {"status": "ok", "message": "", "metrics": {"stsb/dev_spearman_best": 0.5}, "overrides": FINISHED}
    )
    (run / ".hydra").mkdir()
    for name in ("config.yaml", "hydra.yaml", "overrides.yaml"):
        (run / ".hydra" / name).write_text(f"# the finished run's {name}\n")
    (run / "train.log").write_text("[...][sentemb.training.callbacks][INFO] - step 2: STS-B dev Spearman 50.00\n")
    (run / "checkpoints").mkdir()
    (run / "checkpoints" / "last.ckpt").write_bytes(b"weights")
    return run


def test_a_refused_command_changes_no_byte_of_a_finished_run(cli, finished_run):
    before = tree(finished_run)
    other = ["model=tiny", "logger=csv", "trainer.max_steps=3", f"hydra.run.dir={finished_run}"]
    with pytest.raises(SystemExit, match=r"metrics.json belongs to a job run with .*Fix: "):
        cli(other)
    assert tree(finished_run) == before, "no .hydra/ file rewritten, no line appended to train.log, nothing added"


def test_a_repeated_command_skips_the_finished_run_and_changes_no_byte(cli, finished_run, fake_training, capsys):
    before = tree(finished_run)
    cli([*FINISHED, f"hydra.run.dir={finished_run}"])
    assert tree(finished_run) == before
    assert "finished (metrics.json: ok); its record is reused" in capsys.readouterr().out  # Hydra's console log


def test_a_skipped_old_record_gives_its_optimized_metric_by_todays_name(finished_run, tmp_path):
    cfg = compose_train(FINISHED, tmp_path / "new")
    assert cfg.optimized_metric == DEV_SPEARMAN_BEST_LOGGED  # the default names it by today's name
    assert optimized_metric(read_record(finished_run)["metrics"], cfg) == 0.5


def test_an_accepted_job_writes_hydras_files_and_its_log(cli, tmp_path, fake_training):
    cli([*FINISHED, f"hydra.run.dir={tmp_path}"])
    assert sorted(p.name for p in (tmp_path / ".hydra").iterdir()) == ["config.yaml", "hydra.yaml", "overrides.yaml"]
    assert (tmp_path / ".hydra" / "overrides.yaml").read_text() == "".join(f"- {o}\n" for o in FINISHED)
    config = yaml.safe_load((tmp_path / ".hydra" / "config.yaml").read_text())
    assert "hydra" not in config and config["trainer"]["max_steps"] == 2
    assert yaml.safe_load((tmp_path / ".hydra" / "hydra.yaml").read_text())["hydra"]["job"]["name"] == "train"
    log = (tmp_path / "train.log").read_text()
    assert re.fullmatch(r"\[[-0-9 :,]+\]\[sentemb\.train\]\[INFO\] - training 2\n", log), "Hydra's file format"
    assert read_record(tmp_path)["status"] == "ok"
    files = [h for h in logging.getLogger().handlers if isinstance(h, logging.FileHandler)]
    assert not files, "the job's log file is detached when it ends (a multirun runs its jobs in one process)"


def test_the_hydra_files_are_byte_for_byte_what_hydra_writes(cli, tmp_path, monkeypatch):
    def train(cfg, before_build=None):  # inside the job Hydra saved .hydra/ (output_subdir=.hydra): ours beside it
        hydra_cfg = copy.deepcopy(HydraConfig.get())
        with read_write(hydra_cfg), open_dict(hydra_cfg):
            hydra_cfg.output_subdir = None  # as conf/train.yaml sets it
        save_hydra_files(cfg, hydra_cfg, tmp_path / "ours")
        return {}

    monkeypatch.setattr(sentemb.train, "train", train)
    cli([*FINISHED, "loss.tau=0.1", f"hydra.run.dir={tmp_path}", "hydra.output_subdir=.hydra"])
    for name in ("config.yaml", "hydra.yaml", "overrides.yaml"):
        ours = (tmp_path / "ours" / ".hydra" / name).read_text()
        hydras = (tmp_path / ".hydra" / name).read_text()
        assert ours.replace("output_subdir: null\n", "output_subdir: .hydra\n") == hydras, name


@pytest.mark.parametrize("rank_worker", ["ddp_worker=true", "rank 1"])
def test_a_rank_worker_writes_its_log_and_not_hydras_files(rank_worker, cli, tmp_path, fake_training, monkeypatch):
    if rank_worker == "rank 1":  # a rank Lightning's or SLURM's launcher started: its rank is in the environment
        monkeypatch.setattr(sentemb.runs.lifecycle, "process_rank", lambda: 1)
        overrides = [*FINISHED, "hydra.job.name=train_ddp_process_1"]
    else:  # a sweep job's rank (sentemb.runs.ddp_jobs.rank_overrides)
        overrides = [*FINISHED, "ddp_worker=true", "hydra.job.name=rank0"]
    cli([*overrides, f"hydra.run.dir={tmp_path}"])
    logs = sorted(p.name for p in tmp_path.glob("*.log"))
    assert logs == ["rank0.log" if rank_worker == "ddp_worker=true" else "train_ddp_process_1.log"]
    assert not (tmp_path / ".hydra").exists(), "the job's rank 0 writes .hydra/"


@pytest.mark.slow
def test_a_refused_cli_command_leaves_a_trained_run_byte_identical(tiny_overrides, small_stsb, tmp_path):
    run = tmp_path / "run"
    command = [sys.executable, "-m", "sentemb.train", *tiny_overrides, f"eval.stsb_dir={small_stsb}"]
    trained = subprocess.run([*command, f"hydra.run.dir={run}"], capture_output=True, text=True, timeout=600)
    assert trained.returncode == 0, trained.stderr[-3000:]
    assert {".hydra/config.yaml", ".hydra/hydra.yaml", ".hydra/overrides.yaml", "train.log"} <= set(tree(run))
    assert "STS-B dev Spearman" in (run / "train.log").read_text()
    before = tree(run)
    refused = subprocess.run([*command, "trainer.max_steps=5", f"hydra.run.dir={run}"], capture_output=True, text=True)
    assert refused.returncode == 1 and "belongs to a job run with" in refused.stderr
    assert tree(run) == before, "every file byte-identical, none added"
    repeated = subprocess.run([*command, f"hydra.run.dir={run}"], capture_output=True, text=True)
    assert repeated.returncode == 0 and "its record is reused" in repeated.stdout
    assert tree(run) == before
