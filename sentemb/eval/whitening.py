"""BERT-whitening (Su et al. 2021): a post-hoc linear map that gives a corpus's embeddings zero mean and identity
covariance, optionally keeping the k directions of largest variance.

    μ = mean(x),   Σ = cov(x) = U S Uᵀ (SVD),   W = U S^{-1/2}[:, :k],   x̃ = (x − μ) W

Fitted on a corpus of sentences' embeddings (float64), applied before the cosine. Su et al.'s released code computes
Σ with `np.cov` (the N − 1 normalisation), which changes W by one constant factor and no cosine; so does this.
Directions with (near-)zero variance would blow up under S^{-1/2}: their variances are floored at `FLOOR` times the
largest (numerics: no division by ~0), which leaves every well-conditioned corpus's W exactly Su et al.'s. Embeddings
with no variance at all (one distinct sentence, or a model that embeds every sentence alike) have no whitening: the
corpus is refused when read (`whitening_corpus`), the embeddings once encoded (`Whitening.fit`), never a NaN map.

`check_whitening_dim`, `whitening_corpus`, `check_rank` and `check_dim_fits` are the one check of whitening= and
whitening_dim= that `python -m sentemb.evaluate` and `python -m sentemb.export` share.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from sentemb.common.errors import SentembConfigError
from sentemb.data.corpus import decoded
from sentemb.eval.scorable import UndefinedScore
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
        check_whitening_dim(key, dim)  # `key` names the whitening being fitted: only dim's own value is checked
        check_dim_fits(dim, x.shape[1])
        if not np.isfinite(x).all():
            raise UndefinedScore(f"{key}: the model's embeddings of its sentences are not all finite. {COLLAPSED}")
        mean = x.mean(axis=0)
        u, s, _ = np.linalg.svd(np.cov(x.T))
        if not s[0] > 0:  # every embedding the same: S^{-1/2} is infinite, and every whitened cosine NaN
            raise UndefinedScore(
                f"{key}: the model embeds all {x.shape[0]} of its sentences alike (no variance in any direction), "
                f"so there is no whitening to fit. {COLLAPSED}"
            )
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
COLLAPSED = "Fix: whiten a model whose embeddings tell the sentences apart (another checkpoint), or drop whitening="
WHITENING_FIX = (
    "Fix: whitening=<a text file, one sentence per line> (e.g. the wiki sample, wiki/wiki1m_head.txt under the data "
    "folder), or drop whitening="
)


def check_whitening_dim(setting: Any, dim: Any) -> None:
    """whitening_dim: the number of directions to keep, an integer from 1 (null: all), only with whitening=; checked
    before anything loads (its bound by the embedding's size: `check_dim_fits`, once that is known)."""
    if not setting and dim is not None:
        raise SentembConfigError(
            f"whitening_dim={dim} without whitening=: there is no whitening to keep directions of. Fix: add "
            "whitening=<a text file, one sentence per line>, or drop whitening_dim="
        )
    if dim is not None and (isinstance(dim, bool) or not isinstance(dim, int) or dim < 1):
        raise SentembConfigError(
            f"whitening_dim={dim!r}: the number of directions of largest variance to keep, an integer from 1 to the "
            "embedding's size; null keeps all"
        )


def check_dim_fits(dim: int | None, size: int) -> None:
    """whitening_dim against the embedding's size D (known once the encoder is: before any sentence is encoded)."""
    if dim is not None and dim > size:
        raise SentembConfigError(
            f"whitening_dim={dim}: more than the embedding's {size} dimensions. Fix: whitening_dim from 1 to {size}, "
            f"or null (all {size})"
        )


def embedding_size(encoder: Any, sentence: str) -> int:
    """D of `encoder`'s embeddings (anything with SentenceEncoder.encode), from one sentence encoded on its own."""
    return int(encoder.encode([sentence]).shape[1])


@dataclass(frozen=True)
class WhiteningCorpus:
    """whitening=<file>: its sentences (non-blank lines), how many are distinct, the file's sha256 and whitening_dim,
    read and checked before any model loads."""

    path: Path
    sentences: list[str]
    distinct: int
    sha256: str
    dim: int | None


def whitening_corpus(setting: Any, dim: int | None) -> WhiteningCorpus:
    """whitening=<file>: read (UTF-8 by line), counted and hashed before any model loads; refused without 2 distinct
    sentences, whose embeddings could vary in no direction at all (`check_rank`)."""
    path = Path(str(setting)).expanduser()
    if not path.is_file():
        raise SentembConfigError(f"whitening={setting}: no such file. {WHITENING_FIX}")
    sentences = corpus_sentences(path)  # non-blank lines, UTF-8 checked by line; fewer than 2 refused there
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    corpus = WhiteningCorpus(path, sentences, len(set(sentences)), digest.hexdigest(), dim)
    check_rank(corpus, 1, "any whitening")
    return corpus


def check_rank(corpus: WhiteningCorpus, keep: int, which: str) -> None:
    """Keeping `keep` directions needs `keep` + 1 distinct sentences (n embeddings span n - 1 directions)."""
    if corpus.distinct >= keep + 1:
        return
    smaller = f", or whitening_dim=<at most {corpus.distinct - 1}>" if corpus.distinct > 1 else ""
    raise SentembConfigError(
        f"whitening={corpus.path}: {corpus.distinct} distinct sentences, and {which} keeps {keep} directions, which "
        f"needs at least {keep + 1}: the embeddings of n sentences vary in n - 1 directions at most, the others have "
        f"no variance to divide by (evaluate's fit floors them at {FLOOR:g} x the largest; a shipped model would "
        f"scale its noise up by ~1e6 there). Fix: a corpus of at least {keep + 1} distinct sentences{smaller}"
    )


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
