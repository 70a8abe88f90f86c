"""Every command that writes into a folder takes its lock and never writes through a link it did not make (issue 62,
findings 3, 5, 6 and 13's `checkpoint=`).

sentemb.evaluate and sentemb.export leave Hydra's output_subdir off and write their Hydra files under the folder's
lock, into `.hydra/<command>/` (never over a training run's `.hydra/`); a run folder whose `.hydra`, `checkpoints`,
`csv`, `wandb`, ... is a symbolic link (or a file) is refused before anything is written, whoever would write there
(sentemb, Hydra, a logger). An export's model card shows only results of its own checkpoint file, and says how the
checkpoint trained (its loss, its data) from the run's own config.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
import torch

from sentemb.common.errors import SentembConfigError
from sentemb.common.folder_lock import LOCK_NAME
from sentemb.common.hydra_plumbing import resolved_container
from sentemb.encoders.build import build_encoder
from sentemb.eval.scored_checkpoint import SCORED, checkpoint_identity
from sentemb.export import export
from sentemb.runs.job_files import save_hydra_files
from tests.conftest import compose_train, tree
from tests.test_export import compose_export
from tests.test_one_writer import hold_lock as holding  # a fixture

hold_lock = holding  # tests/test_one_writer.py's live holder of a folder's lock, as a fixture here
SENTINEL = "a file of the user's, which no sentemb command may touch\n"


def planted_link(run: Path, name: str, tmp_path: Path) -> Path:
    """`<run>/<name>`: a symbolic link to another folder holding a sentinel file; returns that folder."""
    target = tmp_path / f"elsewhere-{name.strip('.').replace('/', '-')}"
    target.mkdir()
    (target / "keep.txt").write_text(SENTINEL)
    (run / name).parent.mkdir(parents=True, exist_ok=True)
    (run / name).symlink_to(target, target_is_directory=True)
    return target


def refused_link(run: Path, name: str) -> str:
    return rf"{re.escape(str(run / name))} is a symbolic link \(to .*\): .*nothing was written\. Fix: remove it"


# ---- finding 5: no writer goes through a link planted in the run folder ----


@pytest.mark.parametrize(
    ("name", "logger"), [(".hydra", "csv"), ("csv", "csv"), ("checkpoints", "csv"), ("wandb", "wandb")]
)
def test_training_refuses_a_run_folder_whose_subfolder_is_a_planted_link(
    name, logger, cli, fake_training, tmp_path, monkeypatch
):
    monkeypatch.setenv("WANDB_MODE", "offline")
    run = tmp_path / "run"
    target = planted_link(run, name, tmp_path)
    before, target_before = tree(run), tree(target)
    with pytest.raises(SystemExit, match=refused_link(run, name)):
        cli(["model=tiny", f"logger={logger}", "trainer.max_steps=2", f"hydra.run.dir={run}"])
    assert tree(target) == target_before, "the link's target is byte-unchanged"
    assert tree(run) == before, "nothing written in the run folder, no lock file left"


def test_training_refuses_a_file_where_its_checkpoints_folder_goes(cli, fake_training, tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "checkpoints").write_text(SENTINEL)
    with pytest.raises(SystemExit, match=r"checkpoints is a file, not a folder: .*Fix: remove it"):
        cli(["model=tiny", "logger=csv", "trainer.max_steps=2", f"hydra.run.dir={run}"])
    assert tree(run) == {"checkpoints": tree(tmp_path)["run/checkpoints"]}


@pytest.mark.parametrize("name", [".hydra", ".hydra/evaluate", "wandb"])
def test_evaluate_refuses_a_run_folder_whose_subfolder_is_a_planted_link(name, command, forbid_model_loading, tmp_path):
    run = tmp_path / "run"
    target = planted_link(run, name, tmp_path)
    before, target_before = tree(run), tree(target)
    with pytest.raises(SystemExit, match=refused_link(run, name)):
        command("evaluate", ["model=tiny", "tasks=STSBenchmark", "wandb_run_id=abc123", f"hydra.run.dir={run}"])
    assert tree(target) == target_before and tree(run) == before


def test_export_refuses_a_hydra_run_folder_whose_hydra_subfolder_is_a_planted_link(
    command, forbid_model_loading, tmp_path
):
    run, out = tmp_path / "run", tmp_path / "out"
    target = planted_link(run, ".hydra", tmp_path)
    before, target_before = tree(run), tree(target)
    with pytest.raises(SystemExit, match=refused_link(run, ".hydra")):
        command("export", ["model=tiny", f"out={out}", f"hydra.run.dir={run}"])
    assert tree(target) == target_before and tree(run) == before and not out.exists()


# ---- finding 6: evaluate takes the folder's lock, and never replaces a training run's .hydra/ files ----


def test_evaluate_into_a_live_runs_folder_is_refused_and_changes_nothing(
    command, hold_lock, forbid_model_loading, tmp_path
):
    run = tmp_path / "run"
    (run / ".hydra").mkdir(parents=True)
    (run / ".hydra" / "config.yaml").write_text("# the training's config\n")
    live = hold_lock(run)
    before = tree(run)
    with pytest.raises(SystemExit, match=rf"hydra\.run\.dir={re.escape(str(run))} is in use by PID {live.pid} .*Fix:"):
        command("evaluate", ["model=tiny", "tasks=STSBenchmark", f"hydra.run.dir={run}"])
    assert tree(run) == before


def test_evaluate_in_a_finished_training_folder_writes_its_config_under_its_own_name(command, tmp_path, monkeypatch):
    import sentemb.evaluate

    run = tmp_path / "run"
    (run / ".hydra").mkdir(parents=True)
    for name in ("config.yaml", "hydra.yaml", "overrides.yaml"):
        (run / ".hydra" / name).write_text(f"# the training's {name}\n")
    (run / LOCK_NAME).write_text('{"pid": 1, "command": "python -m sentemb.train"}\n')  # the training's, let go
    before = tree(run)
    seen = []
    monkeypatch.setattr(sentemb.evaluate, "evaluate", lambda cfg, out: seen.append(Path(out)))
    command("evaluate", ["model=tiny", "tasks=STSBenchmark", f"hydra.run.dir={run}"])
    assert seen == [run]
    after = tree(run)
    assert {k: after[k] for k in before} == before, "the training's .hydra/ files and lock file as they were"
    assert set(after) - set(before) == {
        ".hydra/evaluate", ".hydra/evaluate/config.yaml", ".hydra/evaluate/hydra.yaml",
        ".hydra/evaluate/overrides.yaml", "evaluate.log",
    }  # fmt: skip
    assert "tasks: STSBenchmark" in (run / ".hydra" / "evaluate" / "config.yaml").read_text()


def test_an_export_into_its_own_hydra_run_folder_is_refused(command, forbid_model_loading, tmp_path):
    with pytest.raises(SystemExit, match=r"is the folder this command already writes its own files in.*Fix:"):
        command("export", ["model=tiny", f"out={tmp_path / 'run'}", f"hydra.run.dir={tmp_path / 'run'}"])
    assert not (tmp_path / "run" / "README.md").exists() and not (tmp_path / "run" / LOCK_NAME).exists()


# ---- finding 13: checkpoint= given empty ----


@pytest.mark.parametrize("name", ["export", "evaluate"])
def test_an_empty_checkpoint_is_refused_naming_the_key(name, command, forbid_model_loading, tmp_path):
    (tmp_path / "keep.txt").write_text(SENTINEL)
    before = tree(tmp_path)
    out = [f"out={tmp_path / 'out'}"] if name == "export" else []
    with pytest.raises(SystemExit, match=r"checkpoint= is given empty .*Fix: checkpoint=<path>, or leave checkpoint="):
        command(name, ["checkpoint=", *out, f"hydra.run.dir={tmp_path / 'run'}"])
    assert tree(tmp_path) == {**before, "run": "dir"}, "no out=; the run folder Hydra makes left empty"
    with pytest.raises(SentembConfigError, match=r"checkpoint= is given empty"):  # the library's entry too
        export(compose_export(["checkpoint=", f"out={tmp_path / 'out'}"]))


# ---- finding 3: the model card shows results of its own checkpoint only, and how the checkpoint trained ----


def tiny_run(run: Path, overrides: list[str]) -> Path:
    """A run folder as training leaves it (its .hydra/ files, checkpoints/best-step50.ckpt and best-step100.ckpt of
    an untrained tiny encoder), made without training; returns best-step50.ckpt."""
    cfg = compose_train(["model=tiny", *overrides], run)
    hparams = {key: resolved_container(cfg[key]) for key in ("model", "pooling", "loss", "optimizer", "scheduler")}
    encoder = build_encoder(hparams["model"], hparams["pooling"], None)
    state = {f"encoder.{key}": value for key, value in encoder.state_dict().items()}
    (run / "checkpoints").mkdir(parents=True)
    for step in (50, 100):
        torch.save(
            {"epoch": 0, "global_step": step, "pytorch-lightning_version": "2.6.0", "state_dict": state,
             "hyper_parameters": {**hparams, "head": None}},
            run / "checkpoints" / f"best-step{step}.ckpt",
        )  # fmt: skip
    save_hydra_files(cfg, cfg.hydra, run)
    return run / "checkpoints" / "best-step50.ckpt"


def results_of(checkpoint: Path, score: float, identity: bool = True) -> dict:
    """A results.json of sentemb.evaluate for `checkpoint` (its STS-B figure `score`)."""
    results = {
        "source": {"checkpoint": str(checkpoint), "pooling": {"name": "cls"}, "model": {"name_or_path": "tiny"}},
        "tasks": ["STSBenchmark"], "sts_table": {"STSBenchmark": score}, "sts": {},
    }  # fmt: skip
    return results | ({SCORED: checkpoint_identity(checkpoint)} if identity else {})


@pytest.mark.parametrize(
    "beside",
    ["another checkpoint's", "unrecorded"],
)
def test_the_card_leaves_out_results_beside_the_checkpoint_that_scored_another_checkpoint(beside, tmp_path):
    checkpoint = tiny_run(tmp_path / "run", [])
    other = checkpoint.with_name("best-step100.ckpt")
    results = results_of(other, 99.99) if beside == "another checkpoint's" else results_of(checkpoint, 99.99, False)
    (tmp_path / "run" / "results.json").write_text(json.dumps(results))
    out = export(compose_export([f"checkpoint={checkpoint}", f"out={tmp_path / 'out'}"]))
    card = (out / "README.md").read_text()
    assert "99.99" not in card, "no figure of another (or an unknown) checkpoint in the card"
    why = f"scored {other}" if beside == "another checkpoint's" else "does not record which checkpoint file it scored"
    assert f"`{tmp_path / 'run' / 'results.json'}` is left out: it {why}" in card
    assert "Not evaluated: `python -m sentemb.export ... evaluate=true`." in card


def test_the_card_shows_results_of_its_own_checkpoint(tmp_path):
    checkpoint = tiny_run(tmp_path / "run", [])
    (tmp_path / "run" / "results.json").write_text(json.dumps(results_of(checkpoint, 77.77)))
    card = (export(compose_export([f"checkpoint={checkpoint}", f"out={tmp_path / 'out'}"])) / "README.md").read_text()
    assert "77.77" in card and "is left out" not in card


@pytest.mark.parametrize(("scored", "exported"), [(8, None), (None, 8), (8, 16)])
def test_the_card_leaves_out_results_scored_at_another_size_than_the_folder_embeds(scored, exported, tmp_path):
    checkpoint = tiny_run(tmp_path / "run", [])
    results = results_of(checkpoint, 77.77) | ({"truncate_dim": scored} if scored else {})
    (tmp_path / "run" / "results.json").write_text(json.dumps(results))
    size = [f"truncate_dim={exported}"] if exported else []
    card = (
        export(compose_export([f"checkpoint={checkpoint}", f"out={tmp_path / 'out'}", *size])) / "README.md"
    ).read_text()
    assert "77.77" not in card, "a figure of another size is not this folder's"
    assert f"scored {scored or 'all'} dimensions; this folder embeds {exported or 'all'}" in card


@pytest.mark.parametrize(
    ("overrides", "about", "data"),
    [
        (["loss=cosent", "data=stsb_train"], "on labelled data (loss `cosent`, `data.source: stsb_train", "source"),
        (["data=nli"], "on labelled data (loss `infonce`, `data.source: nli", "source"),
        ([], "without labels (loss `infonce` on unlabelled sentences", "corpus"),
    ],
    ids=["cosent", "supervised", "unsupervised"],
)
def test_the_card_says_how_the_checkpoint_trained_from_its_runs_config(overrides, about, data, tmp_path):
    checkpoint = tiny_run(tmp_path / "run", overrides)
    card = (export(compose_export([f"checkpoint={checkpoint}", f"out={tmp_path / 'out'}"])) / "README.md").read_text()
    assert about in card
    assert ("unsupervised" in card) == (data == "corpus"), "supervised training is never called unsupervised"
    config = card.split("## Training config", 1)[1]
    assert "\ndata:\n" in config and f"\n  {data}: " in config, "the training config includes its data"


def test_evaluate_records_which_checkpoint_file_it_scored(tmp_path):
    from sentemb.eval.suite import evaluate
    from tests.test_sts_suite import compose_eval

    checkpoint = tiny_run(tmp_path / "run", [])
    identity = checkpoint_identity(checkpoint)
    cfg = compose_eval(
        [f"checkpoint={checkpoint}", "tasks=STSBenchmark", "sts_splits=[test]", "intervals.resamples=10"]
    )
    evaluate(cfg, tmp_path / "eval")
    saved = json.loads((tmp_path / "eval" / "results.json").read_text())
    assert saved[SCORED] == identity == {"path": os.path.abspath(checkpoint), "size": checkpoint.stat().st_size,
                                         "mtime_ns": checkpoint.stat().st_mtime_ns}  # fmt: skip


# ---- the other writer commands: the sweep report and the analysis take their folder's lock too ----


def test_a_sweep_report_into_a_folder_another_command_holds_is_refused_and_changes_nothing(hold_lock, tmp_path):
    from sentemb.runs.sweeps import write_report
    from tests.test_sweep import fake_sweep

    fake_sweep(
        tmp_path / "sweep", [({"optimizer.lr": "1e-5"}, 1, 80.0, "ok"), ({"optimizer.lr": "3e-5"}, 1, 81.0, "ok")]
    )
    live = hold_lock(tmp_path / "sweep")
    before = tree(tmp_path / "sweep")
    with pytest.raises(
        SentembConfigError, match=rf"sweep \(its sweep report\) is in use by PID {live.pid} .*Fix: wait"
    ):
        write_report(tmp_path / "sweep")
    assert tree(tmp_path / "sweep") == before


def test_a_report_leaves_no_lock_file(tmp_path):
    from sentemb.runs.sweeps import write_report
    from tests.test_sweep import fake_sweep

    fake_sweep(
        tmp_path / "sweep", [({"optimizer.lr": "1e-5"}, 1, 80.0, "ok"), ({"optimizer.lr": "3e-5"}, 1, 81.0, "ok")]
    )
    write_report(tmp_path / "sweep")
    assert (tmp_path / "sweep" / "sweep.md").is_file() and not (tmp_path / "sweep" / LOCK_NAME).exists()


def test_a_simulation_into_a_live_runs_folder_is_refused_before_any_sampling(hold_lock, tmp_path):
    from sentemb.analysis import simulate

    (tmp_path / "run").mkdir()
    live = hold_lock(tmp_path / "run")
    before = tree(tmp_path / "run")
    with pytest.raises(SentembConfigError, match=rf"--out .*figs \(inside .*run\) is in use by PID {live.pid} .*Fix:"):
        simulate(tmp_path / "run" / "figs", grid=2, batches=1)
    assert tree(tmp_path / "run") == before
