"""A score that cannot be computed is refused, never recorded as NaN (sentemb.eval.scorable): input that leaves it
undefined (constant gold scores, fewer than two pairs, one class, no positive pair) when it is read, before any model
loads; a model whose output leaves it undefined (every pair's cosine equal) once encoded, with nothing written and a
training job recorded as `failed`. Issue 51's findings 4, 5 and 12 are the cases this class was found by."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from sentemb.common.errors import SentembConfigError
from sentemb.encoders.encoder import SentenceEncoder
from sentemb.eval.bootstrap import accuracy_interval, paired_spearman_difference, percentile_interval, spearman_interval
from sentemb.eval.scorable import UndefinedScore, finite_record
from sentemb.eval.sts import correlations, read_sick_split, read_sts_subset, read_stsb_split
from sentemb.eval.suite import evaluate
from sentemb.training.callbacks import STSBDevEvaluation
from tests.test_sts_suite import compose_eval

SICK_HEADER = "pair_ID\tsentence_A\tsentence_B\trelatedness_score\tentailment_judgment\n"


def stsb_rows(golds: list[float]) -> str:
    return "".join(f"g\tf\ty\t{i}\t{gold}\tsentence {i}\tother {i}\n" for i, gold in enumerate(golds))


# read: every STS reader refuses pairs no correlation can be computed on, naming the file


@pytest.mark.parametrize(("golds", "why"), [([3.0], "1 scored sentence pair"), ([2.5] * 6, "gold scores is 2.5")])
def test_every_sts_reader_refuses_pairs_without_a_correlation(golds, why, tmp_path):
    (tmp_path / "sts-dev.csv").write_text(stsb_rows(golds), encoding="utf-8")
    sick = "".join(f"{i}\ta {i}\tb {i}\t{gold}\tNEUTRAL\n" for i, gold in enumerate(golds))
    (tmp_path / "SICK_trial.txt").write_text(SICK_HEADER + sick, encoding="utf-8")
    (tmp_path / "STS.input.x.txt").write_text("".join(f"a {i}\tb {i}\n" for i in range(len(golds))), encoding="utf-8")
    (tmp_path / "STS.gs.x.txt").write_text("".join(f"{gold}\n" for gold in golds), encoding="utf-8")
    for read, path in [
        (lambda: read_stsb_split(tmp_path / "sts-dev.csv"), tmp_path / "sts-dev.csv"),
        (lambda: read_sick_split(tmp_path / "SICK_trial.txt"), tmp_path / "SICK_trial.txt"),
        (lambda: read_sts_subset(tmp_path, "x"), tmp_path / "STS.gs.x.txt"),
    ]:
        with pytest.raises(UndefinedScore) as refusal:
            read()
        assert str(refusal.value).startswith(f"{path}: ") and why in str(refusal.value)
        assert "Fix: restore the file" in str(refusal.value)


# after encoding: a model that gives every pair the same cosine


def test_constant_similarities_are_refused_naming_the_pairs_never_nan():
    gold = np.array([1.0, 2.0, 3.0])
    for cosines in (np.zeros(3), np.full(3, 0.7), np.array([0.1, math.nan, 0.2])):
        with pytest.raises(UndefinedScore, match=r"^STS-B dev \(x\.csv\): .*Fix: "):
            correlations(cosines, gold, "STS-B dev (x.csv)")
    assert correlations(np.array([0.1, 0.2, 0.3]), gold) == pytest.approx({"spearman": 100.0, "pearson": 100.0})


def test_intervals_and_accuracies_are_refused_where_undefined():
    gold = np.array([1.0, 2.0, 3.0, 4.0])
    with pytest.raises(UndefinedScore):
        spearman_interval(np.zeros(4), gold, resamples=20)
    with pytest.raises(UndefinedScore):
        paired_spearman_difference(np.arange(4.0), np.ones(4), gold, 0.0, resamples=20)
    with pytest.raises(UndefinedScore, match="intervals.resamples"):
        percentile_interval(50.0, np.full(3, math.nan))
    with pytest.raises(UndefinedScore, match="no test example"):
        accuracy_interval(np.array([], dtype=bool))


def collapsed(encoder: SentenceEncoder, sentences: list[str], **options) -> np.ndarray:
    """SentenceEncoder.encode of a model whose embeddings collapsed: every sentence the same vector."""
    return np.ones((len(sentences), 32), dtype=np.float32)


def test_evaluate_refuses_a_collapsed_model_and_writes_no_results(tmp_path, monkeypatch):
    """Finding 4's outcome (every Spearman NaN, exit 0, results.json with NaN) from any model that embeds every
    sentence alike: stopped once encoded, naming the task's file, nothing written."""
    monkeypatch.setattr(SentenceEncoder, "encode", collapsed)
    cfg = compose_eval(["model=tiny", "tasks=[STSBenchmark]", "sts_splits=[test]", "intervals.resamples=10"])
    with pytest.raises(UndefinedScore) as refusal:
        evaluate(cfg, tmp_path)
    assert "sts-test.csv: the model gives every one of its" in str(refusal.value)
    assert not (tmp_path / "results.json").exists() and not (tmp_path / "similarities.npz").exists()


def test_a_record_with_a_non_finite_number_is_refused_naming_its_key():
    record = {"sts": {"STS12": {"subsets": {"MSRpar": {"spearman": 71.0, "n": 750}}}}, "folds": [1.0, math.inf]}
    with pytest.raises(UndefinedScore, match=r"results\.json: folds\[1\] = inf"):
        finite_record(record, "results.json")
    record["folds"][1] = 2.0
    assert finite_record(record, "results.json") is record


