"""Evaluation and export at a Matryoshka size: `eval.truncate_dim=<d>` (training, `python -m sentemb.evaluate`) and
export's `truncate_dim=<d>`. The embedding is computed whole, then its first d dimensions are kept; the cosine
renormalises them (sentence-transformers' `truncate_embeddings`: `embeddings[..., :truncate_dim]`, then its cosine).

`size_scores` is a run's table of every trained size (`matryoshka.dims`): each STS-B split encoded once, each size's
cosines computed from the prefixes of those same embeddings.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from sentemb.common.errors import SentembConfigError
from sentemb.common.numbers import require_whole
from sentemb.losses.matryoshka import SIZES

log = logging.getLogger(__name__)
TOY_WIDTH = 8  # a head is built at this width to read its output size (training/checks.py builds it so too)


def check_truncate_dim(value: Any, key: str, width: int | None, trained: Sequence[int] | None = None) -> int | None:
    """`key` (e.g. eval.truncate_dim): null, or a whole number ≥ 1 no wider than the sentence vector (`width`, where
    known). A size the checkpoint's `matryoshka.dims` did not train is warned about, not refused: any prefix is an
    embedding, and measuring an untrained size is a fair question (MRL's interpolated sizes, Kusupati et al. 2022)."""
    if value is None:
        return None
    size = require_whole(key, value, SIZES, f"{key}=<a size of at least 1>, e.g. {key}=96, or {key}=null")
    if width is not None and size > width:
        raise SentembConfigError(
            f"{key}={size} is wider than the sentence vector ({width} dimensions). Fix: {key}=<1..{width}>, or "
            f"{key}=null (the whole vector)"
        )
    if trained and size not in trained:
        log.warning(
            "%s=%d: the model was trained with matryoshka.dims=%s, which do not include %d; its first %d dimensions "
            "were never trained as an embedding on their own",
            key, size, list(trained), size, size,
        )  # fmt: skip
    return size


def sentence_width(model: Mapping[str, Any], head: Any = None) -> int | None:
    """The sentence vector's width where it is known before the model loads: a built head's own `output_size`
    (SARCSE's, from its options), else the backbone's declared hidden size (every pooling keeps it); else None."""
    from sentemb.encoders.models.backbones import declared_hidden_size

    width = getattr(head, "output_size", None) if head is not None else None
    return width or declared_hidden_size(model)


def declared_width(model: Mapping[str, Any], head: Mapping[str, Any] | None = None) -> int | None:
    """`sentence_width` of configs (a checkpoint's, or the command line's): the head built from its options at a toy
    width, only to read its `output_size`."""
    from sentemb.encoders.part_configs import build_part

    built = build_part("head", head, hidden_size=TOY_WIDTH, special_ids=[]) if head else None
    return sentence_width(model, built)


def trained_sizes(hparams: Mapping[str, Any] | None) -> list[int] | None:
    """A checkpoint's `matryoshka.dims` (its hyper-parameters), or None when it trained at its full width alone."""
    node = (hparams or {}).get("matryoshka") or {}
    dims = node.get("dims") if isinstance(node, Mapping) else None
    return [int(d) for d in dims] if dims else None


class TruncatedEncoder:
    """An encoder whose `encode` keeps the first `size` dimensions of the wrapped encoder's embeddings; everything
    else is the wrapped encoder's."""

    def __init__(self, encoder: Any, size: int) -> None:
        self.encoder = encoder
        self.size = size

    @property
    def hidden_size(self) -> int:
        return self.size

    def encode(self, sentences: Sequence[str], *args: Any, **kwargs: Any) -> np.ndarray:
        return self.encoder.encode(sentences, *args, **kwargs)[:, : self.size]

    def __getattr__(self, name: str) -> Any:  # the wrapped encoder's other attributes (folder, pooling, ...)
        return getattr(self.encoder, name)


def truncated(encoder: Any, size: int | None) -> Any:
    """`encoder` cut to its first `size` dimensions; itself when `size` is None."""
    return encoder if size is None else TruncatedEncoder(encoder, size)


def size_scores(
    embed_pairs: Mapping[str, tuple[np.ndarray, np.ndarray, np.ndarray]], sizes: Sequence[int]
) -> dict[str, dict[int, float]]:
    """{split: {size: Spearman ×100}} from each split's (first sentences' embeddings, second's, gold scores), encoded
    once at the full width: each size's cosine is taken of the prefixes (renormalised by the cosine)."""
    from sentemb.eval.sts import correlations, pairwise_cosine

    return {
        split: {
            size: correlations(pairwise_cosine(first[:, :size], second[:, :size]), gold, f"{split} at {size}")[
                "spearman"
            ]
            for size in sizes
        }
        for split, (first, second, gold) in embed_pairs.items()
    }


def size_table(rows: Mapping[int, Mapping[str, float]], columns: Mapping[str, str]) -> list[str]:
    """A markdown table, one row a size: `| size | <column label> ... |`, each cell `rows[size][column key]`."""
    lines = ["| size | " + " | ".join(columns.values()) + " |", "|---" * (len(columns) + 1) + "|"]
    for size, scores in rows.items():
        lines.append(f"| {size} | " + " | ".join(f"{scores[key]:.2f}" for key in columns) + " |")
    return lines
