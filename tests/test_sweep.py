"""Sweeps → answers: metrics.json per job, failed/diverged jobs, W&B names/groups, the report, Optuna, submitit."""

from __future__ import annotations

import csv
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

import sentemb.runs.sweep_figures
from sentemb.common.errors import SentembConfigError
from sentemb.common.metric_names import (
    BEST_STEP,
    DEV_SPEARMAN_BEST_LOGGED,
    DEV_SPEARMAN_BEST_RESCORED,
    OLD_NAMES,
    TEST_SPEARMAN,
)
from sentemb.runs.job_files import save_hydra_files
from sentemb.runs.offline_wandb import run_info, summary
from sentemb.runs.record import read_records, write_record
from sentemb.runs.sweep_figures import four_digits, readable
from sentemb.runs.sweeps import configurations, job_rows, pooled_seed_std, winner_overrides, write_report
from sentemb.sweep_report import main as report_main
from tests.conftest import compose_train

TINY_JOB = ["model=tiny", "trainer.max_steps=2", "eval.every_n_steps=2", "eval.at_start=false"]


def sweep(args: list[str], sweep_dir: Path, timeout: float = 600) -> subprocess.CompletedProcess:
    """`python -m sentemb.train -m ...` as a user runs it (W&B offline unless configured)."""
    env = {k: v for k, v in os.environ.items() if k not in ("WANDB_MODE", "WANDB_API_KEY")}
    command = [sys.executable, "-m", "sentemb.train", "-m", *args, f"hydra.sweep.dir={sweep_dir}"]
    result = subprocess.run(command, capture_output=True, text=True, env=env, timeout=timeout)
    assert result.returncode == 0, result.stderr[-3000:]
    return result


def wandb_log(directory: Path) -> Path:
    [log] = list(directory.glob("wandb/offline-run-*/run-*.wandb"))
    return log


def wait_for(log: Path, key: str, timeout: float = 30.0) -> dict:
    """W&B's service may still be writing after the process ended: wait for the summary key."""
    deadline = time.monotonic() + timeout
    while key not in (values := summary(log)) and time.monotonic() < deadline:
        time.sleep(0.2)
    return values


@pytest.mark.slow  # multi-process run (CLI subprocesses, sweeps): make test-slow
def test_two_by_two_sweep_with_two_seeds_gives_records_report_and_named_wandb_runs(small_corpus, tmp_path):
    sweep_dir = tmp_path / "mmhe_grid"
    grid = ["loss=mmhe", "loss.m=0.2,0.4", "loss.r=1.0,1.5", "seed=1,2"]
    result = sweep([*TINY_JOB, *grid, f"data.corpus={small_corpus}"], sweep_dir)

    records = read_records(sweep_dir)
    assert len(records) == 8 and all(r["status"] == "ok" for _, r in records)
    for directory, record in records:
        m, r, seed = record["swept"]["loss.m"], record["swept"]["loss.r"], record["swept"]["seed"]
        assert record["seed"] == int(seed) and record["wall_time_s"] > 0
        assert record["wandb"]["name"] == f"loss.m={m} loss.r={r} seed={seed}"
        info = run_info(wandb_log(directory))
        assert info == {"name": f"loss.m={m} loss.r={r} seed={seed}", "group": "mmhe_grid", "job_type": "",
                        "tags": ["tiny", "cls", "mmhe"]}  # fmt: skip
        final = wait_for(wandb_log(directory), "status")
        assert final["status"] == "ok"
        assert final[DEV_SPEARMAN_BEST_RESCORED] == record["metrics"][DEV_SPEARMAN_BEST_RESCORED]  # the same float

    # the report ran by itself at the end of the multirun (Hydra callback)
    assert "(sweep report in" in result.stdout
    rows = list(csv.DictReader((sweep_dir / "sweep.csv").open()))
    assert len(rows) == 8 and {r["status"] for r in rows} == {"ok"}
    table = [
        line for line in (sweep_dir / "sweep.md").read_text().splitlines() if line.startswith("| ") and "±" in line
    ]
    assert len(table) == 4 and all(line.split("|")[-4].strip() == "2" for line in table), table  # n = 2 seeds
    for png in ("sweep_loss.m.png", "sweep_loss.r.png", "sweep_heatmap.png"):
        assert (sweep_dir / png).stat().st_size > 5_000, png
    report_run = run_info(wandb_log(sweep_dir))
    assert report_run["group"] == "mmhe_grid" and report_run["job_type"] == "sweep-report"


