"""Transfer-task readers and SentEval's fold/selection logic on small constructed data."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.linear_model import LogisticRegression
from sklearn.model_selection import StratifiedKFold, cross_val_score

from sentemb.common.errors import SentembConfigError
from sentemb.eval.bootstrap import Resampling
from sentemb.eval.transfer import (
    KFOLD_C,
    SEED,
    held_out_interval,
    inner_kfold,
    kfold_then_test,
    mrpc_features,
    read_binary,
    read_trec,
    run_transfer_task,
    split_validation,
)


def noisy_blobs(n: int, seed: int, separation: float = 1.0):
    rng = np.random.default_rng(seed)
    y = np.arange(n) % 2
    x = rng.normal(size=(n, 5)) + separation * y[:, None]
    return x, y


def test_binary_reader_orders_by_token_count_then_label(tmp_path):
    (tmp_path / "p").write_text("b  b\na\n", encoding="latin-1")
    (tmp_path / "n").write_bytes("d d d\nc\xe9\n".encode("latin-1"))  # latin-1 as SentEval reads it
    data = read_binary(tmp_path, "p", "n")
    assert data.first == ["cé", "a", "b b", "d d d"] and data.labels.tolist() == [0, 1, 1, 0]


def test_trec_reader_uses_coarse_class_and_drops_the_fine_one(tmp_path):
    (tmp_path / "t").write_text("NUM:date When was it ?\nHUM:ind Who ?\n", encoding="latin-1")
    data = read_trec(tmp_path / "t")
    assert data.first == ["Who ?", "When was it ?"] and data.labels.tolist() == [3, 5]
    (tmp_path / "t").write_text("NUM:date When ?\nFOO:x bad\n", encoding="latin-1")
    with pytest.raises(SentembConfigError, match=r"t:2: expected 'CLASS:fine question'"):
        read_trec(tmp_path / "t")


def test_kfold_then_test_matches_an_independent_selection():
    x, y = noisy_blobs(120, 0)
    test_x, test_y = noisy_blobs(60, 1)
    scores, predicted = kfold_then_test(x, y, test_x, test_y, 5, KFOLD_C)
    folds = StratifiedKFold(n_splits=5, shuffle=True, random_state=SEED)
    cv = [
        round(100 * cross_val_score(LogisticRegression(C=c, max_iter=1000), x, y, cv=folds).mean(), 2) for c in KFOLD_C
    ]
    best = KFOLD_C[int(np.argmax(cv))]
    reference = LogisticRegression(C=best, max_iter=1000).fit(x, y)  # refit on all of train
    # exact: the same scikit-learn fits on the same arrays (lbfgs is deterministic), rounded the same way
    assert scores["devacc"] == max(cv)
    assert scores["acc"] == round(100 * reference.score(test_x, test_y), 2)
    assert np.array_equal(predicted, reference.predict(test_x))


def test_split_validation_chooses_c_on_dev():
    train, dev, test = noisy_blobs(80, 2), noisy_blobs(40, 3), noisy_blobs(40, 4)
    cs = (1e-4, 1.0)
    result, predicted = split_validation(train, dev, test, cs)
    dev_scores = [round(100 * LogisticRegression(C=c, max_iter=1000).fit(*train).score(*dev), 2) for c in cs]
    chosen = cs[int(np.argmax(dev_scores))]
    # exact: the same scikit-learn fits on the same arrays, as above
    assert result["devacc"] == max(dev_scores)
    assert result["acc"] == round(100 * LogisticRegression(C=chosen, max_iter=1000).fit(*train).score(*test), 2)
    assert np.array_equal(predicted, LogisticRegression(C=chosen, max_iter=1000).fit(*train).predict(test[0]))


def test_inner_kfold_on_separable_and_on_random_labels():
    x, y = noisy_blobs(100, 5, separation=10.0)
    separable = inner_kfold(x, y, 5, (1.0,))
    assert (separable["devacc"], separable["acc"], separable["folds"]) == (100.0, 100.0, [100.0] * 5)
    assert separable["interval"] == {"estimate": 100.0, "low": 100.0, "high": 100.0}  # no spread over folds
    rng = np.random.default_rng(6)
    chance = inner_kfold(rng.normal(size=(200, 5)), rng.integers(0, 2, 200), 5, (0.25, 1.0))
    assert 30 < chance["acc"] < 70, "labels independent of the features: about chance"
    # the t-interval of the outer folds' test accuracies (t_{4, 0.975} = 2.7764)
    half = 2.7764451051977987 * np.std(chance["folds"], ddof=1) / np.sqrt(5)
    assert chance["interval"]["low"] == pytest.approx(np.mean(chance["folds"]) - half)
    assert chance["interval_kind"] == "t over 5 folds"


def test_held_out_interval_resamples_the_test_examples():
    labels = np.array([0, 1] * 100)
    predicted = labels.copy()
    predicted[:30] = 1 - predicted[:30]  # 85% correct
    result = held_out_interval(predicted, labels, Resampling(resamples=1000, seed=3))
    assert result["interval"]["estimate"] == pytest.approx(85.0)
    assert result["interval"]["low"] < 85.0 < result["interval"]["high"]
    assert result["interval_kind"] == "bootstrap over 200 test examples"


def test_mrpc_features_follow_senteval_or_concat():
    a, b = np.array([[1.0, -2.0]]), np.array([[3.0, 1.0]])
    assert mrpc_features(a, b).tolist() == [[2.0, 3.0, 3.0, -2.0]]
    assert mrpc_features(a, b, "concat").shape == (1, 8)


def test_unknown_mode_is_refused():
    with pytest.raises(SentembConfigError, match="mode"):
        run_transfer_task("MR", {}, lambda s: s, mode="quick")
