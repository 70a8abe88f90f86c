"""STS tasks as SentEval/SimCSE score them: cosine of the two embeddings, correlation ×100.

Reading follows SentEval's loaders: STS12–16 `STS.input.<subset>.txt` lines split on tabs
(first two fields), pairs whose gold line is empty not scored; STS-B columns 5/6 and score
column 4; SICK columns 1/2 and relatedness column 3 after a header. Every sentence is
whitespace-tokenised and re-joined with single spaces (SimCSE's batcher). For each task,
SentEval reports per-subset Pearson/Spearman, and over subsets 'all' (pairs pooled), 'mean'
and 'wmean' (weighted by pair count); tables use STS12–16 'all' Spearman and the test split
Spearman of STS-B and SICK-R.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from scipy.stats import pearsonr, spearmanr

from sentemb.common.errors import SentembConfigError
from sentemb.eval.bootstrap import Interval, Resampling
from sentemb.eval.cache import EmbeddingCache
from sentemb.eval.scorable import check_gold, check_similarities, defined

STS_YEARS = {
    "STS12": ("STS12-en-test", ("MSRpar", "MSRvid", "SMTeuroparl", "surprise.OnWN", "surprise.SMTnews")),
    "STS13": ("STS13-en-test", ("FNWN", "headlines", "OnWN")),
    "STS14": ("STS14-en-test", ("deft-forum", "deft-news", "headlines", "images", "OnWN", "tweet-news")),
    "STS15": ("STS15-en-test", ("answers-forums", "answers-students", "belief", "headlines", "images")),
    "STS16": ("STS16-en-test", ("answer-answer", "headlines", "plagiarism", "postediting", "question-question")),
}
STSB_SPLITS = ("train", "dev", "test")
SICK_FILES = {"train": "SICK_train.txt", "dev": "SICK_trial.txt", "test": "SICK_test_annotated.txt"}
STS_TASKS = (*STS_YEARS, "STSBenchmark", "SICKRelatedness")


@dataclass(frozen=True)
class SentencePairs:
    """Scored sentence pairs of one subset or split; `source`: the file they were read from (messages name it)."""

    first: list[str]
    second: list[str]
    gold: np.ndarray
    source: str = "the pairs"


def _tokens(text: str) -> str:
    return " ".join(text.split())


def _score(text: str, path: Path, number: int) -> float:
    try:
        score = float(text)
    except ValueError as err:
        raise SentembConfigError(
            f"{path}:{number}: gold score {text!r} is not a number. Fix: restore the file from the SentEval download."
        ) from err
    if not math.isfinite(score):  # float() reads 'nan' and 'inf': one such score makes every correlation nan
        raise SentembConfigError(
            f"{path}:{number}: gold score {text!r} is not a finite number. "
            "Fix: restore the file from the SentEval download."
        )
    return score


def _require(path: Path) -> Path:
    if not path.is_file():
        raise SentembConfigError(
            f"SentEval file {path} does not exist. Fix: point SENTEMB_DATA (or paths.data_dir) at a data root "
            "holding senteval/downstream/ (docs/data.md), or run `make data`."
        )
    return path


def _columns(line: str, path: Path, number: int, needed: int, layout: str) -> list[str]:
    columns = line.strip().split("\t") if layout != "input" else line.split("\t")
    if len(columns) < needed:
        raise SentembConfigError(
            f"{path}:{number}: expected {needed} tab-separated columns ({layout}), found {len(columns)}. "
            "Fix: restore the file from the SentEval download."
        )
    return columns


def read_sts_subset(directory: Path, subset: str) -> SentencePairs:
    """STS12–16 subset: `STS.input.<subset>.txt` (s1 TAB s2) and `STS.gs.<subset>.txt` (score or empty)."""
    inputs = _require(directory / f"STS.input.{subset}.txt")
    scores = _require(directory / f"STS.gs.{subset}.txt")
    input_lines = inputs.read_text(encoding="utf-8").splitlines()
    gold_lines = scores.read_text(encoding="utf-8").splitlines()
    if len(input_lines) != len(gold_lines):
        raise SentembConfigError(
            f"{inputs} has {len(input_lines)} lines but {scores} has {len(gold_lines)}: they must pair line by line. "
            "Fix: restore both files from the SentEval download."
        )
    first, second, gold = [], [], []
    for number, (line, score) in enumerate(zip(input_lines, gold_lines, strict=True), start=1):
        columns = _columns(line, inputs, number, 2, "input")
        if score == "":  # SentEval: pairs without a gold score are not scored
            continue
        first.append(_tokens(columns[0]))
        second.append(_tokens(columns[1]))
        gold.append(_score(score, scores, number))
    return scored(first, second, gold, scores)


RESTORE_FIX = "Fix: restore the file from the SentEval download."


def scored(first: list[str], second: list[str], gold: list[float], path: Path) -> SentencePairs:
    """The pairs read from `path`, refused when read if no correlation (nor its interval) could be computed on them:
    no scored pair, fewer than 2, or gold scores all equal (sentemb.eval.scorable)."""
    if not gold:
        raise SentembConfigError(f"{path}: no scored sentence pair in it. {RESTORE_FIX}")
    check_gold(np.asarray(gold, dtype=np.float64), str(path), RESTORE_FIX)
    return SentencePairs(first, second, np.asarray(gold, dtype=np.float64), str(path))


def _read_scored_pairs(path: Path, columns: tuple[int, int, int], layout: str, header: bool) -> SentencePairs:
    """A tab-separated file of scored pairs; `columns` = (sentence 1, sentence 2, score) indices."""
    first_at, second_at, score_at = columns
    first, second, gold = [], [], []
    with _require(path).open(encoding="utf-8") as handle:
        if header:
            next(handle, None)
        for number, line in enumerate(handle, start=2 if header else 1):
            fields = _columns(line, path, number, max(columns) + 1, layout)
            first.append(_tokens(fields[first_at]))
            second.append(_tokens(fields[second_at]))
            gold.append(_score(fields[score_at], path, number))
    return scored(first, second, gold, path)


def read_stsb_split(path: Path) -> SentencePairs:
    """One STS-B csv (tab-separated: genre, file, year, id, score, sentence 1, sentence 2)."""
    return _read_scored_pairs(path, (5, 6, 4), "genre, file, year, id, score, s1, s2", header=False)


def read_sick_split(path: Path) -> SentencePairs:
    """One SICK file (header; pair_ID, sentence_A, sentence_B, relatedness_score, entailment_judgment)."""
    return _read_scored_pairs(path, (1, 2, 3), "pair_ID, sentence_A, sentence_B, relatedness_score, ...", header=True)


def load_sts_task(senteval_dir: Path, task: str, splits: Sequence[str] = STSB_SPLITS) -> dict[str, SentencePairs]:
    """{subset or split: pairs} of one STS task under SentEval's `downstream/` folder."""
    if task in STS_YEARS:
        folder, subsets = STS_YEARS[task]
        return {subset: read_sts_subset(senteval_dir / "STS" / folder, subset) for subset in subsets}
    unknown = sorted(set(splits) - set(STSB_SPLITS))
    if unknown:
        raise SentembConfigError(f"unknown split(s) {unknown} for {task}; valid: {list(STSB_SPLITS)}")
    if task == "STSBenchmark":
        return {split: read_stsb_split(senteval_dir / "STS" / "STSBenchmark" / f"sts-{split}.csv") for split in splits}
    if task == "SICKRelatedness":
        return {split: read_sick_split(senteval_dir / "SICK" / SICK_FILES[split]) for split in splits}
    raise SentembConfigError(f"unknown STS task {task!r}; valid: {list(STS_TASKS)}")


