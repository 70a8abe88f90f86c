"""One name per metric: conf/ names only metrics sentemb/common/metric_names.py defines, and old records still read."""

from __future__ import annotations

import logging
import re

import pytest
from hydra.utils import instantiate

from sentemb.common.errors import SentembConfigError
from sentemb.common.metric_names import (
    DEV_SPEARMAN,
    DEV_SPEARMAN_BEST_LOGGED,
    DEV_SPEARMAN_BEST_RESCORED,
    METRIC_NAMES,
    OLD_NAMES,
    TEST_SPEARMAN,
    check_metric_name,
    read_metric,
)
from tests.conftest import CONF_DIR, compose_train

# a metric name as conf/ writes it, in a value or a comment: `stsb/` and what follows up to a space, `)` or `,`
NAME_IN_YAML = re.compile(r"\bstsb/[^\s),'\"]+")
# a record written before today's names, as metrics.json held it (callbacks=default, the best checkpoint rescored)
OLD_RECORD = {
    "stsb/best_dev_spearman": 82.5,
    "stsb/test_spearman": 78.25,
    "stsb/test_pearson": 77.0,
    "stsb/best_step": 250,
    "best_checkpoint": "checkpoints/best-step250.ckpt",
    "stsb/dev_spearman_best": 82.5,
    "scored_weights": "best",
}


def test_every_metric_name_in_conf_is_one_the_module_defines():
    found = {
        (path.relative_to(CONF_DIR).as_posix(), name)
        for path in CONF_DIR.rglob("*.yaml")
        for name in NAME_IN_YAML.findall(path.read_text(encoding="utf-8"))
    }
    assert {"train.yaml", "callbacks/default.yaml"} <= {path for path, _ in found}, "the scan finds the names"
    assert not [(path, name) for path, name in found if name not in METRIC_NAMES], f"not in METRIC_NAMES: {found}"


@pytest.mark.parametrize("overrides", [[], ["hparams_search=optuna"]], ids=["default", "optuna"])
def test_what_sweeps_optimise_and_what_the_checkpoint_monitors_are_the_logged_names(overrides, tmp_path):
    cfg = compose_train(overrides, tmp_path)
    assert cfg.optimized_metric == DEV_SPEARMAN_BEST_LOGGED
    # the key STSBDevEvaluation logs at every evaluation, so ModelCheckpoint finds the score it keeps the best of
    assert instantiate(cfg.callbacks.model_checkpoint).monitor == DEV_SPEARMAN


def test_the_old_names_map_onto_todays_and_none_is_reused():
    assert set(OLD_NAMES.values()) <= set(METRIC_NAMES)
    assert not set(OLD_NAMES) & set(METRIC_NAMES), "an old name that is also a current one would be read twice"
    assert len(set(OLD_NAMES.values())) == len(OLD_NAMES), "two old names for one metric"


def test_an_old_record_is_read_by_todays_names(tmp_path):
    # what a restart's skip returns: the record's optimized metric, here by the default optimized_metric
    cfg = compose_train([], tmp_path)
    assert read_metric(OLD_RECORD, cfg.optimized_metric) == 82.5
    assert read_metric(OLD_RECORD, DEV_SPEARMAN_BEST_RESCORED) == 82.5
    assert read_metric(OLD_RECORD, TEST_SPEARMAN) == 78.25
    new = {DEV_SPEARMAN_BEST_LOGGED: 80.0, TEST_SPEARMAN: 75.0}
    assert read_metric(new, "stsb/dev_spearman_best") == 80.0, "an old optimized_metric reads a new record too"
    assert read_metric(new, DEV_SPEARMAN_BEST_RESCORED) is None, "absent (callbacks=none): None, as dict.get"
    assert read_metric(OLD_RECORD, None) is None and read_metric(OLD_RECORD, "") is None  # optimized_metric: null


def test_an_old_optimized_metric_still_works_and_says_its_new_name(caplog):
    with caplog.at_level(logging.WARNING, logger="sentemb.common.metric_names"):
        assert check_metric_name("stsb/dev_spearman_best") == DEV_SPEARMAN_BEST_LOGGED
    assert f"optimized_metric=stsb/dev_spearman_best is the old name of {DEV_SPEARMAN_BEST_LOGGED}" in caplog.text
    assert check_metric_name(DEV_SPEARMAN_BEST_LOGGED) == DEV_SPEARMAN_BEST_LOGGED


def test_a_name_no_metric_has_is_refused_with_the_names_there_are():
    with pytest.raises(SentembConfigError, match=r"optimized_metric=stsb/dev/spearman_bets: no training job .*Fix: "):
        check_metric_name("stsb/dev/spearman_bets")
    with pytest.raises(SentembConfigError, match=re.escape(DEV_SPEARMAN_BEST_LOGGED)):
        read_metric(OLD_RECORD, "stsb/dev_spearman_bets")
