"""BERT-whitening (Su et al. 2021): a post-hoc linear map that gives a corpus's embeddings zero mean and identity
covariance, optionally keeping the k directions of largest variance.

    μ = mean(x),   Σ = cov(x) = U S Uᵀ (SVD),   W = U S^{-1/2}[:, :k],   x̃ = (x − μ) W

Fitted on a corpus of sentences' embeddings (float64), applied before the cosine. Su et al.'s released code computes
Σ with `np.cov` (the N − 1 normalisation), which changes W by one constant factor and no cosine; so does this.
Directions with (near-)zero variance would blow up under S^{-1/2}: their variances are floored at `FLOOR` times the
largest (numerics: no division by ~0), which leaves every well-conditioned corpus's W exactly Su et al.'s.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from sentemb.common.errors import SentembConfigError
from sentemb.data.corpus import decoded
from sentemb.eval.sts import SentencePairs

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

    def variances(self) -> np.ndarray:
        """The fitted variance of each kept direction (k,), largest first: W's columns are u_i / sqrt(s_i) with unit
        u_i, so s_i = 1 / |W[:, i]|² (a direction whose variance was floored reads `FLOOR` times the largest)."""
        return 1.0 / np.square(self.matrix).sum(axis=0)

    def affine(self, dtype: type = np.float32) -> tuple[np.ndarray, np.ndarray]:
        """The same map as one linear layer, y = x Aᵀ + b: (A = Wᵀ (k, D), b = −μ W (k,)), b computed in float64,
        both then cast to `dtype` (what torch's `nn.Linear`, sentence-transformers' `Dense` and an ONNX Gemm hold)."""
        return np.ascontiguousarray(self.matrix.T, dtype=dtype), (-(self.mean @ self.matrix)).astype(dtype)


TASK = "task"  # whitening=task: each STS task's map fitted on that task's own sentences


class WhitenedEmbed:
    """An `Embed` (sentences → embeddings) followed by a fitted whitening."""

    def __init__(self, embed: Callable[[list[str]], np.ndarray], whitening: Whitening) -> None:
        self.embed, self.whitening = embed, whitening

    def __call__(self, sentences: list[str]) -> np.ndarray:
        return self.whitening.transform(self.embed(sentences))


def corpus_sentences(path: str | Path, key: str = "whitening") -> list[str]:
    """The non-blank lines of a corpus to fit a whitening on (one sentence per line, UTF-8): data, never config."""
    path = Path(path).expanduser()
    if not path.is_file():
        raise SentembConfigError(
            f"{key}={path}: no such file. Fix: {key}=task (each STS task's own sentences) or {key}=<a text file "
            "with one sentence per line>, e.g. the wiki sample"
        )
    with path.open("rb") as handle:
        sentences = [
            text.strip() for number, raw in enumerate(handle, 1) if (text := decoded(raw, path, number)).strip()
        ]
    if len(sentences) < 2:
        raise SentembConfigError(f"{key}={path}: {len(sentences)} sentence(s); a whitening needs at least 2")
    return sentences


def task_sentences(subsets: Mapping[str, SentencePairs]) -> list[str]:
    """Every distinct sentence of an STS task's scored pairs (all its subsets or splits)."""
    return list(dict.fromkeys(s for pairs in subsets.values() for s in pairs.first + pairs.second))


def whitened_embeds(
    setting: str | None,
    dim: int | None,
    sts_data: Mapping[str, Mapping[str, SentencePairs]],
    embed: Callable[[list[str]], np.ndarray],
    corpus: list[str] | None = None,
) -> dict[str, Callable[[list[str]], np.ndarray]]:
    """Each STS task's embed: `embed` itself (no whitening), whitened by a map fitted on `corpus` (whitening=<file>),
    or by one fitted on the task's own sentences (whitening=task)."""
    if not setting:
        return {task: embed for task in sts_data}
    if setting == TASK:
        return {
            task: WhitenedEmbed(embed, Whitening.fit(embed(task_sentences(subsets)), dim, f"whitening ({task})"))
            for task, subsets in sts_data.items()
        }
    shared = Whitening.fit(embed(corpus or []), dim, f"whitening={setting}")
    return {task: WhitenedEmbed(embed, shared) for task in sts_data}
