"""Figures a person looks at: predicted-similarity density per gold-score bucket (SARCSE Fig. 3)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt  # the commands choose the file-only backend (sentemb.common.process)
import numpy as np
from scipy.stats import gaussian_kde

from sentemb.common.published_files import published

BUCKETS = ((0, 1), (1, 2), (2, 3), (3, 4), (4, 5))


def similarity_density_figure(cosines: np.ndarray, gold: np.ndarray, path: Path, title: str) -> dict[str, int]:
    """One density curve of predicted cosine per gold bucket [0,1) … [4,5]; returns pairs per bucket."""
    fig, ax = plt.subplots(figsize=(6, 4))
    grid = np.linspace(min(-0.2, cosines.min()), 1.0, 400)
    counts = {}
    for low, high in BUCKETS:
        inside = (gold >= low) & ((gold < high) if high < 5 else (gold <= high))
        counts[f"{low}-{high}"] = int(inside.sum())
        if inside.sum() > 1:
            ax.plot(grid, gaussian_kde(cosines[inside])(grid), label=f"gold {low}–{high} (n={inside.sum()})")
    ax.set(xlabel="predicted cosine similarity", ylabel="density", title=title)
    ax.legend(fontsize=8)
    fig.tight_layout()
    save_figure(fig, path, dpi=120)
    return counts


def save_figure(fig: Any, path: Path, **options: Any) -> Path:
    """`fig` as the image file `path` (its format from the suffix), published whole and never through a link
    (sentemb.common.published_files); the figure closed."""
    try:
        with published(path, "wb") as handle:
            fig.savefig(handle, format=path.suffix.lstrip(".") or "png", **options)
    finally:
        plt.close(fig)
    return path
