"""A run stopped after 3 steps and resumed from its last.ckpt to 6 is the 6-step run: losses, dev, best, test."""

from __future__ import annotations

import csv
from pathlib import Path

import lightning as L
import pytest

import sentemb.train
from sentemb.common.metric_names import (
    BEST_STEP,
    DEV_SPEARMAN,
    DEV_SPEARMAN_BEST_LOGGED,
    DEV_SPEARMAN_BEST_RESCORED,
    TEST_SPEARMAN,
)
from tests.test_train import run


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


def stopped_and_resumed(
    overrides: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, stop_after: int
) -> tuple[dict, dict, Path]:
    """`overrides` run whole (<tmp_path>/full), then stopped after `stop_after` steps (<tmp_path>/stopped, what a killed
    job leaves) and resumed from its last.ckpt (<tmp_path>/resumed): (the whole run's metrics, the resumed run's,
    the last.ckpt it resumed from)."""
    full = run(overrides, tmp_path / "full")
    build_trainer = sentemb.train.build_trainer
    monkeypatch.setattr(
        sentemb.train,
        "build_trainer",
        lambda cfg, extra_callbacks=(): build_trainer(cfg, [*extra_callbacks, StopAfter(stop_after)]),
    )
    run(overrides, tmp_path / "stopped")
    monkeypatch.undo()
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


def test_resumed_run_equals_the_uninterrupted_run(overrides, tmp_path, monkeypatch):
    full, resumed, _ = stopped_and_resumed(overrides, tmp_path, monkeypatch, stop_after=3)
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
