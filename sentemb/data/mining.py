"""Hard-negative mining with sentence-transformers' semantics (`mine_hard_negatives`, sentence_transformers/util/
hard_negatives.py in v6.2; each step below cites the lines it follows there).

- The anchors are deduplicated in order of first appearance, the corpus is the positives deduplicated the same way
  (`dict.fromkeys`, l.412-427), and each anchor keeps its distinct positives in order (l.561-574). Rows repeating an
  (anchor, positive) pair are mined once; the output lists anchors in order of first appearance.
- Candidates: the range_max + max_positives corpus texts of highest cosine of the normalised embeddings
  (max_positives: the most rows of one anchor, l.355-358, l.533-552), by exact search in blocks of chunk_size
  queries x chunk_size corpus texts (float32, a running top-k: memory bounded by the blocks, not the corpus), or by
  faiss' IndexFlatIP (mine.faiss=true, l.512-529).
- Dropped, in sentence-transformers' order: an anchor's own positives (texts equal to a positive are that positive,
  the corpus being deduplicated; a text equal to the anchor is kept, as there), then absolute_margin (score + m >
  min positive score), relative_margin (score > pos − |pos|·m; pos·(1−m) for pos ≥ 0, #3819), max_score
  (score > max_score), each against the anchor's lowest positive score (l.617-660); then the best range_max of those
  left are ranked and the first range_min skipped (l.684-690).
- `top` takes the best num_negatives left; `random` samples num_negatives of the candidates left in the window with
  `random.Random(seed).sample`, one call per anchor in order (l.696-705, which calls the global `random.sample`
  likewise), then sorts them by score.
- `triplet`: one row per (anchor, positive, negative) found; `n-tuple`: (anchor, positive, negative_1..k), a row that
  did not find all k negatives is dropped (l.722-760, l.810-823).
"""

from __future__ import annotations

import random
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import torch.nn.functional as F
from tqdm import tqdm

from sentemb.common.errors import SentembConfigError
from sentemb.data.mining_files import checked_out, read_pairs, write_rows, write_summary
from sentemb.data.mining_options import MineOptions

if TYPE_CHECKING:
    from sentemb.encoders.encoder import SentenceEncoder

NEG_INF = float("-inf")
Embed = Callable[[list[str]], np.ndarray]


@dataclass(frozen=True)
class GroupedPairs:
    """The pairs as sentence-transformers groups them: unique anchors, the corpus (unique positives), each anchor's
    distinct positives (corpus indices), and the most rows any one anchor has (`max_positives`)."""

    queries: list[str]
    corpus: list[str]
    positives: list[list[int]]
    max_positives: int
    rows: int

    @classmethod
    def of(cls, anchors: Sequence[str], positives: Sequence[str]) -> GroupedPairs:
        corpus = list(dict.fromkeys(positives))
        corpus_idx = {text: i for i, text in enumerate(corpus)}
        queries = list(dict.fromkeys(anchors))
        queries_idx = {text: i for i, text in enumerate(queries)}
        grouped: list[list[int]] = [[] for _ in queries]
        for anchor, positive in zip(anchors, positives, strict=True):
            own = grouped[queries_idx[anchor]]
            if corpus_idx[positive] not in own:
                own.append(corpus_idx[positive])
        max_positives = max(Counter(anchors).values())  # rows per anchor, repeats included (pandas' groupby count)
        return cls(queries, corpus, grouped, max_positives, len(anchors))


@dataclass
class Mined:
    """Per unique anchor: its negatives' corpus indices and scores (k columns; -inf where none was found)."""

    indices: torch.Tensor
    scores: torch.Tensor
    positive_scores: list[torch.Tensor]
    dropped: dict[str, int]
    retrieved: int


def normalised(embeddings: np.ndarray) -> torch.Tensor:
    """float32 unit rows (sentence-transformers' normalize_embeddings=True)."""
    return F.normalize(torch.as_tensor(np.ascontiguousarray(embeddings), dtype=torch.float32), p=2, dim=1)


