"""Markdown tables in the papers' layout."""

from __future__ import annotations

from typing import Any

from sentemb.common.hydra_plumbing import part_name
from sentemb.encoders.checkpoint import model_label

TABLE_NAMES = {"STSBenchmark": "STS-B", "SICKRelatedness": "SICK-R", "SST2": "SST-2"}


def _row(cells: list[str]) -> str:
    return "| " + " | ".join(cells) + " |"


def score_table(scores: dict[str, float]) -> list[str]:
    names = [TABLE_NAMES.get(task, task) for task in scores] + (["Avg."] if len(scores) > 1 else [])
    values = list(scores.values()) + ([sum(scores.values()) / len(scores)] if len(scores) > 1 else [])
    return [_row(names), _row(["---"] * len(names)), _row([f"{v:.2f}" for v in values])]


def markdown_report(results: dict[str, Any]) -> str:
    source = results["source"]
    what = source.get("checkpoint") or onnx_label(source) or model_label(source["model"])
    lines = [f"# SentEval results: {what}", "", f"pooling: `{part_name(source['pooling']) or '?'}`"]
    if "sts_table" in results:
        lines += ["", "## STS (Spearman ×100; STS12–16 'all', STS-B and SICK-R test)", ""]
        lines += score_table(results["sts_table"])
        lines += ["", "| task | subset | Spearman | Pearson | n |", "|---|---|---|---|---|"]
        for task, result in results["sts"].items():
            for subset, s in result["subsets"].items():
                lines.append(_row([task, subset, f"{s['spearman']:.2f}", f"{s['pearson']:.2f}", str(s["n"])]))
            agg = result["all"]["spearman"]
            lines.append(
                _row([task, "all / mean / wmean", f"{agg['all']:.2f} / {agg['mean']:.2f} / {agg['wmean']:.2f}", "", ""])
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
        lines += score_table({task: r["acc"] for task, r in transfer.items()})
        lines += ["", "| task | dev acc | test acc | n test |", "|---|---|---|---|"]
        lines += [_row([t, f"{r['devacc']:.2f}", f"{r['acc']:.2f}", str(r["n"])]) for t, r in transfer.items()]
        if "MRPC" in transfer:
            lines.append(f"\nMRPC test F1: {transfer['MRPC']['f1']:.2f}")
    return "\n".join(lines)


def onnx_label(source: dict) -> str | None:
    """An ONNX export's folder and the graph evaluated in it (sentemb.evaluate onnx=)."""
    return f"{source['onnx']}/{source['graph']} (ONNX Runtime)" if source.get("onnx") else None
