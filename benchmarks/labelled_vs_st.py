"""Labelled training against sentence-transformers' own trainer, on the same jobs, machine and run; and supervised
SimCSE on SICK's NLI triplets against unsupervised SimCSE from the same start.

Part 1, two jobs, each trained by sentemb and by SentenceTransformerTrainer from the packaged all-MiniLM-L6-v2 with
mean pooling, 128 tokens, 1 epoch, batch 16, AdamW lr 2e-5 with weight decay 0.01, 10% linear warmup, gradient norm
clipped at 1, seed 42, the final weights scored:
  (a) STS-B train's scored pairs with CoSENT (scale 20) — sentemb's `experiment=labelled/cosent_minilm`;
  (b) MRPC train's paraphrase pairs with InfoNCE at τ 0.05 — sentence-transformers' MultipleNegativesRankingLoss at
      scale 20 (the same loss: cross-entropy of 20·cos over the batch's positives).
Both models' STS-B test cosines are scored by the same code: Spearman ×100 with its 95% bootstrap interval, and the
paired bootstrap of the difference (the same resamples of the test pairs for both). The step time is the mean time
from a batch's start to its end (forward, backward, optimizer step) over all steps, each trainer timed by its own
callback, in this process, one after the other: their ratio is sentemb / sentence-transformers.

Part 2: `experiment=labelled/sup_simcse_minilm` (SICK NLI triplets) against the same recipe on unlabelled wiki lines
(unsupervised SimCSE: `data=wiki`, the same steps), seeds 1-3, STS-B and SICK-R test: each mean with its t interval
over the seeds and the paired t-test over the seeds (SICK-R is in-domain for the supervised runs).

    python benchmarks/labelled_vs_st.py [--out benchmarks/results/labelled] [--seeds 1 2 3] [--skip-part1|2]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import warnings
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import torch  # noqa: E402
from versus_st import MINILM, RUN, fit_st, st_minilm, stsb_test_cosines_of_run, train_sentemb  # noqa: E402

from sentemb.common.metric_names import TEST_SPEARMAN, read_metric  # noqa: E402
from sentemb.common.paths import resolve_data_root  # noqa: E402
from sentemb.data.labelled import read_labelled  # noqa: E402
from sentemb.eval.bootstrap import paired_spearman_difference, spearman_interval  # noqa: E402
from sentemb.eval.deployed import cpu_name  # noqa: E402
from sentemb.eval.significance import paired_t_test, t_interval  # noqa: E402
from sentemb.eval.sts import load_sts_task, pairwise_cosine  # noqa: E402

JOBS = {
    "(a) STS-B train, CoSENT": (["experiment=labelled/cosent_minilm"], "stsb_train"),
    "(b) MRPC pairs, InfoNCE τ 0.05 = MNRL scale 20": (["data=mrpc", "loss=infonce", "loss.tau=0.05", *MINILM], "mrpc"),
}


def train_st(source: str, seed: int, folder: Path) -> tuple[Any, list[float]]:
    """sentence-transformers' trainer on the same rows (its own data handling), its per-step times."""
    from sentence_transformers.sentence_transformer.losses import CoSENTLoss, MultipleNegativesRankingLoss

    labelled = read_labelled({"source": source, "path": str(resolve_data_root() / "senteval" / "downstream")})
    columns = {"sentence1": labelled.texts[0], "sentence2": labelled.texts[1]}
    if labelled.scores is not None:
        columns["score"] = labelled.scores  # already scaled to [0, 1]; CoSENT reads only their order
    model = st_minilm(seed)
    loss = (
        CoSENTLoss(model, scale=20.0)
        if labelled.scores is not None
        else MultipleNegativesRankingLoss(model, scale=20.0)
    )
    return model, fit_st(model, columns, loss, seed, folder)


