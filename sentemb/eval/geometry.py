"""Alignment and uniformity (Wang & Isola 2020), as SimCSE measures them on STS-B.

    alignment  = E_{(x, x+) positive} ‖f(x) − f(x+)‖²            (α = 2)
    uniformity = log E_{x, y} e^{−t ‖f(x) − f(y)‖²}              (t = 2)

on L2-normalised embeddings; positives are the pairs with gold score ≥ 4.0, uniformity runs
over every distinct sentence of the split. Lower is better for both.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from sentemb.eval.scorable import UndefinedScore
from sentemb.eval.sts import SentencePairs

POSITIVE = 4.0  # SimCSE's threshold: a pair with a gold score at least this is a positive pair


def alignment(a: np.ndarray, b: np.ndarray, alpha: float = 2.0) -> float:
    x, y = (
        F.normalize(torch.as_tensor(a, dtype=torch.float64), dim=1),
        F.normalize(torch.as_tensor(b, dtype=torch.float64), dim=1),
    )
    return float((x - y).norm(dim=1).pow(alpha).mean())


def uniformity(embeddings: np.ndarray, t: float = 2.0) -> float:
    x = F.normalize(torch.as_tensor(embeddings, dtype=torch.float64), dim=1)
    return float(torch.pdist(x).pow(2).mul(-t).exp().mean().log())


def check_geometry_pairs(pairs: SentencePairs, fix: str, positive_threshold: float = POSITIVE) -> None:
    """The pairs alignment and uniformity are measured on, refused when read where either is undefined (the mean
    over no positive pair, the mean over no two distinct sentences): sentemb.eval.scorable's rule."""
    if not (pairs.gold >= positive_threshold).any():
        raise UndefinedScore(
            f"{pairs.source}: no pair has a gold score of {positive_threshold:g} or more, so alignment (the mean "
            f"distance of positive pairs) is undefined. {fix}"
        )
    if len(set(pairs.first + pairs.second)) < 2:
        raise UndefinedScore(f"{pairs.source}: one distinct sentence, so uniformity is undefined. {fix}")


def alignment_uniformity(pairs: SentencePairs, embed, positive_threshold: float = POSITIVE) -> dict[str, float]:
    check_geometry_pairs(pairs, "Fix: measure them on an STS-B split with positive pairs", positive_threshold)
    positive = pairs.gold >= positive_threshold
    first = [s for s, keep in zip(pairs.first, positive, strict=True) if keep]
    second = [s for s, keep in zip(pairs.second, positive, strict=True) if keep]
    distinct = list(dict.fromkeys(pairs.first + pairs.second))
    return {
        "alignment": alignment(embed(first), embed(second)),
        "uniformity": uniformity(embed(distinct)),
        "positive_pairs": int(positive.sum()),
        "sentences": len(distinct),
    }
