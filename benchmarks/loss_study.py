"""Small-scale study of the objective library: every loss, one epoch, same everything else.

    python benchmarks/loss_study.py                       # all 14 losses (~5 min each on 2 CPU cores)
    python benchmarks/loss_study.py --losses infonce,mmhe  # a subset
    python benchmarks/loss_study.py -- data.batch_size=128 # extra overrides for every run
    python benchmarks/loss_study.py --quick               # make bench: 3 losses, 30 steps each
    python benchmarks/loss_study.py --convention reference --seeds 1,2,3 --losses mmhe,mmhs,mbarlow,mvicreg
                                    # the modified losses as the paper's text and as its public code, 3 seeds each

Each loss is trained by `python -m sentemb.train loss=<name> pooling=cls logger=csv` (MiniLM,
the 12k-sentence sample, one epoch, STS-B dev every 125 steps keeping the best checkpoint) in
its own process; STS-B dev/test of the best checkpoint and the paradigm telemetry of the last
step are read back from the run's CSV log. Finished losses are skipped on a rerun (their
result.json is kept); `--fresh` retrains. Writes <out>/loss_study.md, <out>/loss_study.json and
<out>/loss_study_telemetry.png (the per-step telemetry of every run: the paper's Figures 7–9).

`--convention reference` also trains the modified losses with `loss.convention=reference` (the
public code's computation, everything else equal) and adds the paper-text vs public-code
comparison; `--seeds` repeats every run per seed and reports mean ± std, with the gap judged
against the pooled seed noise as the sweep report does (two standard errors of a difference).
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

FAMILIES = {
    "effective": ["infonce", "arccon", "mpt", "met", "focal", "paradigm"],
    "original": ["align_mhe", "align_mhs", "barlow", "vicreg"],
    "modified": ["mmhe", "mmhs", "mbarlow", "mvicreg"],
}
MODIFIED_OF = {"align_mhe": "mmhe", "align_mhs": "mmhs", "barlow": "mbarlow", "vicreg": "mvicreg"}
TELEMETRY = ["gd", "hardest_share", "ratio", "mu_pos", "mu_neg", "sigma_pos", "sigma_neg", "alignment", "uniformity"]
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from sentemb.common.metric_names import (  # noqa: E402
    BEST_STEP,
    DEV_SPEARMAN_BEST_RESCORED,
    DEV_SPEARMAN_INITIAL,
    TEST_SPEARMAN,
)
from sentemb.eval.significance import holm, paired_t_test, separable, t_interval  # noqa: E402

ANCHOR = "infonce"  # every loss is tested against SimCSE's objective

# --quick: one loss of each family, 30 steps, dev every 15
QUICK_LOSSES = ["infonce", "align_mhe", "mbarlow"]
QUICK = ["trainer.max_steps=30", "eval.every_n_steps=15"]
REFERENCE = "@reference"  # a run label's suffix: the loss under loss.convention=reference


def label_of(name: str, convention: str) -> str:
    return name if convention == "paper" else name + REFERENCE


def choice_of(label: str) -> list[str]:
    """The training overrides of a run label: loss=<name> pooling=cls, and the convention if not the paper's."""
    name = label.removesuffix(REFERENCE)
    return [f"loss={name}", "pooling=cls", *(["loss.convention=reference"] if label.endswith(REFERENCE) else [])]


def run_one(name: str, run_dir: Path, extra: list[str], choice: list[str] | None = None) -> dict:
    """Train `name` (or the config `choice`, default its label's) in a fresh process; scores + last-step telemetry."""
    if run_dir.exists():
        shutil.rmtree(run_dir)
    # log_every_n_steps=1: the telemetry of every step, for its means over the last steps
    command = [
        sys.executable, "-m", "sentemb.train", *(choice or choice_of(name)), "logger=csv",
        "task_name=loss_study", "trainer.log_every_n_steps=1", f"hydra.run.dir={run_dir}", *extra,
    ]  # fmt: skip
    started = time.perf_counter()
    completed = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    seconds = time.perf_counter() - started
    (run_dir / "stdout.txt").write_text(completed.stdout + completed.stderr)
    if completed.returncode != 0:
        raise RuntimeError(f"{name} failed (exit {completed.returncode}); see {run_dir / 'stdout.txt'}")
    rows = list(csv.DictReader((run_dir / "csv" / "version_0" / "metrics.csv").open()))
    last_step = [r for r in rows if r.get("paradigm/mu_pos")][-1]
    final = {key: float(value) for r in rows for key, value in r.items() if key.startswith("stsb/") and value}
    for checkpoint in (run_dir / "checkpoints").glob("*.ckpt"):  # ~90 MB each; the scores are what we keep
        checkpoint.unlink()
    return {
        "loss": name,
        "dev": 100 * final[DEV_SPEARMAN_BEST_RESCORED]
        if final[DEV_SPEARMAN_BEST_RESCORED] <= 1
        else final[DEV_SPEARMAN_BEST_RESCORED],
        "test": 100 * final[TEST_SPEARMAN] if final[TEST_SPEARMAN] <= 1 else final[TEST_SPEARMAN],
        "best_step": int(final[BEST_STEP]),
        "initial_dev": final.get(DEV_SPEARMAN_INITIAL),
        "telemetry": telemetry_at_end(run_dir),  # as for a kept result: the last batch alone may be small
        "step": int(last_step["step"]),
        "seconds": round(seconds, 1),
    }


