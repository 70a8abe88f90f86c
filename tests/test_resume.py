"""A run stopped after 3 steps and resumed from its last.ckpt to 6 is the 6-step run: losses, dev, best, test."""

from __future__ import annotations

import csv
import shutil
from pathlib import Path

import lightning as L
import pytest

from sentemb.common.metric_names import (
    BEST_STEP,
    DEV_SPEARMAN,
    DEV_SPEARMAN_BEST_LOGGED,
    DEV_SPEARMAN_BEST_RESCORED,
    TEST_SPEARMAN,
)
from tests.test_train import run, train_with


class StopAfter(L.Callback):
    """What a killed job leaves behind: training ends after `step` steps (its last.ckpt was written there)."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_end(self, trainer: L.Trainer, *args) -> None:
        if trainer.global_step >= self.step:
            trainer.should_stop = True


def logged(run_dir: Path, metric: str) -> dict[int, float]:
    rows = csv.DictReader((run_dir / "csv" / "version_0" / "metrics.csv").open())
    return {int(r["step"]): float(r[metric]) for r in rows if r.get(metric)}


def stopped_and_resumed(overrides: list[str], tmp_path: Path, stop_after: int) -> tuple[dict, dict, Path]:
    """`overrides` run whole (<tmp_path>/full), then stopped after `stop_after` steps (<tmp_path>/stopped, what a killed
    job leaves) and resumed from its last.ckpt (<tmp_path>/resumed): (the whole run's metrics, the resumed run's,
    the last.ckpt it resumed from)."""
    full = run(overrides, tmp_path / "full")
    train_with(overrides, tmp_path / "stopped", StopAfter(stop_after))
    last = tmp_path / "stopped" / "checkpoints" / "last.ckpt"
    assert last.is_file()
    return full, run([*overrides, f"ckpt_path={last}"], tmp_path / "resumed"), last


def resumed_losses(tmp_path: Path) -> tuple[dict[int, float], dict[int, float]]:
    """train/loss per step of the whole run and of the stopped-then-resumed one (`stopped_and_resumed`)."""
    resumed = {**logged(tmp_path / "stopped", "train/loss"), **logged(tmp_path / "resumed", "train/loss")}
    return logged(tmp_path / "full", "train/loss"), resumed


@pytest.fixture
def overrides(tiny_overrides) -> list[str]:
    # mid-epoch (19 batches an epoch), dropout on (model.dropout: the tiny model's own 0.1), dev every 3 steps
    return [*tiny_overrides, "trainer.max_steps=6", "eval.every_n_steps=3"]


def test_resumed_run_equals_the_uninterrupted_run(overrides, tmp_path):
    full, resumed, _ = stopped_and_resumed(overrides, tmp_path, stop_after=3)
    losses = logged(tmp_path / "full", "train/loss")
    assert len(losses) == 6
    stopped, after = logged(tmp_path / "stopped", "train/loss"), logged(tmp_path / "resumed", "train/loss")
    assert sorted(stopped) == sorted(losses)[:3] and sorted(after) == sorted(losses)[3:]
    # the same computation on bit-identical weights, optimizer, data position and RNG: equal, not close
    assert {**stopped, **after} == losses
    assert logged(tmp_path / "resumed", DEV_SPEARMAN) == {6: logged(tmp_path / "full", DEV_SPEARMAN)[6]}
    for key in (DEV_SPEARMAN_BEST_LOGGED, DEV_SPEARMAN_BEST_RESCORED, BEST_STEP, TEST_SPEARMAN):
        assert resumed[key] == full[key], key


def test_a_missing_resume_checkpoint_is_refused_before_loading(tmp_path):
    from sentemb.common.errors import SentembConfigError
    from sentemb.training.checks import prepare_run
    from tests.conftest import compose_train

    with pytest.raises(SentembConfigError, match=r"ckpt_path=.*nowhere\.ckpt: no such checkpoint file"):
        prepare_run(compose_train(["model=tiny", f"ckpt_path={tmp_path}/nowhere.ckpt"], tmp_path))


def test_a_resumed_run_keeps_its_checkpoints_next_to_the_one_it_resumed_from(tmp_path):
    from tests.conftest import compose_train

    last = tmp_path / "first" / "checkpoints" / "last.ckpt"
    cfg = compose_train(["model=tiny", f"ckpt_path={last}"], tmp_path / "second")
    assert cfg.callbacks.model_checkpoint.dirpath == cfg.callbacks.last_checkpoint.dirpath == str(last.parent)
    fresh = compose_train(["model=tiny"], tmp_path / "second")
    assert fresh.callbacks.model_checkpoint.dirpath == str(tmp_path / "second" / "checkpoints")


@pytest.fixture
def early_best(tiny_overrides, small_stsb) -> list[str]:
    # dev every 2 steps to 6 on 200 STS-B pairs; lr 1e-2 makes the tiny model's first dev score its best by far (~23,
    # then ~16 and ~10), so the best logged step (2) is earlier than the step a copied run resumes past (4): what a
    # resume must not lose
    return [*tiny_overrides, "trainer.max_steps=6", f"eval.stsb_dir={small_stsb}", "optimizer.lr=1e-2"]


def best_files(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.glob("best-*.ckpt"))


def stopped_run(overrides: list[str], folder: Path, stop_after: int) -> Path:
    """`overrides` stopped after `stop_after` steps in `folder` (what a preempted job leaves); its checkpoints."""
    train_with(overrides, folder, StopAfter(stop_after))
    return folder / "checkpoints"


def test_a_copied_run_resumes_its_best_tracking_and_a_lone_last_checkpoint_is_refused(early_best, tmp_path, recwarn):
    # issue 51, finding 3: `cp -a run run2` then resuming in run2 (auto-resume sets ckpt_path=run2/.../last.ckpt)
    # forgot the best score: the resumed run kept step 6 as its "best" beside the stale best-step2.ckpt, reported
    # step 2's score and tested step 6's weights. Three tiny runs (~10 s of CPU each): best tracking only shows
    # across a real stop and resume, which one test shares
    from sentemb.common.errors import SentembConfigError
    from sentemb.training.checks import prepare_run
    from tests.conftest import compose_train

    full = run(early_best, tmp_path / "full")
    assert full[BEST_STEP] < 4, "the precondition: the best step lies before the resume, else nothing can be lost"
    stopped = stopped_run(early_best, tmp_path / "stopped", stop_after=4)
    before = {p.name: p.read_bytes() for p in stopped.iterdir()}

    # `ckpt_path=` a last.ckpt copied alone: refused before anything loads, naming the best file to copy beside it
    alone = tmp_path / "elsewhere" / "last.ckpt"
    alone.parent.mkdir()
    shutil.copy(stopped / "last.ckpt", alone)
    kept = best_files(stopped)
    with pytest.raises(SentembConfigError, match=rf"keeps {kept[0]} as its best checkpoint.*Fix: copy {kept[0]}"):
        prepare_run(compose_train([*early_best, f"ckpt_path={alone}"], tmp_path / "resumed"))
    shutil.copy(stopped / kept[0], alone.parent)  # the fix it names
    prepare_run(compose_train([*early_best, f"ckpt_path={alone}"], tmp_path / "resumed"))

    # the whole run folder copied and resumed there: the uninterrupted run's best step, scores and one best file
    copy = tmp_path / "copy"
    shutil.copytree(tmp_path / "stopped", copy, symlinks=True)
    resumed = run([*early_best, f"ckpt_path={copy / 'checkpoints' / 'last.ckpt'}"], copy)
    # the same computation on bit-identical weights, optimizer, data position and RNG: equal, not close
    for key in (BEST_STEP, DEV_SPEARMAN_BEST_LOGGED, DEV_SPEARMAN_BEST_RESCORED, TEST_SPEARMAN):
        assert resumed[key] == full[key], key
    assert Path(resumed["best_checkpoint"]) == copy / "checkpoints" / Path(full["best_checkpoint"]).name
    assert best_files(copy / "checkpoints") == best_files(Path(full["best_checkpoint"]).parent), "no stale best"
    assert {p.name: p.read_bytes() for p in stopped.iterdir()} == before, "the original run's files are untouched"
    messages = [str(w.message) for w in recwarn]
    assert not [m for m in messages if "dirpath has changed" in m or "was logged at step" in m], messages