@pytest.mark.slow  # multi-process run (CLI subprocesses, sweeps): make test-slow
def test_failed_and_diverged_jobs_are_recorded_while_the_others_finish(small_corpus, tmp_path):
    # τ = 1e-46 is 0 in float32: s/τ = inf, a NaN loss at the first step; a missing corpus fails the job
    corpus = f"data.corpus={small_corpus},{tmp_path / 'missing.txt'}"
    sweep([*TINY_JOB, "logger=csv", corpus, "loss.tau=0.05,1e-46"], tmp_path / "s")
    status = {
        (r["swept"]["data.corpus"].endswith("missing.txt"), r["swept"]["loss.tau"]): r
        for _, r in read_records(tmp_path / "s")
    }
    assert status[(False, "0.05")]["status"] == "ok"
    assert status[(False, "1e-46")]["status"] == "diverged"
    assert "training diverged at step 0: train/loss = nan" in status[(False, "1e-46")]["message"]
    assert [status[(True, tau)]["status"] for tau in ("0.05", "1e-46")] == ["failed", "failed"]
    assert "missing.txt" in status[(True, "0.05")]["message"]
    report = (tmp_path / "s" / "sweep.md").read_text()
    assert "4 jobs: 1 ok, 2 failed, 1 diverged" in report and "## Failed, diverged and unfinished jobs" in report


def test_a_single_diverged_run_exits_nonzero_and_keeps_its_record(small_corpus, tmp_path):
    command = [sys.executable, "-m", "sentemb.train", *TINY_JOB, "logger=csv", "loss.tau=1e-46",
               f"data.corpus={small_corpus}", f"hydra.run.dir={tmp_path}"]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines()[-1].startswith("sentemb: training diverged at step 0")
    assert json.loads((tmp_path / "metrics.json").read_text())["status"] == "diverged"


@pytest.mark.slow  # multi-process run (CLI subprocesses, sweeps): make test-slow
def test_optuna_runs_three_trials_into_a_resumable_study(small_corpus, tmp_path):
    import optuna

    args = [*TINY_JOB, "logger=csv", "loss=mmhe", "hparams_search=optuna", "hydra.sweeper.n_trials=3"]
    sweep([*args, f"data.corpus={small_corpus}"], tmp_path / "opt")
    assert (tmp_path / "opt" / "optuna.db").is_file()
    records = read_records(tmp_path / "opt")
    assert len(records) == 3 and all(r["status"] == "ok" for _, r in records)
    assert all(set(r["swept"]) == {"loss.m", "loss.tau", "loss.r"} for _, r in records)
    study = optuna.load_study(study_name="sentemb", storage=f"sqlite:///{tmp_path / 'opt' / 'optuna.db'}")
    best = max(r["metrics"][DEV_SPEARMAN_BEST_LOGGED] for _, r in records)
    assert len(study.trials) == 3 and study.best_value == best  # the value main() returned: the same float


@pytest.mark.slow  # multi-process run (CLI subprocesses, sweeps): make test-slow
def test_submitit_local_launcher_runs_a_two_job_sweep(small_corpus, tmp_path):
    sweep([*TINY_JOB, "logger=csv", "launcher=local_processes", "loss.tau=0.05,0.1", f"data.corpus={small_corpus}"],
          tmp_path / "sub")  # fmt: skip
    records = read_records(tmp_path / "sub")
    assert [r["swept"]["loss.tau"] for _, r in records] == ["0.05", "0.1"]
    assert all(r["status"] == "ok" for _, r in records)
    assert (tmp_path / "sub" / ".submitit").is_dir(), "the jobs went through submitit"


OLD = {new: old for old, new in OLD_NAMES.items()}  # the names records held before today's metric names


def job_metrics(dev: float | None, old_names: bool = False) -> dict[str, float]:
    """A finished job's metrics (best dev logged = rescored, test 5 below), by today's names or the old ones."""
    if dev is None:
        return {}
    metrics = {DEV_SPEARMAN_BEST_RESCORED: dev, DEV_SPEARMAN_BEST_LOGGED: dev, TEST_SPEARMAN: dev - 5, BEST_STEP: 10}
    return {OLD.get(k, k) if old_names else k: v for k, v in metrics.items()}


