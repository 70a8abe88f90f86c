"""Small-scale study of the objective library: every loss, one epoch, same everything else.

    python benchmarks/loss_study.py                       # all 14 losses (~5 min each on 2 CPU cores)
    python benchmarks/loss_study.py --losses infonce,mmhe  # a subset
    python benchmarks/loss_study.py -- data.batch_size=128 # extra overrides for every run
    python benchmarks/loss_study.py --quick               # make bench: 3 losses, 30 steps each

Each loss is trained by `python -m sentemb.train loss=<name> pooling=cls logger=csv` (MiniLM,
the 12k-sentence sample, one epoch, STS-B dev every 125 steps keeping the best checkpoint) in
its own process; STS-B dev/test of the best checkpoint and the paradigm telemetry of the last
step are read back from the run's CSV log. Finished losses are skipped on a rerun (their
result.json is kept); `--fresh` retrains. Writes <out>/loss_study.md, <out>/loss_study.json and
<out>/loss_study_telemetry.png (the per-step telemetry of every run: the paper's Figures 7–9).
"""

from __future__ import annotations

import argparse
import csv
import json
import shutil
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
# --quick: one loss of each family, 30 steps, dev every 15
QUICK_LOSSES = ["infonce", "align_mhe", "mbarlow"]
QUICK = ["trainer.max_steps=30", "eval.every_n_steps=15"]


def run_one(name: str, run_dir: Path, extra: list[str], choice: list[str] | None = None) -> dict:
    """Train `name` (or the config `choice`, default loss=<name>) in a fresh process; scores + last-step telemetry."""
    if run_dir.exists():
        shutil.rmtree(run_dir)
    command = [
        sys.executable, "-m", "sentemb.train", *(choice or [f"loss={name}", "pooling=cls"]), "logger=csv",
        "task_name=loss_study", f"hydra.run.dir={run_dir}", *extra,
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
        "dev": 100 * final["stsb/best_dev_spearman"]
        if final["stsb/best_dev_spearman"] <= 1
        else final["stsb/best_dev_spearman"],
        "test": 100 * final["stsb/test_spearman"] if final["stsb/test_spearman"] <= 1 else final["stsb/test_spearman"],
        "best_step": int(final["stsb/best_step"]),
        "initial_dev": final.get("stsb/dev_spearman_initial"),
        "telemetry": {
            key: float(last_step[f"paradigm/{key}"]) for key in TELEMETRY if last_step.get(f"paradigm/{key}")
        },
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


def markdown(results: dict[str, dict]) -> str:
    header = "| family | loss | STS-B dev | STS-B test | " + " | ".join(TELEMETRY) + " | time (s) |"
    lines = [header, "|" + "---|" * (header.count("|") - 1)]
    for family, names in FAMILIES.items():
        for name in names:
            if name not in results:
                continue
            r = results[name]
            cells = [f"{r['telemetry'][k]:.3f}" if k in r["telemetry"] else "–" for k in TELEMETRY]
            lines.append(
                f"| {family} | {name} | {r['dev']:.2f} | {r['test']:.2f} | "
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
    lines.append("")
    lines.append("Telemetry: mean over the last 10 training steps (paradigm/...); gd = mean GD (fraction of anchors")
    lines.append("with GD active for indicator forms), angles in radians.")
    return "\n".join(lines) + "\n"


def plot_telemetry(out: Path, names: list[str]) -> Path:
    """Per-step paradigm telemetry of every finished run, one panel per quantity."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shown = ["gd", "hardest_share", "ratio", "cos_pos", "mu_pos", "mu_neg", "sigma_neg", "uniformity"]
    fig, axes = plt.subplots(2, 4, figsize=(20, 8), constrained_layout=True)
    for name in names:
        log = out / name / "csv" / "version_0" / "metrics.csv"
        if not log.is_file():
            continue
        rows = [r for r in csv.DictReader(log.open()) if r.get("paradigm/mu_pos")]
        style = "-" if name in FAMILIES["modified"] else "--" if name in FAMILIES["original"] else ":"
        for ax, key in zip(axes.flat, shown, strict=True):
            points = [(int(r["step"]), float(r[f"paradigm/{key}"])) for r in rows if r.get(f"paradigm/{key}")]
            if points:
                ax.plot(*zip(*points, strict=True), style, label=name, lw=1)
    for ax, key in zip(axes.flat, shown, strict=True):
        ax.set(title=f"paradigm/{key}", xlabel="step")
    axes.flat[0].legend(fontsize=7, ncol=2)
    fig.suptitle("Telemetry per training step (dotted: effective, dashed: original, solid: modified)")
    path = out / "loss_study_telemetry.png"
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--losses", default=",".join(n for names in FAMILIES.values() for n in names))
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "loss_study")
    parser.add_argument("--fresh", action="store_true", help="retrain losses that already have a result")
    parser.add_argument("--quick", action="store_true", help=f"make bench: {', '.join(QUICK_LOSSES)}, {QUICK[0]}")
    parser.add_argument("overrides", nargs="*", help="extra Hydra overrides for every run")
    args = parser.parse_args()
    if args.quick:  # the pipeline end to end in minutes; the study's numbers need the full epoch
        args.losses, args.overrides, args.fresh = ",".join(QUICK_LOSSES), [*QUICK, *args.overrides], True
        args.out = args.out.with_name(args.out.name + "_quick")
    args.out.mkdir(parents=True, exist_ok=True)
    results: dict[str, dict] = {}
    for name in args.losses.split(","):
        result_file = args.out / name / "result.json"
        if result_file.is_file() and not args.fresh:
            results[name] = json.loads(result_file.read_text())
            results[name]["telemetry"] = telemetry_at_end(args.out / name)
            print(f"{name}: kept earlier result (dev {results[name]['dev']:.2f})", flush=True)
            continue
        print(f"{name}: training ...", flush=True)
        results[name] = run_one(name, args.out / name, args.overrides)
        result_file.write_text(json.dumps(results[name], indent=2))
        r = results[name]
        print(f"{name}: dev {r['dev']:.2f} test {r['test']:.2f} ({r['seconds']:.0f} s)", flush=True)
        (args.out / "loss_study.md").write_text(markdown(results))
    (args.out / "loss_study.json").write_text(json.dumps(results, indent=2))
    (args.out / "loss_study.md").write_text(markdown(results))
    print(f"telemetry figure: {plot_telemetry(args.out, list(results))}")
    print("\n" + markdown(results))


if __name__ == "__main__":
    main()