def telemetry_at_end(run_dir: Path, steps: int = 10) -> dict[str, float]:
    """Mean paradigm telemetry over the last `steps` training steps (the last batch alone may be small)."""
    rows = [
        r for r in csv.DictReader((run_dir / "csv" / "version_0" / "metrics.csv").open()) if r.get("paradigm/mu_pos")
    ]
    tail = rows[-steps:]
    return {
        key: sum(float(r[f"paradigm/{key}"]) for r in tail) / len(tail)
        for key in TELEMETRY
        if tail[-1].get(f"paradigm/{key}")
    }


def aggregate(runs: list[dict]) -> dict:
    """One label's runs (one per seed) → mean scores, their sample std (nan for one seed), mean telemetry."""
    mean = statistics.fmean
    std = statistics.stdev if len(runs) > 1 else (lambda _: math.nan)
    keys = set.intersection(*(set(r["telemetry"]) for r in runs))
    return {
        "loss": runs[0]["loss"],
        "dev": mean(r["dev"] for r in runs),
        "test": mean(r["test"] for r in runs),
        "dev_std": std([r["dev"] for r in runs]),
        "test_std": std([r["test"] for r in runs]),
        "n": len(runs),
        "seeds": [r.get("seed") for r in runs],
        "telemetry": {k: mean(r["telemetry"][k] for r in runs) for k in keys},
        "seconds": mean(r["seconds"] for r in runs),
        "runs": runs,
    }


def score(r: dict, key: str) -> str:
    return f"{r[key]:.2f}" if math.isnan(r.get(f"{key}_std", math.nan)) else f"{r[key]:.2f} ± {r[f'{key}_std']:.2f}"


def rows_in_order(results: dict[str, dict]) -> list[tuple[str, str]]:
    """(family, label): each family's losses, a loss's reference run right after its paper run."""
    return [
        (family, label)
        for family, names in FAMILIES.items()
        for name in names
        for label in (name, name + REFERENCE)
        if label in results
    ]