def fake_sweep(directory: Path, jobs: list[tuple[dict[str, str], int, float | None, str]], old_names=False) -> None:
    for number, (values, seed, dev, status) in enumerate(jobs):
        overrides = [f"{k}={v}" for k, v in values.items()] + [f"seed={seed}"]
        write_record(directory / str(number), {"status": status, "message": "" if status == "ok" else "boom",
                     "metrics": job_metrics(dev, old_names), "overrides": overrides, "swept": {},
                     "seed": seed})  # fmt: skip


def fake_optuna_sweep(directory: Path, trials: list[tuple[dict[str, str], float | None]], old_names=False) -> None:
    """An hparams_search=optuna sweep's job folders as its jobs leave them (record, .hydra/ written by the jobs'
    own writer from the composed config), without training; a trial without a dev score diverged."""
    cfg = compose_train(["hparams_search=optuna", "loss=mmhe"], directory)
    if old_names:  # a sweep run before today's metric names
        cfg.optimized_metric = OLD[DEV_SPEARMAN_BEST_LOGGED]
    for number, (values, dev) in enumerate(trials):
        job = directory / f"{number}-20260101-120000"
        write_record(job, {"status": "ok" if dev is not None else "diverged", "message": "",
                           "metrics": job_metrics(dev, old_names), "overrides": [f"{k}={v}" for k, v in values.items()],
                           "swept": values, "seed": 42})  # fmt: skip
        save_hydra_files(cfg, cfg.hydra, job)


OPTUNA_TRIALS = [
    ({"loss.m": "0.30745401188473626", "loss.tau": "0.01", "loss.r": "1.1560186404424364"}, 42.18318711818508),
    ({"loss.m": "0.2855994520336203", "loss.tau": "0.03", "loss.r": "1.7080725777960455"}, 44.48145214434177),
    ({"loss.m": "0.27205844942958024", "loss.tau": "0.05", "loss.r": "1.1818249672071006"}, None),
    ({"loss.m": "0.3512431718830204", "loss.tau": "0.01", "loss.r": "1.9241323417062313"}, 41.00362555265135),
]
OPTUNA_FIGURES = ["optuna_history.png", "optuna_slice.png", "optuna_importances.png"]


def test_an_optuna_sweeps_report_reads_at_four_digits_and_draws_optunas_figures(tmp_path):
    """~2-5 s: the first `import optuna` in a process (sqlalchemy, alembic) is most of it."""
    fake_optuna_sweep(tmp_path, OPTUNA_TRIALS)
    out = write_report(tmp_path)
    table = out["markdown"]
    assert "| 1 | 0.2856 | 0.03 | 1.708 | 44.48 | 39.48 | 10 | 1 | 42 |" in table, table
    assert "| 2 | 0.3075 | 0.01 | 1.156 | 42.18 | 37.18 | 10 | 1 | 42 |" in table
    assert "| 2-20260101-120000 | 0.2721 | 0.05 | 1.182 | 42 | diverged |" in table
    assert "0.30745401188473626" not in table and "42.183" not in table
    assert f"- 3 finished trials of 4; objective `{DEV_SPEARMAN_BEST_LOGGED}` (maximize)" in table
    assert [p.name for p in out["figures"]] == OPTUNA_FIGURES
    for png in OPTUNA_FIGURES:
        assert (tmp_path / png).stat().st_size > 10_000, png
    assert not list(tmp_path.glob("sweep_*.png")), "a study's sampled values get no grid figures"
    assert (tmp_path / "best_overrides.txt").read_text() == "loss.m=0.2856\nloss.tau=0.03\nloss.r=1.708\n"
    # from_sweep= retrains the winner as it ran: the exact sampled values, from the records
    assert winner_overrides(tmp_path) == ["loss.m=0.2855994520336203", "loss.tau=0.03", "loss.r=1.7080725777960455"]


def test_a_one_trial_study_says_why_it_has_no_importances(tmp_path):
    fake_optuna_sweep(tmp_path, OPTUNA_TRIALS[:1] + OPTUNA_TRIALS[2:3])  # one finished, one diverged
    out = write_report(tmp_path)
    assert "Parameter importances: not drawn: they need at least 2 finished trials" in out["markdown"]
    assert "- 1 finished trial of 2;" in out["markdown"] and "this study has 1 finished" in out["markdown"]
    assert [p.name for p in out["figures"]] == ["optuna_history.png", "optuna_slice.png"]


