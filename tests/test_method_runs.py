"""Every method's tiny preset (`sncse/tiny`, `hicl/sncse_tiny`, ...) trains through the real Trainer, callbacks,
loggers and checkpoints, and each method's own part is active in it (the queue filled, the margin loss and the local
loss logged)."""

from __future__ import annotations

import csv
import math
from pathlib import Path

import pytest
import torch

from sentemb.common.metric_names import DEV_SPEARMAN_BEST_RESCORED, TEST_SPEARMAN
from tests.test_train import run

# esimcse/tiny runs in make test; the others (10–20 s each on 2 cores) in make test-slow
PRESETS = {
    "esimcse/tiny": ("queue",),
    "sncse/tiny": ("train/loss/soft_negative",),
    "hicl/simcse_tiny": ("train/loss/local",),
    "hicl/esimcse_tiny": ("train/loss/local", "queue"),
    "hicl/sncse_tiny": ("train/loss/local", "train/loss/soft_negative"),
    "sarcse/tiny": ("train/loss/reconstruction",),
    "diffcse/tiny": ("train/loss/rtd",),
    "focal/diffcse_tiny": ("train/loss/rtd",),
    "dclr/tiny": ("train/dclr/excluded_share",),
    "focal/dclr_tiny": ("train/dclr/excluded_share",),
}


def logged_names(run_dir: Path) -> set[str]:
    rows = csv.DictReader((run_dir / "csv" / "version_0" / "metrics.csv").open())
    return {name for row in rows for name, value in row.items() if value}


@pytest.mark.parametrize(
    "preset", [p if p == "esimcse/tiny" else pytest.param(p, marks=pytest.mark.slow) for p in PRESETS]
)
def test_every_tiny_method_preset_trains_with_its_own_part_active(preset, small_corpus, tmp_path):
    metrics = run(
        [f"experiment={preset}", "logger=csv", f"data.corpus={small_corpus}", "trainer.max_steps=4",
         "eval.every_n_steps=2", "eval.at_start=false", "trainer.log_every_n_steps=1"],
        tmp_path,
    )  # fmt: skip
    for name in (DEV_SPEARMAN_BEST_RESCORED, TEST_SPEARMAN):
        assert math.isfinite(metrics[name]), name
    names = logged_names(tmp_path)
    for expected in PRESETS[preset]:
        if expected == "queue":  # the momentum encoder and its queue travel in the checkpoint
            state = torch.load(tmp_path / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)
            queue = state["state_dict"]["negatives._extra_state"]["queue"]
            assert queue.shape[0] > 0 and any(k.startswith("negatives.backbone.") for k in state["state_dict"])
        else:
            assert expected in names, f"{preset}: {expected} not logged ({sorted(names)})"
