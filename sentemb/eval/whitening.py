"""BERT-whitening (Su et al. 2021): a post-hoc linear map that gives a corpus's embeddings zero mean and identity
covariance, optionally keeping the k directions of largest variance.

    μ = mean(x),   Σ = cov(x) = U S Uᵀ (SVD),   W = U S^{-1/2}[:, :k],   x̃ = (x − μ) W

Fitted on a corpus of sentences' embeddings (float64), applied before the cosine. Su et al.'s released code computes
Σ with `np.cov` (the N − 1 normalisation), which changes W by one constant factor and no cosine; so does this.
Directions with (near-)zero variance would blow up under S^{-1/2}: their variances are floored at `FLOOR` times the
largest (numerics: no division by ~0), which leaves every well-conditioned corpus's W exactly Su et al.'s.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from sentemb.common.errors import SentembConfigError

FLOOR = 1e-12  # relative floor of a variance before S^{-1/2}


@dataclass(frozen=True)
class Whitening:
    """μ (D,) and W (D, k) of BERT-whitening; `transform` maps (N, D) embeddings to (N, k)."""

    mean: np.ndarray
    matrix: np.ndarray

    @classmethod
    def fit(cls, embeddings: np.ndarray, dim: int | None = None, key: str = "whitening") -> Whitening:
        """μ and W of `embeddings` (N, D), keeping `dim` directions (None: all D)."""
        x = np.asarray(embeddings, dtype=np.float64)
        if x.ndim != 2 or x.shape[0] < 2:
            raise SentembConfigError(
                f"{key}: whitening needs at least 2 sentences' embeddings to fit a covariance, got {x.shape}"
            )
        if dim is not None and not (isinstance(dim, int) and 1 <= dim <= x.shape[1]):
            raise SentembConfigError(f"{key}.dim={dim} must be an integer from 1 to the embedding size {x.shape[1]}")
        mean = x.mean(axis=0)
        u, s, _ = np.linalg.svd(np.cov(x.T))
        scale = 1.0 / np.sqrt(np.maximum(s, FLOOR * s[0]))  # S^{-1/2}, its near-zero variances floored
        return cls(mean, (u * scale)[:, :dim])

    def transform(self, embeddings: np.ndarray) -> np.ndarray:
        """x̃ = (x − μ) W, in float64 then back to the input's float type."""
        x = np.asarray(embeddings)
        return ((x.astype(np.float64) - self.mean) @ self.matrix).astype(x.dtype, copy=False)