def test_a_grid_sweeps_report_and_heatmap_read_at_four_digits(tmp_path, monkeypatch):
    fake_sweep(tmp_path, [
        ({"loss.tau": "0.05", "loss.m": "0.3"}, 1, 83.456789, "ok"),
        ({"loss.tau": "0.05", "loss.m": "0.4"}, 1, 80.0, "ok"),
        ({"loss.tau": "0.1", "loss.m": "0.3"}, 1, 79.123456, "ok"),
        ({"loss.tau": "0.1", "loss.m": "0.4"}, 1, 7.891234, "ok"),
    ])  # fmt: skip
    drawn = {}  # each figure's texts, read as it is saved
    real_save_figure = sentemb.runs.sweep_figures.save_figure

    def save_figure(figure, path, **kwargs):
        drawn[Path(path).name] = [t.get_text() for ax in figure.axes for t in [*ax.texts, *ax.get_xticklabels()]]
        return real_save_figure(figure, path, **kwargs)

    monkeypatch.setattr(sentemb.runs.sweep_figures, "save_figure", save_figure)
    out = write_report(tmp_path)
    assert "| 1 | 0.05 | 0.3 | 83.46 | 78.46 | 10 | 1 | 1 |" in out["markdown"]
    assert "| 4 | 0.1 | 0.4 | 7.891 | 2.891 | 10 | 1 | 1 |" in out["markdown"]
    assert "leads the runner-up by 3.457 points" in out["markdown"]
    assert drawn["sweep_heatmap.png"][:4] == ["83.46", "80.00", "79.12", "7.891"], "the heatmap's cells"
    assert {p.name for p in out["figures"]} == {"sweep_loss.tau.png", "sweep_loss.m.png", "sweep_heatmap.png"}


def test_four_significant_digits_for_reading():
    assert [four_digits(x) for x in (83.5, 0.30745401188473626, 3e-5, 1234.5, float("nan"), None)] == [
        "83.50", "0.3075", "3.000e-05", "1234", "–", "–"
    ]  # fmt: skip
    # an Optuna sample is rounded; a value as a person wrote it (or an integer, or a name) is not
    assert [readable(v) for v in ("0.30745401188473626", "3e-5", "1.00", "123456", "mean", "1e-46")] == [
        "0.3075", "3e-5", "1.00", "123456", "mean", "1e-46"
    ]  # fmt: skip


def test_records_from_before_todays_metric_names_still_make_the_report_and_the_winner(tmp_path):
    fake_sweep(tmp_path / "grid", [
        ({"optimizer.lr": "1e-5"}, 1, 80.0, "ok"),
        ({"optimizer.lr": "3e-5"}, 1, 84.0, "ok"),
    ], old_names=True)  # fmt: skip
    assert "stsb/best_dev_spearman" in json.loads((tmp_path / "grid" / "0" / "metrics.json").read_text())["metrics"]
    rows, _ = job_rows(tmp_path / "grid")
    assert [(r["best_dev"], r["test"], r["best_step"]) for r in rows] == [(80.0, 75.0, 10), (84.0, 79.0, 10)]
    assert "| 1 | 3e-5 | 84.00 | 79.00 | 10 | 1 | 1 |" in write_report(tmp_path / "grid")["markdown"]
    assert winner_overrides(tmp_path / "grid") == ["optimizer.lr=3e-5"]  # what from_sweep= applies
    # an old Optuna sweep: old metric keys, and `optimized_metric: stsb/dev_spearman_best` in its config
    fake_optuna_sweep(tmp_path / "study", OPTUNA_TRIALS[:2], old_names=True)
    out = write_report(tmp_path / "study")
    assert f"- 2 finished trials of 2; objective `{DEV_SPEARMAN_BEST_LOGGED}` (maximize)" in out["markdown"]
    assert [p.name for p in out["figures"]] == OPTUNA_FIGURES