def part1(out: Path, seed: int) -> list[str]:
    stsb = load_sts_task(resolve_data_root() / "senteval" / "downstream", "STSBenchmark", ("test",))["test"]
    lines = [
        f"Seed {seed}; {cpu_name()}, {torch.get_num_threads()} threads; STS-B test Spearman ×100 [95% bootstrap "
        "interval], the final weights; Δ = sentemb − sentence-transformers with the paired bootstrap (1,000 shared "
        "resamples of the 1,379 test pairs); step time = mean over all steps",
        "",
        "| job | steps | sentemb | sentence-transformers | Δ [95%], p | step time sentemb / ST (ms) | ratio |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, (overrides, source) in JOBS.items():
        slug = source
        metrics, ours_seconds = train_sentemb([*overrides, *RUN, f"seed={seed}"], out / f"sentemb_{slug}")
        ours = stsb_test_cosines_of_run(out / f"sentemb_{slug}")
        model, st_seconds = train_st(source, seed, out / f"st_{slug}")
        theirs = pairwise_cosine(
            model.encode(stsb.first, batch_size=128, convert_to_numpy=True),
            model.encode(stsb.second, batch_size=128, convert_to_numpy=True),
        )
        a, b = spearman_interval(ours, stsb.gold), spearman_interval(theirs, stsb.gold)
        assert abs(a.estimate - read_metric(metrics, TEST_SPEARMAN)) < 1e-9, "the run's own score, from its cosines"
        paired = paired_spearman_difference(ours, theirs, stsb.gold, a.estimate - b.estimate)
        d = paired.difference
        ms_ours, ms_st = 1000 * statistics.mean(ours_seconds), 1000 * statistics.mean(st_seconds)
        lines.append(
            f"| {name} | {len(ours_seconds)} / {len(st_seconds)} | {a.estimate:.2f} [{a.low:.2f}, {a.high:.2f}] | "
            f"{b.estimate:.2f} [{b.low:.2f}, {b.high:.2f}] | {d.estimate:+.2f} [{d.low:+.2f}, {d.high:+.2f}], "
            f"p = {paired.p_value:.3f} | {ms_ours:.0f} / {ms_st:.0f} | {ms_ours / ms_st:.2f} |"
        )
        print(lines[-1], flush=True)
    return lines


def part2(out: Path, seeds: list[int]) -> list[str]:
    sup_steps = -(
        -len(read_labelled({"source": "sick_nli", "path": str(resolve_data_root() / "senteval" / "downstream")})) // 16
    )
    variants = {
        "supervised SimCSE (labelled/sup_simcse_minilm, data=sick_nli)": ["experiment=labelled/sup_simcse_minilm"],
        "unsupervised SimCSE (the same recipe, data=wiki)": [
            "experiment=labelled/sup_simcse_minilm", "data=wiki", "data.batch_size=16", "data.max_length=128",
            f"trainer.max_steps={sup_steps}",
        ],
    }  # fmt: skip
    tasks = {
        "STS-B test": TEST_SPEARMAN,
        "SICK-R test (in-domain for the supervised runs)": "sts/SICKRelatedness/spearman",
    }
    scores: dict[str, dict[str, dict[int, float]]] = {}
    for seed in seeds:
        for name, overrides in variants.items():
            folder = out / f"part2_{'sup' if name.startswith('sup') else 'unsup'}_seed{seed}"
            record = folder / "part2.json"
            if record.is_file():
                metrics = json.loads(record.read_text())
            else:
                metrics, _ = train_sentemb(
                    [*overrides, *RUN, f"seed={seed}", "eval.test_tasks=[STSBenchmark,SICKRelatedness]"], folder
                )
                record.write_text(json.dumps({k: v for k, v in metrics.items() if isinstance(v, int | float | str)}))
            for task, key in tasks.items():
                # sts/<task>/spearman: a test task's own name, which read_metric's list of fixed names does not hold
                value = metrics[key] if key in metrics else read_metric(metrics, key)
                scores.setdefault(task, {}).setdefault(name, {})[seed] = float(value)
    lines = [
        f"Seeds {', '.join(map(str, seeds))}, {sup_steps} steps each; Spearman ×100, mean [95% t interval over the "
        "seeds]; paired t-test over the seeds (supervised − unsupervised)",
        "",
        "| test set | " + " | ".join(variants) + " | Δ mean, p |",
        "|---|---|---|---|",
    ]
    sup, unsup = list(variants)
    for task, by_variant in scores.items():
        cells = []
        for name in variants:
            interval = t_interval(list(by_variant[name].values()))
            per_seed = ", ".join(f"{v:.2f}" for v in by_variant[name].values())
            cells.append(f"{interval.estimate:.2f} [{interval.low:.2f}, {interval.high:.2f}] ({per_seed})")
        test = paired_t_test(by_variant[sup], by_variant[unsup])
        lines.append(f"| {task} | " + " | ".join(cells) + f" | {test.difference:+.2f}, p = {test.p_value:.3f} |")
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "labelled")
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--skip-part1", action="store_true")
    parser.add_argument("--skip-part2", action="store_true")
    args = parser.parse_args()
    os.environ.setdefault("WANDB_MODE", "offline")
    warnings.filterwarnings("ignore", category=DeprecationWarning)
    args.out.mkdir(parents=True, exist_ok=True)
    report = []
    if not args.skip_part1:
        report += ["## Labelled training against sentence-transformers' trainer", "", *part1(args.out, args.seed)]
    if not args.skip_part2:
        report += [
            "",
            "## Supervised against unsupervised SimCSE from the same start",
            "",
            *part2(args.out, args.seeds),
        ]
    text = "\n".join(report) + "\n"
    (args.out / "labelled_vs_st.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