def convention_comparison(results: dict[str, dict]) -> list[str]:
    """Paper text vs public code per loss, the gap against the pooled seed noise (as the sweep report judges)."""
    pairs = [(n, results[n], results[n + REFERENCE]) for n in FAMILIES["modified"] if n + REFERENCE in results]
    if not pairs:
        return []
    groups = [r for _, a, b in pairs for r in (a, b)]
    dof = sum(r["n"] - 1 for r in groups)
    noise = math.sqrt(sum((r["n"] - 1) * r["dev_std"] ** 2 for r in groups if r["n"] > 1) / dof) if dof else math.nan
    lines = [
        "",
        "Paper text (`loss.convention=paper`) vs the public code (`loss.convention=reference`), everything else equal:",
        "",
        "| loss | dev: paper | dev: code | code − paper | test: paper | test: code | code − paper | gap vs noise |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, paper, code in pairs:
        gap = code["dev"] - paper["dev"]
        if dof:  # two standard errors of a difference of two means of n runs each
            bound = 2 * noise * math.sqrt(1 / paper["n"] + 1 / code["n"])
            verdict = f"{'above' if abs(gap) > bound else 'within'} (2 SE = {bound:.2f})"
        else:
            verdict = "one seed: not measured"
        lines.append(
            f"| {name} | {score(paper, 'dev')} | {score(code, 'dev')} | {gap:+.2f} | {score(paper, 'test')} | "
            f"{score(code, 'test')} | {code['test'] - paper['test']:+.2f} | {verdict} |"
        )
    if dof:
        lines += ["", f"Pooled seed std of STS-B dev over these runs: {noise:.2f} points ({dof} degrees of freedom)."]
    return lines


def versus_anchor(results: dict[str, dict]) -> list[str]:
    """Each loss against InfoNCE over the seeds both ran: the mean with its 95% t-interval over seeds, the mean
    difference, the paired t-test (scipy.stats.ttest_rel) and Holm's correction over the losses compared, per score."""
    anchor = results.get(ANCHOR)
    others = [label for _, label in rows_in_order(results) if label != ANCHOR]
    if anchor is None or anchor["n"] < 2 or not others:
        return []
    tests = {}
    for key in ("dev", "test"):
        reference = {r["seed"]: r[key] for r in anchor["runs"]}
        found = [paired_t_test({r["seed"]: r[key] for r in results[label]["runs"]}, reference) for label in others]
        tests[key] = list(zip(found, holm([t.p_value for t in found]), strict=True))

    def cell(r: dict, key: str) -> str:
        interval = t_interval([run[key] for run in r["runs"]])
        return f"{interval.estimate:.2f} [{interval.low:.2f}, {interval.high:.2f}]"

    def verdict(test, adjusted) -> str:
        flag = separable(adjusted)
        word = "no test" if flag is None else "separable" if flag else "not separable"
        return f"{test.difference:+.2f}, p {test.p_value:.3g} (Holm {adjusted:.3g}): {word}"

    lines = [
        "",
        f"Against {ANCHOR} (paired t-test over the seeds both ran, Holm over the {len(others)} losses compared, "
        "α = 0.05; brackets: 95% t-interval of the mean over seeds):",
        "",
        "| loss | seeds | STS-B dev | vs infonce (dev) | STS-B test | vs infonce (test) |",
        "|---|---|---|---|---|---|",
        f"| {ANCHOR} | {anchor['n']} | {cell(anchor, 'dev')} | – | {cell(anchor, 'test')} | – |",
    ]
    for index, label in enumerate(others):
        r = results[label]
        lines.append(
            f"| {label.replace(REFERENCE, ' (code)')} | {r['n']} | {cell(r, 'dev')} | {verdict(*tests['dev'][index])} "
            f"| {cell(r, 'test')} | {verdict(*tests['test'][index])} |"
        )
    return lines


def markdown(results: dict[str, dict]) -> str:
    several = any(r["n"] > 1 for r in results.values())
    header = "| family | loss | STS-B dev | STS-B test | " + " | ".join(TELEMETRY) + " | time (s) |"
    lines = [header, "|" + "---|" * (header.count("|") - 1)]
    for family, label in rows_in_order(results):
        r = results[label]
        cells = [f"{r['telemetry'][k]:.3f}" if k in r["telemetry"] else "–" for k in TELEMETRY]
        shown = label.replace(REFERENCE, " (code)")
        lines.append(
            f"| {family} | {shown} | {score(r, 'dev')} | {score(r, 'test')} | "
            + " | ".join(cells)
            + f" | {r['seconds']:.0f} |"
        )
    lines += ["", "Each modification against its original (STS-B dev / test, points):", ""]
    for original, modified in MODIFIED_OF.items():
        if original in results and modified in results:
            a, b = results[original], results[modified]
            lines.append(
                f"- {modified} − {original}: dev {b['dev'] - a['dev']:+.2f}, test {b['test'] - a['test']:+.2f}"
            )
    effective = [results[n] for n in FAMILIES["effective"] if n in results]
    originals = [results[n] for n in FAMILIES["original"] if n in results]
    modified = [results[n] for n in FAMILIES["modified"] if n in results]
    for label, group in (("effective", effective), ("original", originals), ("modified", modified)):
        if group:
            dev = sum(r["dev"] for r in group) / len(group)
            test = sum(r["test"] for r in group) / len(group)
            lowest = min(r["dev"] for r in group)
            lines.append(f"- mean of the {label} losses: dev {dev:.2f}, test {test:.2f} (lowest dev {lowest:.2f})")
    lines += convention_comparison(results)
    lines += versus_anchor(results)
    lines.append("")
    if several:
        lines.append("Scores: mean ± sample std over the seeds; telemetry and times: means over the seeds.")
    lines.append("Telemetry: mean over the last 10 training steps (paradigm/...); gd = mean GD (fraction of anchors")
    lines.append("with GD active for indicator forms), angles in radians; (code) = loss.convention=reference.")
    return "\n".join(lines) + "\n"


def plot_telemetry(out: Path, results: dict[str, dict]) -> Path:
    """Per-step paradigm telemetry of every finished run (its first seed), one panel per quantity."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shown = ["gd", "hardest_share", "ratio", "cos_pos", "mu_pos", "mu_neg", "sigma_neg", "uniformity"]
    fig, axes = plt.subplots(2, 4, figsize=(20, 8), constrained_layout=True)
    for label, result in results.items():
        log = Path(result["runs"][0]["dir"]) / "csv" / "version_0" / "metrics.csv"
        if not log.is_file():
            continue
        rows = [r for r in csv.DictReader(log.open()) if r.get("paradigm/mu_pos")]
        name = label.removesuffix(REFERENCE)
        style = "-" if name in FAMILIES["modified"] else "--" if name in FAMILIES["original"] else ":"
        style = "-." if label.endswith(REFERENCE) else style
        for ax, key in zip(axes.flat, shown, strict=True):
            points = [(int(r["step"]), float(r[f"paradigm/{key}"])) for r in rows if r.get(f"paradigm/{key}")]
            if points:
                ax.plot(*zip(*points, strict=True), style, label=label.replace(REFERENCE, " (code)"), lw=1)
    for ax, key in zip(axes.flat, shown, strict=True):
        ax.set(title=f"paradigm/{key}", xlabel="step")
    axes.flat[0].legend(fontsize=7, ncol=2)
    fig.suptitle(
        "Telemetry per training step (dotted: effective, dashed: original, solid: modified, dash-dot: public code)"
    )
    path = out / "loss_study_telemetry.png"
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def train_or_keep(label: str, run_dir: Path, overrides: list[str], fresh: bool, seed: int | None) -> dict:
    """One run's result: kept from an earlier run of the study unless `fresh`, else trained now."""
    result_file = run_dir / "result.json"
    tag = label if seed is None else f"{label} seed {seed}"
    if result_file.is_file() and not fresh:
        result = json.loads(result_file.read_text())
        result["telemetry"] = telemetry_at_end(run_dir)
        print(f"{tag}: kept earlier result (dev {result['dev']:.2f})", flush=True)
        return result
    print(f"{tag}: training ...", flush=True)
    result = run_one(label, run_dir, [*overrides, *([f"seed={seed}"] if seed is not None else [])])
    result.update(seed=seed, dir=str(run_dir))
    result_file.write_text(json.dumps(result, indent=2))
    print(f"{tag}: dev {result['dev']:.2f} test {result['test']:.2f} ({result['seconds']:.0f} s)", flush=True)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--losses", default=",".join(n for names in FAMILIES.values() for n in names))
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "loss_study")
    parser.add_argument("--fresh", action="store_true", help="retrain losses that already have a result")
    parser.add_argument("--quick", action="store_true", help=f"make bench: {', '.join(QUICK_LOSSES)}, {QUICK[0]}")
    parser.add_argument(
        "--convention",
        choices=["paper", "reference"],
        default="paper",
        help="reference: also train the modified losses under loss.convention=reference (the public code)",
    )
    parser.add_argument("--seeds", default="", help="comma-separated seeds, one run each (default: the config's seed)")
    parser.add_argument("overrides", nargs="*", help="extra Hydra overrides for every run")
    args = parser.parse_args()
    if args.quick:  # the pipeline end to end in minutes; the study's numbers need the full epoch
        args.losses, args.overrides, args.fresh = ",".join(QUICK_LOSSES), [*QUICK, *args.overrides], True
        args.out = args.out.with_name(args.out.name + "_quick")
    args.out.mkdir(parents=True, exist_ok=True)
    names = args.losses.split(",")
    labels = names + [n + REFERENCE for n in names if args.convention == "reference" and n in FAMILIES["modified"]]
    seeds = [int(s) for s in args.seeds.split(",")] if args.seeds else [None]
    results: dict[str, dict] = {}
    for label in labels:
        folder = args.out / label
        runs = [
            train_or_keep(label, folder if seed is None else folder / f"seed{seed}", args.overrides, args.fresh, seed)
            for seed in seeds
        ]
        for run, seed in zip(runs, seeds, strict=True):  # results kept from before this field existed
            run.setdefault("dir", str(folder if seed is None else folder / f"seed{seed}"))
        results[label] = aggregate(runs)
        (args.out / "loss_study.md").write_text(markdown(results))
    (args.out / "loss_study.json").write_text(json.dumps(results, indent=2))
    (args.out / "loss_study.md").write_text(markdown(results))
    print(f"telemetry figure: {plot_telemetry(args.out, results)}")
    print("\n" + markdown(results))


if __name__ == "__main__":
    main()