# evaluate's other scores: transfer accuracies and alignment / uniformity, refused when read


def senteval_tree(root: Path) -> Path:
    """An empty data root with senteval/downstream/ (a test adds the task files it needs)."""
    downstream = root / "senteval" / "downstream"
    downstream.mkdir(parents=True)
    return downstream


@pytest.mark.usefixtures("forbid_model_loading")
@pytest.mark.parametrize(
    ("train", "why"),
    [
        (["DESC:manner how ?"] * 40, "every example has label 1"),
        (["DESC:manner how ?"] * 40 + ["NUM:date when ?"] * 3, "label 5 has 3 example(s)"),
    ],
)
def test_transfer_data_without_an_accuracy_is_refused_before_any_model_loads(train, why, tmp_path):
    downstream = senteval_tree(tmp_path / "data")
    (downstream / "TREC").mkdir()
    (downstream / "TREC" / "train_5500.label").write_text("\n".join(train) + "\n", encoding="latin-1")
    (downstream / "TREC" / "TREC_10.label").write_text("NUM:date when ?\nDESC:manner how ?\n", encoding="latin-1")
    cfg = compose_eval(["model=tiny", "tasks=[TREC]", f"paths.data_dir={tmp_path / 'data'}"])
    with pytest.raises(UndefinedScore) as refusal:
        evaluate(cfg, tmp_path / "out")
    assert str(refusal.value).startswith(f"{downstream / 'TREC' / 'train_5500.label'}: ") and why in str(refusal.value)


@pytest.mark.usefixtures("forbid_model_loading")
def test_an_stsb_split_without_a_positive_pair_is_refused_before_its_alignment_is_nan(tmp_path):
    downstream = senteval_tree(tmp_path / "data")
    stsb = downstream / "STS" / "STSBenchmark"
    stsb.mkdir(parents=True)
    (stsb / "sts-test.csv").write_text(stsb_rows([1.0, 2.0, 3.5]), encoding="utf-8")
    cfg = compose_eval(
        ["model=tiny", "tasks=[STSBenchmark]", "sts_splits=[test]", f"paths.data_dir={tmp_path / 'data'}"]
    )
    with pytest.raises(
        UndefinedScore, match=r"sts-test\.csv: no pair has a gold score of 4 .*align_uniform_split=null"
    ):
        evaluate(cfg, tmp_path / "out")


# training: a collapsed model at a dev evaluation fails the job; a NaN in a resumed dev history is refused


def test_a_training_job_whose_dev_cosines_are_all_equal_is_failed_not_ok(cli, tiny_overrides, tmp_path, monkeypatch):
    """Finding 5's outcome (NaN dev scores, a checkpoint "selected" at -inf, status ok), from a model that embeds every
    dev sentence alike: the job stops at that evaluation, recorded as failed with the reason (through `python -m
    sentemb.train`'s entry point: its record is what is checked)."""
    monkeypatch.setattr(SentenceEncoder, "encode", collapsed)
    with pytest.raises(SystemExit) as stopped:
        cli([*tiny_overrides, "trainer.max_steps=2", f"hydra.run.dir={tmp_path}"])
    record = json.loads((tmp_path / "metrics.json").read_text(encoding="utf-8"))
    assert record["status"] == "failed", record
    assert record["message"].startswith("UndefinedScore: the dev evaluation at step 2: STS-B dev (")
    assert "the same similarity" in str(stopped.value.code)
    assert not list((tmp_path / "checkpoints").glob("best-*.ckpt")), "no checkpoint kept at -inf"


@pytest.mark.parametrize("history", [[(2, math.nan)], [(2, 40.0), ("4", 41.0)], [(2, 40.0, 1)], "2:40"])
def test_a_resumed_dev_history_that_is_not_finite_scores_is_refused(history, tmp_path, small_stsb):
    evaluation = STSBDevEvaluation(small_stsb, senteval_dir=tmp_path)
    with pytest.raises(SentembConfigError, match=r"STSBDevEvaluation\.history.*Fix: "):
        evaluation.load_state_dict({"history": history})
    evaluation.load_state_dict({"history": [(2, 40.0), (4, 41)]})
    assert evaluation.best == (4, 41.0)


# the bootstrap's size: resamples x pairs draws, bounded by the machine's memory before any is drawn (compare's
# --resamples: tests/test_compare.py)


@pytest.mark.usefixtures("forbid_model_loading")
def test_evaluates_resamples_beyond_memory_are_refused_before_any_model_loads(tmp_path):
    downstream = senteval_tree(tmp_path / "data")
    stsb = downstream / "STS" / "STSBenchmark"
    stsb.mkdir(parents=True)
    (stsb / "sts-test.csv").write_text(stsb_rows([1.0, 2.0, 4.5, 5.0]), encoding="utf-8")
    overrides = ["model=tiny", "tasks=[STSBenchmark]", "sts_splits=[test]", f"paths.data_dir={tmp_path / 'data'}"]
    cfg = compose_eval([*overrides, "intervals.resamples=100000000000000"])
    with pytest.raises(SentembConfigError, match=r"intervals\.resamples=100000000000000: the bootstrap of 4 pairs"):
        evaluate(cfg, tmp_path / "out")


def test_trainings_resamples_beyond_memory_are_refused_when_its_evaluation_is_built(tmp_path, small_stsb):
    with pytest.raises(SentembConfigError, match=r"eval\.intervals\.resamples=10000000000000: the bootstrap of 200 "):
        STSBDevEvaluation(small_stsb, senteval_dir=tmp_path, intervals={"resamples": 10**13})
    STSBDevEvaluation(small_stsb, senteval_dir=tmp_path, intervals={"resamples": 1000})  # the default fits
