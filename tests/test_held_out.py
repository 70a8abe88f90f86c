"""What a training job scores after training: STS-B test always, the STS tasks of eval.test_tasks, each with its
bootstrap interval; read before the model loads."""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from sentemb.common.errors import SentembConfigError
from sentemb.common.metric_names import (
    TEST_ALIGNMENT,
    TEST_PEARSON,
    TEST_SPEARMAN,
    TEST_UNIFORMITY,
    interval_names,
    sts_test_metric,
)
from sentemb.encoders.build import build_encoder
from sentemb.eval.bootstrap import Resampling
from sentemb.eval.held_out import HeldOutTasks, checked_test_tasks
from sentemb.eval.sts import STS_TASKS, STSBenchmark
from sentemb.train import train
from tests.conftest import compose_train


def test_test_tasks_expand_sts_and_always_score_stsb_first():
    assert checked_test_tasks("sts") == ["STSBenchmark", *[t for t in STS_TASKS if t != "STSBenchmark"]]
    assert checked_test_tasks(["STS16"]) == ["STSBenchmark", "STS16"]
    assert checked_test_tasks("SICKRelatedness,STS12") == ["STSBenchmark", "SICKRelatedness", "STS12"]
    with pytest.raises(SentembConfigError, match=r"eval.test_tasks: unknown STS task\(s\) \['STS17'\].*Fix"):
        checked_test_tasks(["STS17"])


def tiny_encoder():
    cfg = compose_train(["model=tiny"])
    model = OmegaConf.to_container(cfg.model, resolve=True)
    return build_encoder(model, OmegaConf.to_container(cfg.pooling, resolve=True)).eval()


def test_other_tasks_leave_stsb_test_as_it_was(small_stsb, data_root):
    # each task is encoded on its own sentences: adding STS16 cannot move STS-B test's number (same computation)
    stsb = small_stsb
    senteval = data_root / "senteval" / "downstream"
    encoder = tiny_encoder()
    alone, _ = HeldOutTasks(stsb, senteval, ["STSBenchmark"], Resampling(resamples=200)).score(encoder, 64)
    both, cosines = HeldOutTasks(stsb, senteval, ["STS16"], Resampling(resamples=200)).score(encoder, 64)
    assert {k: v for k, v in both.items() if not k.startswith("sts/")} == alone
    assert alone[TEST_SPEARMAN] == STSBenchmark(stsb, ("test",)).evaluate(encoder, 64)["test"]["spearman"]
    assert set(both) == {
        TEST_SPEARMAN, TEST_PEARSON, *interval_names(TEST_SPEARMAN), TEST_ALIGNMENT, TEST_UNIFORMITY,
        sts_test_metric("STS16"), *interval_names(sts_test_metric("STS16")),
    }  # fmt: skip
    low, high = (both[name] for name in interval_names(sts_test_metric("STS16")))
    assert low < both["sts/STS16/spearman"] < high
    assert set(cosines["STS16"]) == {"answer-answer", "headlines", "plagiarism", "postediting", "question-question"}


def test_a_job_with_test_tasks_records_each_with_its_interval(tiny_overrides, small_stsb, data_root, tmp_path):
    overrides = [*tiny_overrides, f"eval.stsb_dir={small_stsb}", "eval.test_tasks=[STS16]", "eval.intervals.seed=7"]
    metrics = train(compose_train(overrides, output_dir=tmp_path))
    for name in (TEST_SPEARMAN, sts_test_metric("STS16")):
        low, high = (metrics[bound] for bound in interval_names(name))
        assert low < metrics[name] < high
    assert (tmp_path / "similarities.npz").is_file()


def test_an_unknown_test_task_or_interval_setting_stops_before_the_model(
    tiny_overrides, tmp_path, forbid_model_loading
):
    with pytest.raises(SentembConfigError, match="eval.test_tasks: unknown STS task"):
        train(compose_train([*tiny_overrides, "eval.test_tasks=[STS17]"], output_dir=tmp_path))
    with pytest.raises(SentembConfigError, match=r"eval.intervals.resamples=-3: a positive whole number.*Fix"):
        train(compose_train([*tiny_overrides, "eval.intervals.resamples=-3"], output_dir=tmp_path))
    assert not (tmp_path / "metrics.json").exists()