def pairwise_cosine(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Row-wise cosine similarity, in float64 (a zero vector scores 0, as SentEval's nan_to_num gives)."""
    a = a.astype(np.float64)
    b = b.astype(np.float64)
    norms = np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1)
    return np.divide((a * b).sum(axis=1), norms, out=np.zeros(len(a)), where=norms > 0)


def correlations(predicted: np.ndarray, gold: np.ndarray, where: str = "the pairs") -> dict[str, float]:
    """Spearman and Pearson ×100 (the tables' unit) of the pairs `where` names; refused where undefined (fewer than
    2 pairs, or either side all equal: sentemb.eval.scorable), never NaN."""
    check_gold(gold, where, RESTORE_FIX)
    check_similarities(predicted, where)
    return {
        "spearman": defined(100.0 * float(spearmanr(predicted, gold)[0]), f"{where}: Spearman"),
        "pearson": defined(100.0 * float(pearsonr(predicted, gold)[0]), f"{where}: Pearson"),
    }


Embed = Callable[[list[str]], np.ndarray]


def pooled_sizes(data: dict[str, dict[str, SentencePairs]]) -> list[int]:
    """Each task's pairs, its subsets pooled: what one of its bootstraps resamples (`Resampling.check_fits`)."""
    return [sum(len(pairs.gold) for pairs in subsets.values()) for subsets in data.values()]


def sts_similarities(subsets: dict[str, SentencePairs], embed: Embed) -> dict[str, np.ndarray]:
    """{subset or split: the cosine of each pair's two embeddings}."""
    return {name: pairwise_cosine(embed(pairs.first), embed(pairs.second)) for name, pairs in subsets.items()}


def score_similarities(subsets: dict[str, SentencePairs], similarities: dict[str, np.ndarray]) -> dict:
    """Per-subset Pearson/Spearman/n and SentEval's aggregates over subsets: all (pooled), mean, wmean."""
    per_subset = {
        name: {**correlations(similarities[name], pairs.gold, pairs.source), "n": len(pairs.gold)}
        for name, pairs in subsets.items()
    }
    pooled = correlations(
        np.concatenate([similarities[name] for name in subsets]),
        np.concatenate([p.gold for p in subsets.values()]),
        "the pooled pairs of " + ", ".join(pairs.source for pairs in subsets.values()),
    )
    weights = [scores["n"] for scores in per_subset.values()]
    aggregate = {
        metric: {
            "all": pooled[metric],
            "mean": float(np.mean([s[metric] for s in per_subset.values()])),
            "wmean": float(np.average([s[metric] for s in per_subset.values()], weights=weights)),
        }
        for metric in ("pearson", "spearman")
    }
    return {"subsets": per_subset, "all": aggregate}


def score_sts_task(subsets: dict[str, SentencePairs], embed: Embed) -> dict:
    """`score_similarities` of the pairs as `embed` encodes them."""
    return score_similarities(subsets, sts_similarities(subsets, embed))


def interval_figures(task: str, subsets: dict[str, SentencePairs]) -> dict[str, list[str]]:
    """The figures that get an interval, each with the subsets it pools: STS12–16's 'all' (every subset, resampled
    within each), and each scored split of STS-B and SICK-R."""
    return {"all": list(subsets)} if task in STS_YEARS else {split: [split] for split in subsets}


def sts_intervals(
    task: str, subsets: dict[str, SentencePairs], similarities: dict[str, np.ndarray], result: dict,
    resampling: Resampling,
) -> dict[str, Interval]:  # fmt: skip
    """{figure: Spearman ×100 with its bootstrap interval} for the figures of `interval_figures`; the estimates are
    `result`'s own numbers (`score_similarities` of the same similarities)."""
    intervals = {}
    for figure in interval_figures(task, subsets):
        estimate = result["all"]["spearman"]["all"] if figure == "all" else result["subsets"][figure]["spearman"]
        predicted, gold, sizes = figure_pairs(task, subsets, similarities, figure)
        intervals[figure] = resampling.spearman(predicted, gold, sizes, estimate)
    return intervals


def figure_pairs(
    task: str, subsets: dict[str, SentencePairs], similarities: dict[str, np.ndarray], figure: str
) -> tuple[np.ndarray, np.ndarray, list[int]]:
    """(cosines, gold, subset sizes) of one figure of `interval_figures`: its subsets concatenated, in order."""
    names = interval_figures(task, subsets)[figure]
    return (
        np.concatenate([similarities[name] for name in names]),
        np.concatenate([subsets[name].gold for name in names]),
        [len(subsets[name].gold) for name in names],
    )


def table_figure(task: str) -> str:
    """Which figure of a task its table score is: 'all' for STS12–16, 'test' for STS-B and SICK-R."""
    return "all" if task in STS_YEARS else "test"


def table_score(task: str, result: dict) -> float | None:
    """The number papers print: 'all' Spearman for STS12–16, test Spearman for STS-B and SICK-R (None: not scored)."""
    if task in STS_YEARS:
        return result["all"]["spearman"]["all"]
    return result["subsets"].get("test", {}).get("spearman")


class STSBenchmark:
    """STS-B splits, read once; `evaluate(encoder)` encodes and scores them (training-time dev evaluation).

    Each split is encoded on its own sentences, never batched with another split's: padding and
    GEMM shapes follow the batch, so a sentence's embedding moves in the last float bits with its
    neighbours (more on AVX-512 kernels), and Spearman with it. This way the dev score of
    `splits=("dev", "test")` is the very computation of `splits=("dev",)`, as the callback runs it.
    """

    def __init__(self, directory: Path, splits: tuple[str, ...] = ("dev",)) -> None:
        unknown = sorted(set(splits) - set(STSB_SPLITS))
        if unknown:
            raise SentembConfigError(f"eval.splits: unknown STS-B split(s) {unknown}; valid: {list(STSB_SPLITS)}")
        self.pairs = {split: read_stsb_split(Path(directory) / f"sts-{split}.csv") for split in splits}

    def similarities(self, encoder, batch_size: int = 128, show_progress: bool = False) -> dict[str, np.ndarray]:
        """{split: each pair's cosine} for `encoder` (anything with SentenceEncoder.encode), split by split."""
        similarities = {}
        for split, pairs in self.pairs.items():
            cache = EmbeddingCache(encoder, batch_size=batch_size, show_progress=show_progress)
            cache.prefetch(pairs.first + pairs.second)  # this split's sentences only (see the class docstring)
            similarities[split] = pairwise_cosine(cache(pairs.first), cache(pairs.second))
        return similarities

    def evaluate(self, encoder, batch_size: int = 128, show_progress: bool = False) -> dict[str, dict[str, float]]:
        """{split: {spearman, pearson}} for `encoder`, split by split."""
        similarities = self.similarities(encoder, batch_size, show_progress)
        return {
            split: correlations(similarities[split], pairs.gold, pairs.source) for split, pairs in self.pairs.items()
        }
