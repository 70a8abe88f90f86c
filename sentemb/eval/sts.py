"""STS-B as SentEval/SimCSE score it: cosine of the two embeddings, Spearman ×100, no regressor.

Sentences are read the way SentEval reads them: the line stripped and split on tabs, the
sentence whitespace-tokenised and re-joined with single spaces (SimCSE's batcher).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
from scipy.stats import pearsonr, spearmanr

from sentemb.errors import SentembConfigError

STSB_SPLITS = ("train", "dev", "test")


@dataclass(frozen=True)
class SentencePairs:
    """Scored sentence pairs of one split."""

    first: list[str]
    second: list[str]
    gold: np.ndarray


def read_stsb_split(path: Path) -> SentencePairs:
    """One STS-B csv (tab-separated: genre, file, year, id, score, sentence 1, sentence 2)."""
    if not path.is_file():
        raise SentembConfigError(
            f"STS-B file {path} does not exist. Fix: point SENTEMB_DATA (or paths.data_dir) at a data root holding "
            "senteval/downstream/STS/STSBenchmark/sts-{train,dev,test}.csv, or run `make data`."
        )
    first, second, gold = [], [], []
    with path.open(encoding="utf-8") as handle:
        for number, line in enumerate(handle, start=1):
            columns = line.strip().split("\t")
            if len(columns) < 7:
                raise SentembConfigError(
                    f"{path}:{number}: expected 7 tab-separated columns (genre, file, year, id, score, s1, s2), "
                    f"found {len(columns)}. Fix: restore the file from the SentEval download."
                )
            try:
                score = float(columns[4])
            except ValueError as err:
                raise SentembConfigError(
                    f"{path}:{number}: gold score {columns[4]!r} is not a number. "
                    "Fix: restore the file from the SentEval download."
                ) from err
            first.append(" ".join(columns[5].split()))
            second.append(" ".join(columns[6].split()))
            gold.append(score)
    return SentencePairs(first, second, np.asarray(gold, dtype=np.float64))


def pairwise_cosine(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Row-wise cosine similarity, in float64."""
    a = a.astype(np.float64)
    b = b.astype(np.float64)
    norms = np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1)
    return (a * b).sum(axis=1) / np.maximum(norms, 1e-12)


def correlations(predicted: np.ndarray, gold: np.ndarray) -> dict[str, float]:
    """Spearman and Pearson ×100 (the tables' unit)."""
    return {
        "spearman": 100.0 * float(spearmanr(predicted, gold)[0]),
        "pearson": 100.0 * float(pearsonr(predicted, gold)[0]),
    }


class STSBenchmark:
    """STS-B splits, read once; `evaluate(encoder)` encodes and scores them."""

    def __init__(self, directory: Path, splits: tuple[str, ...] = ("dev",)) -> None:
        unknown = sorted(set(splits) - set(STSB_SPLITS))
        if unknown:
            raise SentembConfigError(f"eval.splits: unknown STS-B split(s) {unknown}; valid: {list(STSB_SPLITS)}")
        self.directory = Path(directory)
        self.pairs = {split: read_stsb_split(self.directory / f"sts-{split}.csv") for split in splits}

    def evaluate(self, encoder, batch_size: int = 128, show_progress: bool = False) -> dict[str, dict[str, float]]:
        """{split: {spearman, pearson}} for `encoder` (anything with SentenceEncoder.encode)."""
        sentences = [s for pairs in self.pairs.values() for s in pairs.first + pairs.second]
        embeddings = encoder.encode(sentences, batch_size=batch_size, show_progress=show_progress)
        row = {sentence: i for i, sentence in enumerate(sentences)}
        scores = {}
        for split, pairs in self.pairs.items():
            a = embeddings[[row[s] for s in pairs.first]]
            b = embeddings[[row[s] for s in pairs.second]]
            scores[split] = correlations(pairwise_cosine(a, b), pairs.gold)
        return scores
