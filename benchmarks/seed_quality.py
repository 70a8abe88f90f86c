"""Quality is unchanged by the speed-ups: one epoch of the default job, seeds 1-3, for padded fp32,
padding-free fp32 (the default) and the fast preset (trainer=fast); STS-B dev and test mean ± std.

Each job is `python -m sentemb.train seed=S <variant's overrides> logger=csv`, its outcome read
from its metrics.json; a job whose metrics.json says ok is not run again, so an interrupted
study resumes. A variant agrees with padded fp32 when the difference of the means is within two
standard errors of that difference (SE = sqrt(s_a²/n + s_b²/n), each s the seeds' standard deviation).

    python benchmarks/seed_quality.py [--seeds 1 2 3] [--out benchmarks/results/seed_quality]
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from sentemb.common.metric_names import DEV_SPEARMAN_BEST_RESCORED, TEST_SPEARMAN, read_metric  # noqa: E402

VARIANTS = {
    "padded fp32": ["model.padding_free=false"],
    "padding-free fp32 (default)": [],
    "fast preset (trainer=fast)": ["trainer=fast"],
}
METRICS = {"STS-B dev": DEV_SPEARMAN_BEST_RESCORED, "STS-B test": TEST_SPEARMAN}


def run_job(directory: Path, seed: int, overrides: list[str]) -> dict:
    record = directory / "metrics.json"
    if record.is_file() and json.loads(record.read_text())["status"] == "ok":
        return json.loads(record.read_text())
    command = [sys.executable, "-m", "sentemb.train", f"seed={seed}", *overrides, "logger=csv"]
    command.append(f"hydra.run.dir={directory}")
    print("$", " ".join(command[1:]), flush=True)
    started = time.perf_counter()
    with open(directory.parent / f"{directory.name}.log", "w") as log:
        subprocess.run(command, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, check=False)
    print(f"  {time.perf_counter() - started:.0f} s", flush=True)
    return json.loads(record.read_text())


def mean_std(values: list[float]) -> tuple[float, float]:
    return statistics.mean(values), statistics.stdev(values) if len(values) > 1 else 0.0


def table(results: dict[str, list[dict]]) -> list[str]:
    """Markdown: each variant's mean ± std (Spearman x100, as metrics.json holds it) and its difference from padded fp32
    against 2 SE."""
    anchor = next(iter(results))
    lines = [
        "| variant | "
        + " | ".join(f"{m} mean ± std" for m in METRICS)
        + " | "
        + " | ".join(f"Δ{m} vs padded (2 SE)" for m in METRICS)
        + " | wall time / job |",
        "|---|" + "---|" * (2 * len(METRICS) + 1),
    ]
    for name, records in results.items():
        cells, deltas = [], []
        for key in METRICS.values():
            # a reused record may be older than today's metric names
            values = [read_metric(r["metrics"], key) for r in records]
            base = [read_metric(r["metrics"], key) for r in results[anchor]]
            (mean, std), (base_mean, base_std) = mean_std(values), mean_std(base)
            cells.append(f"{mean:.2f} ± {std:.2f}")
            two_se = 2 * math.sqrt(std**2 / len(values) + base_std**2 / len(base))
            delta = mean - base_mean
            verdict = "—" if name == anchor else ("within" if abs(delta) <= two_se else "**outside**")
            deltas.append("—" if name == anchor else f"{delta:+.2f} ({two_se:.2f}): {verdict}")
        wall = statistics.mean(r["wall_time_s"] for r in records)
        lines.append(f"| {name} | " + " | ".join(cells) + " | " + " | ".join(deltas) + f" | {wall:.0f} s |")
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "seed_quality")
    args = parser.parse_args()
    results: dict[str, list[dict]] = {}
    for seed in args.seeds:  # seed-major: an interrupted study has every variant's first seeds
        for name, overrides in VARIANTS.items():
            slug = name.split(" (")[0].replace(" ", "_")
            directory = args.out / f"{slug}_seed{seed}"
            directory.parent.mkdir(parents=True, exist_ok=True)
            results.setdefault(name, []).append(run_job(directory, seed, overrides))
    failed = [(n, r["message"]) for n, rs in results.items() for r in rs if r["status"] != "ok"]
    if failed:
        print("failed jobs:", failed, file=sys.stderr)
        return 2
    per_seed = [
        f"| {name} | "
        + " | ".join(
            f"{read_metric(r['metrics'], METRICS['STS-B dev']):.2f} / "
            f"{read_metric(r['metrics'], METRICS['STS-B test']):.2f}"
            for r in records
        )
        + " |"
        for name, records in results.items()
    ]
    report = [
        f"# One epoch of the default job, seeds {', '.join(map(str, args.seeds))} (STS-B Spearman x100)",
        "",
        *table(results),
        "",
        "| variant | " + " | ".join(f"seed {s} dev / test" for s in args.seeds) + " |",
        "|---|" + "---|" * len(args.seeds),
        *per_seed,
    ]
    text = "\n".join(report) + "\n"
    (args.out / "seed_quality.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
