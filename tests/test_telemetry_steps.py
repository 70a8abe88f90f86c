"""The paradigm telemetry is computed and logged on Lightning's logging steps only; trainer.log_every_n_steps=1 logs
it every step, with the same values."""

from __future__ import annotations

import csv
from pathlib import Path

import lightning as L
import pytest
import torch
from hydra.utils import instantiate

import sentemb.losses.infonce
from sentemb.losses import InfoNCE, build
from sentemb.training.module import SentembModule
from sentemb.training.trainer import build_trainer
from tests.conftest import compose_train


@pytest.fixture
def stats_calls(monkeypatch) -> list[int]:
    """One entry per computation of InfoNCE's telemetry (the default loss)."""
    calls = []
    compute = sentemb.losses.infonce.paradigm_stats

    def counted(*args, **kwargs):
        calls.append(1)
        return compute(*args, **kwargs)

    monkeypatch.setattr(sentemb.losses.infonce, "paradigm_stats", counted)
    return calls


class StopAt(L.Callback):
    """A stop requested during a step, as a preemption signal's (sentemb.training.checkpoints) is."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_end(self, trainer: L.Trainer, *args) -> None:
        if trainer.global_step >= self.step:
            trainer.should_stop = True


def fit(small_corpus: Path, output_dir: Path, overrides: list[str], callbacks: list[L.Callback] = ()) -> list[dict]:
    """A tiny model trained through the configured Trainer, callbacks and a CSV logger (no dev evaluation): the
    logged rows."""
    cfg = compose_train(
        ["model=tiny", "logger=csv", f"data.corpus={small_corpus}", "data.batch_size=16", *overrides], output_dir
    )
    L.seed_everything(cfg.seed)
    module = SentembModule.from_config(cfg)
    datamodule = instantiate(cfg.data, tokenizer=module.encoder.tokenizer)
    build_trainer(cfg, extra_callbacks=list(callbacks)).fit(module, datamodule=datamodule)
    return list(csv.DictReader((output_dir / "csv" / "version_0" / "metrics.csv").open()))


def telemetry(rows: list[dict]) -> dict[int, dict[str, str]]:
    """step → its logged train/loss and paradigm/... values."""
    return {
        int(r["step"]): {k: v for k, v in r.items() if k == "train/loss" or k.startswith("paradigm/")}
        for r in rows
        if r.get("paradigm/cos_pos")
    }


def test_a_loss_computes_its_telemetry_when_read(stats_calls):
    z1, z2 = torch.randn(8, 16), torch.randn(8, 16)
    output = InfoNCE()(z1, z2)
    assert stats_calls == [], "not computed with the loss"
    assert 0.0 <= output.stats["gd"] <= 1.0 and set(output.stats) >= {"cos_pos", "uniformity", "hardest_share"}
    assert len(stats_calls) == 1, "computed once, on the first read"

    stats_calls.clear()
    summed = build("sum", terms={"a": {"weight": 1.0, "loss": "infonce"}, "b": {"weight": 0.5, "loss": "infonce"}})
    out = summed(z1, z2)
    assert stats_calls == [], "a sum's terms defer theirs too"
    assert out.stats["a/gd"] == out.stats["b/gd"] and len(stats_calls) == 2


def test_telemetry_only_on_logging_steps_by_default_and_every_step_one_flag_away(small_corpus, tmp_path, stats_calls):
    """~3 s: three fits (the default, the per-step flag, a stop) of a tiny model, 12 steps, no dev evaluation."""
    default = telemetry(fit(small_corpus, tmp_path / "default", ["trainer.max_steps=12"]))
    assert sorted(default) == [9], "logged (Lightning's step index) after the 10th step only: log_every_n_steps=10"
    assert len(stats_calls) == 1, "computed on the logging step only"

    stats_calls.clear()
    every = telemetry(fit(small_corpus, tmp_path / "every", ["trainer.max_steps=12", "trainer.log_every_n_steps=1"]))
    assert sorted(every) == list(range(12)) and len(stats_calls) == 12
    # the same run (seed, batches, dropout masks): the logging step's values are that step's, not a neighbour's
    assert default[9] == every[9]

    stats_calls.clear()
    stopped = telemetry(fit(small_corpus, tmp_path / "stopped", ["trainer.max_steps=12"], [StopAt(4)]))
    assert stopped == {3: every[3]} and len(stats_calls) == 1, "a stop's last step is logged, with its own values"
