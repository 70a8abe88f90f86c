"""BERT-whitening against a NumPy SVD computation written out as Su et al.'s code does."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from sentemb.common.errors import SentembConfigError
from sentemb.eval.whitening import Whitening


def su_et_al(vecs: np.ndarray, k: int | None) -> tuple[np.ndarray, np.ndarray]:
    """compute_kernel_bias of the released BERT-whitening code, in its own steps."""
    mu = vecs.mean(axis=0, keepdims=True)
    cov = np.cov(vecs.T)
    u, s, _ = np.linalg.svd(cov)
    w = np.dot(u, np.diag(1 / np.sqrt(s)))
    return w[:, :k], -mu


@pytest.mark.parametrize("k", [None, 4])
def test_whitening_equals_the_numpy_svd_computation(k):
    rng = np.random.default_rng(0)
    vecs = rng.normal(size=(200, 8)) @ rng.normal(size=(8, 8)) + rng.normal(size=8)  # correlated, off-centre
    kernel, bias = su_et_al(vecs, k)
    fitted = Whitening.fit(vecs, k)
    got, expected = fitted.transform(vecs), (vecs + bias) @ kernel
    # the same float64 operations in another grouping: equal to ~1e-12
    np.testing.assert_allclose(got, expected, rtol=1e-10, atol=1e-10)
    assert got.shape == (200, k or 8)


def test_whitened_embeddings_have_zero_mean_and_identity_covariance():
    rng = np.random.default_rng(1)
    vecs = rng.normal(size=(500, 6)) @ rng.normal(size=(6, 6))
    out = Whitening.fit(vecs).transform(vecs)
    np.testing.assert_allclose(out.mean(axis=0), 0.0, atol=1e-10)  # float64 sums of 500 rows
    np.testing.assert_allclose(np.cov(out.T), np.eye(6), atol=1e-8)


def test_a_degenerate_corpus_stays_finite():
    vecs = np.repeat(np.random.default_rng(2).normal(size=(1, 5)), 10, axis=0)  # every sentence the same
    vecs[:5, 0] += 1.0  # one direction of variance, four of none
    assert np.isfinite(Whitening.fit(vecs).transform(vecs)).all()


BAD = [(np.zeros((1, 4)), None, "at least 2"), (np.zeros((3, 4)), 9, "dim")]


@pytest.mark.parametrize(("vecs", "dim", "message"), BAD)
def test_bad_fits_are_refused(vecs, dim, message):
    with pytest.raises(SentembConfigError, match=message):
        Whitening.fit(vecs, dim)


def test_evaluate_whitens_each_task_on_its_own_sentences_or_on_a_corpus(tmp_path, data_root):
    from scipy.stats import spearmanr

    from sentemb.eval.sts import load_sts_task, pairwise_cosine
    from sentemb.eval.suite import evaluate
    from tests.test_sts_suite import compose_eval

    base = ["model=tiny", "tasks=[STSBenchmark]", "sts_splits=[test]", "intervals.resamples=10"]
    torch.manual_seed(0)
    plain = evaluate(compose_eval(base), tmp_path / "plain")
    torch.manual_seed(0)  # the tiny model's random weights: the same in evaluate and in the computation by hand
    task = evaluate(compose_eval([*base, "whitening=task", "whitening_dim=16"]), tmp_path / "task")
    assert task["whitening"] == {"fitted_on": "task", "dim": 16, "tasks": ["STSBenchmark"]}
    # the same numbers by hand: the unwhitened embeddings (from the plain run's encoder, rebuilt the same way) fitted
    # and mapped here, then the cosine Spearman of the test pairs
    from sentemb.eval.cache import EmbeddingCache
    from sentemb.eval.suite import load_encoder

    pairs = load_sts_task(data_root / "senteval" / "downstream", "STSBenchmark", ["test"])["test"]
    torch.manual_seed(0)
    encoder, _, _ = load_encoder(compose_eval(base), torch.device("cpu"), None)
    cache = EmbeddingCache(encoder, show_progress=False)
    sentences = list(dict.fromkeys(pairs.first + pairs.second))
    fitted = Whitening.fit(cache(sentences), 16)
    cosine = pairwise_cosine(fitted.transform(cache(pairs.first)), fitted.transform(cache(pairs.second)))
    expected = 100 * spearmanr(cosine, pairs.gold).statistic
    got = task["sts"]["STSBenchmark"]["subsets"]["test"]["spearman"]
    assert got == pytest.approx(expected, abs=1e-6)  # the same float computations; ranks of equal cosines
    # the same weights unwhitened score otherwise: the map is applied
    assert got != pytest.approx(plain["sts"]["STSBenchmark"]["subsets"]["test"]["spearman"], abs=1e-3)
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(sentences[:300]) + "\n", encoding="utf-8")
    on_corpus = evaluate(compose_eval([*base, f"whitening={corpus}"]), tmp_path / "corpus")
    assert on_corpus["whitening"]["fitted_on"] == str(corpus)


def test_a_missing_whitening_corpus_is_refused_before_any_model_loads(tmp_path, forbid_model_loading):
    from sentemb.eval.suite import evaluate
    from tests.test_sts_suite import compose_eval

    with pytest.raises(SentembConfigError, match="whitening=.*no such file"):
        evaluate(compose_eval(["model=tiny", "tasks=[STSBenchmark]", f"whitening={tmp_path}/none.txt"]), tmp_path)


def compose_whitening(overrides: list[str]):
    from tests.test_sts_suite import compose_eval

    return compose_eval(["model=tiny", "tasks=[STSBenchmark]", "sts_splits=[test]", *overrides])


@pytest.mark.usefixtures("forbid_model_loading")
def test_a_corpus_of_identical_lines_is_refused_before_any_model_loads(tmp_path):
    """Issue 51, finding 4: every Spearman NaN, exit 0, NaN in results.json and all-zero cosines in similarities.npz;
    refused when the corpus is read (as export refuses it), nothing written."""
    from sentemb.eval.suite import evaluate

    corpus = tmp_path / "c200.txt"
    corpus.write_text("The same sentence, every line.\n" * 200, encoding="utf-8")
    with pytest.raises(
        SentembConfigError, match=rf"^whitening={corpus}: 1 distinct sentences.*Fix: a corpus of at least"
    ):
        evaluate(compose_whitening([f"whitening={corpus}"]), tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_embeddings_without_any_variance_have_no_whitening():
    """Distinct sentences that a model embeds alike: refused once encoded, never a NaN map (finding 4's other way)."""
    from sentemb.eval.scorable import UndefinedScore

    with pytest.raises(UndefinedScore, match=r"^whitening \(STS12\): the model embeds all 10 of its sentences alike"):
        Whitening.fit(np.ones((10, 4)), None, "whitening (STS12)")
    with pytest.raises(UndefinedScore, match="not all finite"):
        Whitening.fit(np.full((10, 4), np.nan), None, "whitening (STS12)")


@pytest.mark.usefixtures("forbid_model_loading")
@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["whitening=task", "whitening_dim=0"], r"^whitening_dim=0: the number of directions"),
        (["whitening=task", "whitening_dim=true"], r"^whitening_dim=True: the number of directions"),
        (["whitening_dim=8"], r"^whitening_dim=8 without whitening=: .*Fix: "),
    ],
)
def test_a_bad_whitening_dim_is_refused_by_its_key_before_any_model_loads(overrides, message, tmp_path):
    """Issue 51, finding 9: refused only after every sentence was encoded, naming `whitening=/…/c200.txt.dim=0`; or,
    without whitening=, silently ignored. Now export's own check, before anything loads."""
    from sentemb.eval.suite import evaluate

    with pytest.raises(SentembConfigError, match=message):
        evaluate(compose_whitening(overrides), tmp_path)


def test_a_whitening_dim_past_the_embedding_is_refused_before_any_sentence_is_encoded(tmp_path, monkeypatch):
    from sentemb.eval.cache import EmbeddingCache
    from sentemb.eval.suite import evaluate

    def encoded(*args, **kwargs):
        raise AssertionError("the sentences were encoded before whitening_dim was checked")

    monkeypatch.setattr(EmbeddingCache, "prefetch", encoded)
    with pytest.raises(SentembConfigError, match=r"^whitening_dim=33: more than the embedding's 32 dimensions. Fix: "):
        evaluate(compose_whitening(["whitening=task", "whitening_dim=33"]), tmp_path)  # model=tiny: 32 wide