def exact_search(queries: torch.Tensor, corpus: torch.Tensor, k: int, chunk: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The k best corpus rows of each query by inner product, in blocks of `chunk` x `chunk` (a running top-k per
    query block), padded to k with -inf / -1 where the corpus is smaller (as hard_negatives.py l.542-546)."""
    scores_out, indices_out = [], []
    for start in tqdm(range(0, len(queries), chunk), desc="mine: search", unit=" blocks"):
        block = queries[start : start + chunk]
        best = torch.empty(len(block), 0)
        best_idx = torch.empty(len(block), 0, dtype=torch.long)
        for offset in range(0, len(corpus), chunk):
            scores = block @ corpus[offset : offset + chunk].T  # float32, chunk x chunk at most
            top, idx = torch.topk(scores, min(k, scores.shape[1]), dim=1)
            best, where = torch.topk(torch.cat([best, top], dim=1), min(k, best.shape[1] + top.shape[1]), dim=1)
            best_idx = torch.cat([best_idx, idx + offset], dim=1).gather(1, where)
        scores_out.append(best)
        indices_out.append(best_idx)
    return pad(torch.cat(scores_out), torch.cat(indices_out), k)


def faiss_search(queries: torch.Tensor, corpus: torch.Tensor, k: int, chunk: int) -> tuple[torch.Tensor, torch.Tensor]:
    """faiss' exact IndexFlatIP (CPU), queried in blocks of `chunk`; -1 rows (k past the corpus) become -inf."""
    try:
        import faiss
    except ImportError:
        raise SentembConfigError(
            "mine.faiss=true, but faiss is not installed. Fix: pip install 'sentemb[mine]' (faiss-cpu), or "
            "mine.faiss=false (the exact search in chunks)"
        ) from None
    index = faiss.IndexFlatIP(corpus.shape[1])
    index.add(np.ascontiguousarray(corpus.numpy()))
    scores_out, indices_out = [], []
    for start in tqdm(range(0, len(queries), chunk), desc="mine: faiss", unit=" blocks"):
        scores, indices = index.search(np.ascontiguousarray(queries[start : start + chunk].numpy()), k)
        scores_out.append(torch.from_numpy(scores))
        indices_out.append(torch.from_numpy(indices).long())
    scores, indices = torch.cat(scores_out), torch.cat(indices_out)
    scores[indices == -1] = NEG_INF
    return scores, indices


def pad(scores: torch.Tensor, indices: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    missing = k - scores.shape[1]
    if missing <= 0:
        return scores, indices
    return (
        torch.cat([scores, scores.new_full((len(scores), missing), NEG_INF)], dim=1),
        torch.cat([indices, indices.new_full((len(indices), missing), -1)], dim=1),
    )


def dropped_by(scores: torch.Tensor, removed: torch.Tensor) -> int:
    """How many candidates still standing `removed` drops; they are set to -inf."""
    count = int((removed & torch.isfinite(scores)).sum())
    scores[removed] = NEG_INF
    return count


def select(
    scores: torch.Tensor,
    indices: torch.Tensor,
    grouped: GroupedPairs,
    positive_scores: list[torch.Tensor],
    options: MineOptions,
    range_max: int,
) -> Mined:
    """Each anchor's negatives from its candidates (module docstring: the rules in sentence-transformers' order),
    with how many candidates each rule dropped."""
    scores = scores.clone()
    scores[indices == -1] = NEG_INF
    retrieved = int(torch.isfinite(scores).sum())
    dropped: dict[str, int] = {}
    own = torch.stack([torch.isin(indices[q], torch.tensor(p)) for q, p in enumerate(grouped.positives)])
    dropped["positive"] = dropped_by(scores, own)
    lowest = torch.stack([s.min() for s in positive_scores])[:, None]  # the harder positive sets the margin (l.621)
    if options.absolute_margin is not None:
        dropped["absolute_margin"] = dropped_by(scores, scores + options.absolute_margin > lowest)
    if options.relative_margin is not None:
        dropped["relative_margin"] = dropped_by(scores, scores > lowest - lowest.abs() * options.relative_margin)
    if options.max_score is not None:
        dropped["max_score"] = dropped_by(scores, scores > options.max_score)
    standing = int(torch.isfinite(scores).sum())
    window, local = torch.topk(scores, k=range_max, dim=1)
    picked = indices.gather(1, local)
    dropped["range_max"] = standing - int(torch.isfinite(window).sum())
    dropped["range_min"] = int(torch.isfinite(window[:, : options.range_min]).sum())
    window, picked = window[:, options.range_min :], picked[:, options.range_min :]
    in_window = int(torch.isfinite(window).sum())
    k = options.num_negatives
    if options.sampling == "top":
        chosen, chosen_idx = window[:, :k], picked[:, :k]
    else:
        rng = random.Random(options.seed)  # the global random.sample of l.701, seeded
        options_left = (window.shape[1] - torch.isinf(window).sum(1)).clamp(min=k)
        sampled = torch.tensor([rng.sample(range(int(n)), k=k) for n in options_left], dtype=torch.long)
        chosen, chosen_idx = window.gather(1, sampled), picked.gather(1, sampled)
        chosen, order = chosen.sort(dim=1, descending=True)
        chosen_idx = chosen_idx.gather(1, order)
    dropped["not_taken"] = in_window - int(torch.isfinite(chosen).sum())
    return Mined(chosen_idx, chosen, positive_scores, dropped, retrieved)


def mine_embeddings(
    grouped: GroupedPairs, query_emb: np.ndarray, corpus_emb: np.ndarray, options: MineOptions
) -> tuple[Mined, int]:
    """The search and the selection on given embeddings: (the mined negatives, range_max used)."""
    queries, corpus = normalised(query_emb), normalised(corpus_emb)
    range_max = options.window(grouped.max_positives)
    k = range_max + grouped.max_positives  # room for the positives (l.522, l.536)
    search = faiss_search if options.faiss else exact_search
    scores, indices = search(queries, corpus, k, options.chunk_size)
    positive_scores = [(queries[q] * corpus[p]).sum(-1) for q, p in enumerate(grouped.positives)]
    return select(scores, indices, grouped, positive_scores, options, range_max), range_max


def output_rows(grouped: GroupedPairs, mined: Mined, output: str) -> tuple[list[list[str]], int]:
    """The rows to write, and how many (anchor, positive) pairs found all their negatives."""
    rows: list[list[str]] = []
    complete = 0
    for q, positives in enumerate(grouped.positives):
        found = torch.isfinite(mined.scores[q]).tolist()
        negatives = [grouped.corpus[i] for i in mined.indices[q].tolist()]
        for p in positives:
            complete += all(found)
            anchor, positive = grouped.queries[q], grouped.corpus[p]
            if output == "n-tuple":
                if all(found):
                    rows.append([anchor, positive, *negatives])
            else:
                rows.extend([anchor, positive, negative] for negative, ok in zip(negatives, found, strict=True) if ok)
    return rows, complete


def output_header(columns: Sequence[str], options: MineOptions) -> list[str]:
    if options.output == "triplet":
        return [*columns, "negative"]
    return [*columns, *(f"negative_{i}" for i in range(1, options.num_negatives + 1))]


def encoder_embed(encoder: SentenceEncoder, options: MineOptions) -> Embed:
    """The encoder's `encode` (eval mode, float32, its progress bar), as mining calls it."""
    return lambda texts: encoder.encode(texts, options.batch_size, options.max_length, show_progress=True)


def mine_pairs(
    anchors: Sequence[str], positives: Sequence[str], embed: Embed, options: MineOptions
) -> tuple[GroupedPairs, Mined, int, dict[str, float]]:
    """Group, embed (corpus, then anchors, as sentence-transformers does), search and select: (the grouped pairs,
    their negatives, range_max used, seconds per stage)."""
    seconds: dict[str, float] = {}
    grouped = GroupedPairs.of(anchors, positives)
    start = time.perf_counter()
    corpus_emb, query_emb = embed(grouped.corpus), embed(grouped.queries)
    seconds["encode"] = time.perf_counter() - start
    start = time.perf_counter()
    mined, range_max = mine_embeddings(grouped, query_emb, corpus_emb, options)
    seconds["search_and_select"] = time.perf_counter() - start
    return grouped, mined, range_max, seconds


def summary_of(
    grouped: GroupedPairs, mined: Mined, rows: int, complete: int, range_max: int, options: MineOptions
) -> dict[str, Any]:
    pairs = sum(len(p) for p in grouped.positives)
    return {
        "pairs_read": grouped.rows,
        "pairs_mined": pairs,  # distinct (anchor, positive) pairs
        "anchors": len(grouped.queries),
        "corpus": len(grouped.corpus),
        "range_max_used": range_max,
        "candidates_retrieved": mined.retrieved,
        "candidates_dropped": mined.dropped,
        "pairs_with_all_negatives": complete,
        "pairs_short_of_negatives": pairs - complete,
        "rows_written": rows,
        "output": options.output,
        "options": options.as_dict(),
    }


def mine_file(
    pairs_path: str | Path,
    out: str | Path,
    encoder: SentenceEncoder | Embed,
    options: MineOptions,
    *,
    columns: Sequence[str] | None = None,
    overwrite: bool = False,
) -> dict[str, Any]:
    """Mine `pairs_path` into `out` with `encoder` (a SentenceEncoder, or any texts → embeddings callable): the
    summary, also written as `<out>.summary.json`. What a benchmark times beside sentence-transformers' own."""
    start = time.perf_counter()
    out_path = checked_out(out, pairs_path, overwrite)
    anchors, positives, names = read_pairs(pairs_path, columns)
    embed = encoder if callable(encoder) and not isinstance(encoder, torch.nn.Module) else None
    embed = embed or encoder_embed(encoder, options)  # type: ignore[arg-type]
    grouped, mined, range_max, seconds = mine_pairs(anchors, positives, embed, options)
    rows, complete = output_rows(grouped, mined, options.output)
    summary = summary_of(grouped, mined, len(rows), complete, range_max, options)
    if not rows:
        raise SentembConfigError(
            f"no {options.output} row found its negatives ({summary['candidates_dropped']}); nothing was written. "
            "Fix: a larger mine.range_max, a smaller mine.relative_margin / absolute_margin, a higher mine.max_score, "
            "or mine.output=triplet"
        )
    begin = time.perf_counter()
    write_rows(out_path, output_header(names, options), rows, overwrite)
    seconds["write"] = time.perf_counter() - begin
    seconds["total"] = time.perf_counter() - start
    summary |= {"out": str(out_path), "seconds": seconds}
    write_summary(out_path, summary)
    return summary
