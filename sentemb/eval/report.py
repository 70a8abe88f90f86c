"""Markdown tables in the papers' layout."""

from __future__ import annotations

import math
from typing import Any

from sentemb.common.hydra_plumbing import part_name
from sentemb.encoders.checkpoint import model_label

TABLE_NAMES = {"STSBenchmark": "STS-B", "SICKRelatedness": "SICK-R", "SST2": "SST-2"}


def _row(cells: list[str]) -> str:
    return "| " + " | ".join(cells) + " |"


def with_interval(value: float, interval: dict[str, float] | None) -> str:
    """`82.03 [81.10, 82.93]` (the value and its 95% interval), or the value alone without one."""
    if not interval or interval.get("low") is None or math.isnan(interval["low"]):
        return f"{value:.2f}"
    return f"{value:.2f} [{interval['low']:.2f}, {interval['high']:.2f}]"


def score_table(scores: dict[str, float], intervals: dict[str, dict[str, float]] | None = None) -> list[str]:
    """One row of table scores, each with its interval if given; the average over tasks has none."""
    intervals = intervals or {}
    names = [TABLE_NAMES.get(task, task) for task in scores] + (["Avg."] if len(scores) > 1 else [])
    cells = [with_interval(value, intervals.get(task)) for task, value in scores.items()]
    cells += [f"{sum(scores.values()) / len(scores):.2f}"] if len(scores) > 1 else []
    return [_row(names), _row(["---"] * len(names)), _row(cells)]


def interval_note(results: dict[str, Any]) -> str:
    """What the brackets are: the procedure recorded beside the intervals."""
    procedure = results.get("intervals")
    if not procedure:
        return ""
    level = round(100 * procedure["level"])
    return (
        f"[brackets]: {level}% percentile bootstrap interval, {procedure['resamples']} resamples of the scored "
        f"pairs (STS12–16 'all': within each subset), seed {procedure['seed']}"
    )


def markdown_report(results: dict[str, Any]) -> str:
    source = results["source"]
    what = source.get("checkpoint") or onnx_label(source) or model_label(source["model"])
    lines = [f"# SentEval results: {what}", "", f"pooling: `{part_name(source['pooling']) or '?'}`"]
    if results.get("truncate_dim"):  # a Matryoshka size: every score is of the embeddings' first d dimensions
        lines += ["", f"embeddings truncated to their first {results['truncate_dim']} dimensions (eval.truncate_dim)"]
    if results.get("in_domain"):  # trained on a benchmark's own train split: said before its scores
        lines += ["", f"**{results['in_domain']}**"]
    if "sts_table" in results:
        lines += ["", "## STS (Spearman ×100; STS12–16 'all', STS-B and SICK-R test)", ""]
        lines += score_table(results["sts_table"], results.get("sts_table_intervals"))
        lines += ["", interval_note(results)] if results.get("intervals") else []
        lines += ["", "| task | subset | Spearman | Pearson | n |", "|---|---|---|---|---|"]
        for task, result in results["sts"].items():
            intervals = result.get("intervals", {})
            for subset, s in result["subsets"].items():
                spearman = with_interval(s["spearman"], intervals.get(subset))
                lines.append(_row([task, subset, spearman, f"{s['pearson']:.2f}", str(s["n"])]))
            agg = result["all"]["spearman"]
            pooled = with_interval(agg["all"], intervals.get("all"))
            lines.append(
                _row([task, "all / mean / wmean", f"{pooled} / {agg['mean']:.2f} / {agg['wmean']:.2f}", "", ""])
            )
    if "alignment_uniformity" in results:
        au = results["alignment_uniformity"]
        lines += [
            "",
            f"alignment {au['alignment']:.4f}, uniformity {au['uniformity']:.4f} "
            f"(STS-B {au['split']}: {au['positive_pairs']} pairs with gold ≥ 4, {au['sentences']} sentences)",
        ]
    if "transfer" in results:
        transfer = results["transfer"]
        lines += [
            "",
            f"## Transfer tasks (test accuracy ×100, scikit-learn logistic regression, "
            f"mode: {results['transfer_mode']})",
            "",
        ]
        lines += score_table({task: r["acc"] for task, r in transfer.items()},
                             {task: r.get("interval") for task, r in transfer.items()})  # fmt: skip
        lines += ["", "| task | dev acc | test acc [95% interval] | interval | n test |", "|---|---|---|---|---|"]
        lines += [
            _row([t, f"{r['devacc']:.2f}", with_interval(r["acc"], r.get("interval")), r.get("interval_kind", ""),
                  str(r["n"])])
            for t, r in transfer.items()
        ]  # fmt: skip
        if "MRPC" in transfer:
            lines.append(f"\nMRPC test F1: {transfer['MRPC']['f1']:.2f}")
    return "\n".join(lines)


def onnx_label(source: dict) -> str | None:
    """An ONNX export's folder and the graph evaluated in it (sentemb.evaluate onnx=)."""
    return f"{source['onnx']}/{source['graph']} (ONNX Runtime)" if source.get("onnx") else None
