"""BERT-whitening against a NumPy SVD computation written out as Su et al.'s code does."""

from __future__ import annotations

import numpy as np
import pytest

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