def test_report_pools_seeds_into_mean_and_std(tmp_path):
    fake_sweep(tmp_path, [
        ({"optimizer.lr": "1e-5", "data.batch_size": "64"}, 1, 80.0, "ok"),
        ({"optimizer.lr": "1e-5", "data.batch_size": "64"}, 2, 82.0, "ok"),
        ({"optimizer.lr": "3e-5", "data.batch_size": "64"}, 1, 83.0, "ok"),
        ({"optimizer.lr": "3e-5", "data.batch_size": "64"}, 2, 84.0, "ok"),
        ({"optimizer.lr": "5e-5", "data.batch_size": "64"}, 1, None, "diverged"),
    ])  # fmt: skip
    rows, params = job_rows(tmp_path)
    assert params == ["optimizer.lr"], "data.batch_size never varies; seed is pooled, not a parameter"
    best, second = configurations(rows, params)
    # float64 means and sample stds of two numbers: exact halves and √2·(difference)/2, rounding ~1e-15
    assert (best["optimizer.lr"], best["n"]) == ("3e-5", 2)
    assert best["dev_mean"] == pytest.approx(83.5, rel=1e-12) and best["dev_std"] == pytest.approx(
        math.sqrt(0.5), rel=1e-12
    )
    assert second["dev_mean"] == pytest.approx(81.0, rel=1e-12) and second["dev_std"] == pytest.approx(
        math.sqrt(2), rel=1e-12
    )
    assert pooled_seed_std([best, second])[0] == pytest.approx(math.sqrt(1.25), rel=1e-12)
    out = write_report(tmp_path)
    assert "| 1 | 3e-5 | 83.50 ± 0.71 | 78.50 ± 0.71 | 10 | 2 | 1, 2 |" in out["markdown"]
    assert "| 4 | 5e-5 | 1 | diverged | boom |" in out["markdown"]
    assert (tmp_path / "best_overrides.txt").read_text() == "optimizer.lr=3e-5\n"


def test_from_sweep_applies_the_winner_but_the_jobs_own_overrides_win(tmp_path):
    from sentemb.runs.sweeps import apply_sweep_winner

    fake_sweep(tmp_path / "stage1", [
        ({"optimizer.lr": "1e-5", "data.batch_size": "128"}, 1, 80.0, "ok"),
        ({"optimizer.lr": "3e-5", "data.batch_size": "256"}, 1, 84.0, "ok"),
    ])  # fmt: skip
    cfg = compose_train([f"from_sweep={tmp_path / 'stage1'}"], tmp_path)
    assert apply_sweep_winner(cfg) == ["optimizer.lr=3e-05", "data.batch_size=256"]
    assert (cfg.optimizer.lr, cfg.data.batch_size) == (3e-5, 256)  # the same floats the overrides parse to
    cfg = compose_train([f"from_sweep={tmp_path / 'stage1'}", "data.batch_size=32"], tmp_path)
    apply_sweep_winner(cfg)
    assert (cfg.optimizer.lr, cfg.data.batch_size) == (3e-5, 32)
    fake_sweep(tmp_path / "groups", [({"loss": "mmhe"}, 1, 80.0, "ok"), ({"loss": "mbarlow"}, 1, 81.0, "ok")])
    with pytest.raises(SentembConfigError, match="winner sets loss=mbarlow.*Fix: pass loss="):
        apply_sweep_winner(compose_train([f"from_sweep={tmp_path / 'groups'}"], tmp_path))


def test_report_of_a_directory_without_records_says_so(tmp_path, capsys):
    assert report_main([str(tmp_path)]) == 1
    assert f"{tmp_path}: no metrics.json below it" in capsys.readouterr().err


def table_shapes(markdown: str) -> list[list[int]]:
    """The cell count of each line of each markdown table in `markdown` (a table: consecutive lines starting `|`)."""
    tables: list[list[int]] = []
    previous = False
    for line in markdown.splitlines():
        row = line.startswith("|")
        if row and not previous:
            tables.append([])
        if row:
            tables[-1].append(len(line.strip().strip("|").split(" | ")))
        previous = row
    return tables


@pytest.mark.parametrize("swept", [{}, {"optimizer.lr": "1e-5"}], ids=["seeds-only", "one-key"])
def test_the_report_tables_have_as_many_cells_in_every_line_for_a_sweep_over_seeds_alone_too(swept, tmp_path):
    other = {k: "3e-5" for k in swept}  # a normal sweep: a second value of the key
    fake_sweep(tmp_path, [(swept, 1, 80.0, "ok"), (swept, 2, 82.0, "ok"), (other, 3, None, "failed")])
    tables = table_shapes(write_report(tmp_path)["markdown"])
    width = 7 + len(swept)  # rank, the swept keys, best dev, test, best step, n, seeds, vs best
    assert tables[0] == [width] * (2 + len(configurations(*job_rows(tmp_path))))
    assert tables[-1] == [4 + len(swept)] * 3, "the failed jobs' table: job, the swept keys, seed, status, message"
    assert "|  |" not in write_report(tmp_path)["markdown"], "no empty cell where no key was swept"
