"""Each distinct sentence encoded once per model and run, across every requested task."""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np


class EmbeddingCache:
    """Wraps `encoder.encode`: `prefetch` encodes all new sentences in one length-sorted pass, `__call__` looks up."""

    def __init__(self, encoder, batch_size: int = 128, max_length: int | None = None, show_progress: bool = True):
        self.encoder = encoder
        self.batch_size = batch_size
        self.max_length = max_length
        self.show_progress = show_progress
        self.rows: dict[str, int] = {}
        self.blocks: list[np.ndarray] = []
        self._matrix: np.ndarray | None = None

    def prefetch(self, sentences: Iterable[str]) -> None:
        new = [s for s in dict.fromkeys(sentences) if s not in self.rows]
        if not new:
            return
        embeddings = self.encoder.encode(
            new, batch_size=self.batch_size, max_length=self.max_length, show_progress=self.show_progress
        )
        start = len(self.rows)
        self.rows.update({sentence: start + i for i, sentence in enumerate(new)})
        self.blocks.append(embeddings)
        self._matrix = None

    def __call__(self, sentences: list[str]) -> np.ndarray:
        self.prefetch(sentences)
        if self._matrix is None:
            self._matrix = np.concatenate(self.blocks)
        return self._matrix[[self.rows[s] for s in sentences]]

    def __len__(self) -> int:
        return len(self.rows)
