"""Decoder training step (issue 29): full fine-tuning vs LoRA vs LoRA + gradient checkpointing, padded vs padding-free.

A random Llama built in-process (`model=tiny-llama` resized: 8 layers, hidden 1024, 16 query heads,
4 key/value heads (Llama-3's and Mistral's 4:1 grouping), MLP 2816 (Llama's 8/3·hidden rounded up to
a multiple of 256), its 2000-token vocabulary; 92 M parameters, 90 M of them in the layers) trains
through sentemb's real step: the module of the composed config (SentembModule.from_config), the
Trainer with the job's callbacks, fused AdamW and clipping (`build_trainer`; CSV logger, so no W&B
service starts in every process), LLM2Vec's layout (bidirectional, mean pooling, attention dropout
0.1), InfoNCE. Every configuration takes the same batches: the first warmup+steps batches of the
wiki sample (seed 42; batch 16, max_length 32), checked by a hash of their token ids:
- full fine-tuning, padded (`model.padding_free=false`): the anchor;
- full fine-tuning, padding-free (tiny-llama's default);
- LoRA r 16 on every linear projection (`adapter=lora`), padding-free;
- LoRA + gradient checkpointing (`model.gradient_checkpointing=true`), padding-free.
The size: a full fine-tuning step is ~6 · 90 M parameters · ~880 real tokens (16 sentences, two
views) ≈ 0.5 TFLOP, ~2 s on 2 undisturbed Xeon cores in fp32: large enough that the matmuls, not
Python and Lightning overhead, take the time, and that weights, gradients and AdamW's two moments
(1.4 GiB) weigh as much as the activations (~1.5 GiB at batch 16); small enough that `make bench`'s
quick mode takes minutes.
With the 2000-token vocabulary, max_length 32 batches are ~85% real tokens, and sentemb packs a
batch only under 85% (PACK_BELOW, sentemb/encoders/models/padding_free.py), so about a third of them stay
padded under padding-free: the report counts the batches packed, and `make bench` also runs
`--max-length 64 --configs full_padded,full_padding_free` (~66% real tokens, every batch packed).

Each configuration runs in a fresh process (`--child`), so its memory is its own. Peak memory is
the kernel's high-water mark of the process's resident memory (VmHWM) over the training steps:
it is reset (`/proc/self/clear_refs` 5) when the first step starts and read after each step, so
model loading's transients are not counted and no allocation can slip between samples (a
sampler's gaps; torch's CPU profiler would see tensors only, not the allocator's slack, and slows
the step). The figure is that peak minus the process's RSS before the model was built (Python,
torch, the data and its batches, the same in every configuration): weights + gradients + optimizer
state + activations + allocator slack, i.e. what training this model costs. Where clear_refs is
not writable (not Linux), the lifetime peak (`ru_maxrss`) is used instead and the report says so.
On a GPU the figure is `torch.cuda.max_memory_allocated` over the same steps.

A step time is the interval between consecutive step ends; the first --warmup steps of each run
are untimed (AdamW's state is allocated, pages are first touched). The runs rotate their order
over rounds, after an untimed burn-in run of the anchor, and a ratio is the median of the per-round
ratios (time and memory alike); the report shows each round's time ratio, so a burst of other work
that hit one configuration shows. Threads: torch's default (every core), as the other benchmarks
(OMP_NUM_THREADS, inherited by the children, sets them); the load average before and after is
printed: other jobs on the cores slow every configuration (memory is unaffected). Tokens/s and MFU on
a GPU are not measured here (the real tokens/s printed are this CPU's). Issue 29 sets no targets
for these figures: the rows are for the record.

    python benchmarks/decoder_step.py [--rounds 3] [--steps 6] [--warmup 2] [--batch 16] [--max-length 32]
        [--configs full_padded,full_padding_free,lora,lora_gc] [--hidden 1024 --layers 8 --heads 16 --kv-heads 4
        --intermediate 2816]
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import json
import math
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from rows import exit_with, row, write_rows  # noqa: E402

ANCHOR = "full_padded"
# name → (label, overrides): LoRA's options pinned here, so the label says what ran whatever conf/adapter holds
CONFIGS: dict[str, tuple[str, list[str]]] = {
    ANCHOR: ("full fine-tuning, padded", ["model.padding_free=false"]),
    "full_padding_free": ("full fine-tuning, padding-free", ["model.padding_free=true"]),
    "lora": (
        "LoRA r16 all-linear, padding-free",
        ["model.padding_free=true", "adapter=lora", "adapter.r=16", "adapter.target_modules=all-linear"],
    ),
    "lora_gc": (
        "LoRA r16 all-linear + gradient checkpointing, padding-free",
        [
            "model.padding_free=true",
            "adapter=lora",
            "adapter.r=16",
            "adapter.target_modules=all-linear",
            "model.gradient_checkpointing=true",
        ],
    ),
}
# the decoder's shape: flag → model.backbone key, default
SHAPE = {
    "hidden": ("hidden_size", 1024),
    "layers": ("num_hidden_layers", 8),
    "heads": ("num_attention_heads", 16),
    "kv_heads": ("num_key_value_heads", 4),
    "intermediate": ("intermediate_size", 2816),
}
MIB = 2**20


def status_mib(field: str) -> float:
    """A memory field of /proc/self/status (VmRSS, VmHWM) in MiB."""
    with open("/proc/self/status") as handle:
        return int(re.search(rf"^{field}:\s+(\d+) kB", handle.read(), re.MULTILINE).group(1)) / 1024


def reset_peak() -> bool:
    """Reset the kernel's resident high-water mark to the current RSS (Linux >= 4.0); False where it cannot."""
    try:
        with open("/proc/self/clear_refs", "w") as handle:
            handle.write("5")
        return True
    except OSError:
        return False


def overrides(args: argparse.Namespace, config: str) -> list[str]:
    shape = [f"model.backbone.{key}={getattr(args, flag)}" for flag, (key, _) in SHAPE.items()]
    job = ["model=tiny-llama", "pooling=mean", "logger=csv", f"data.batch_size={args.batch}"]
    return [*job, f"data.max_length={args.max_length}", *shape, *CONFIGS[config][1]]


def child(args: argparse.Namespace) -> dict[str, Any]:
    """One configuration's run in this (fresh) process: step times, memory, parameter and optimizer-state sizes."""
    import lightning as L
    from hydra.utils import instantiate

    from sentemb.common.hydra_plumbing import compose_config
    from sentemb.common.paths import CONF_DIR
    from sentemb.encoders.models.adapters import base_model, is_adapted
    from sentemb.encoders.models.padding_free import worth_packing
    from sentemb.encoders.part_configs import build_part
    from sentemb.training.checks import prepare_run
    from sentemb.training.module import SentembModule
    from sentemb.training.trainer import build_trainer

    cuda = torch.cuda.is_available()

    class StepClock(L.Callback):
        """Step ends, and the memory high-water mark over the steps (reset when the first one starts)."""

        def __init__(self) -> None:
            self.ends: list[float] = []
            self.losses: list[float] = []
            self.peak_mib = 0.0
            self.lifetime_before_mib = 0.0
            self.reset = False

        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
            if self.ends:
                return
            self.lifetime_before_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
            if cuda:
                torch.cuda.reset_peak_memory_stats()
            self.reset = reset_peak()
            self.ends.append(time.perf_counter())

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
            if cuda:
                torch.cuda.synchronize()  # the step's kernels finished: its time is all in
            self.ends.append(time.perf_counter())
            self.losses.append(float(outputs["loss"]))
            if cuda:
                self.peak_mib = torch.cuda.max_memory_allocated() / MIB
            elif self.reset:
                self.peak_mib = status_mib("VmHWM")
            else:  # the lifetime peak: model loading included
                self.peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024

    with tempfile.TemporaryDirectory() as tmp:
        cfg = compose_config(CONF_DIR, "train", overrides(args, args.child), output_dir=Path(tmp))
        prepare_run(cfg)
        datamodule = instantiate(cfg.data, tokenizer=build_part("model.tokenizer", cfg.model.tokenizer))
        L.seed_everything(cfg.seed)
        datamodule.setup("fit")
        loader = iter(datamodule.train_dataloader())
        batches = [dict(next(loader)) for _ in range(args.warmup + args.steps)]
        digest = hashlib.sha256(b"".join(b["input_ids"].numpy().tobytes() for b in batches)).hexdigest()[:16]
        del datamodule, loader
        gc.collect()
        baseline_mib = 0.0 if cuda else status_mib("VmRSS")  # Python, torch, the data: the same in every config

        L.seed_everything(cfg.seed, workers=True)
        module = SentembModule.from_config(cfg)
        clock = StepClock()
        trainer = build_trainer(cfg, extra_callbacks=[clock], max_steps=len(batches))
        trainer.fit(module, train_dataloaders=torch.utils.data.DataLoader(batches, batch_size=None, shuffle=False))
        optimizer = trainer.optimizers[0]
        state_bytes = sum(
            t.numel() * t.element_size() for s in optimizer.state.values() for t in s.values() if torch.is_tensor(t)
        )
    parameters = list(module.parameters())
    backbone = module.encoder.backbone
    timed = [b - a for a, b in zip(clock.ends[:-1], clock.ends[1:], strict=True)][args.warmup :]
    timed_batches = batches[args.warmup :]
    packing = module.encoder.padding_free
    return {
        "config": args.child,
        "device": "cuda" if cuda else "cpu",
        "threads": torch.get_num_threads(),
        "batches_sha256": digest,
        "step_seconds": timed,
        "seconds_per_step": statistics.mean(timed),
        "losses_finite": all(map(math.isfinite, clock.losses)),
        "peak_method": "cuda" if cuda else "VmHWM over the steps" if clock.reset else "ru_maxrss (lifetime)",
        "baseline_mib": baseline_mib,
        "peak_mib": clock.peak_mib,
        "increase_mib": clock.peak_mib - baseline_mib,
        "lifetime_peak_mib": max(clock.lifetime_before_mib, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
        "parameters": sum(p.numel() for p in parameters),
        "trainable": sum(p.numel() for p in parameters if p.requires_grad),
        "parameter_mib": sum(p.numel() * p.element_size() for p in parameters) / MIB,
        "gradient_mib": sum(p.numel() * p.element_size() for p in parameters if p.requires_grad) / MIB,
        "optimizer_state_mib": state_bytes / MIB,
        "padding_free": packing,
        "gradient_checkpointing": base_model(backbone).is_activation_checkpointing,
        "adapter": is_adapted(backbone),
        "packed_batches": sum(packing and worth_packing(b["attention_mask"]) for b in timed_batches),
        "timed_batches": len(timed_batches),
        "real_tokens": statistics.mean(int(b["attention_mask"].sum()) for b in timed_batches),
        "padded_tokens": statistics.mean(b["attention_mask"].numel() for b in timed_batches),
    }


def check_configuration(result: dict[str, Any]) -> None:
    """A row must say what ran: a switch that did not take effect stops the benchmark (exit 2, not a missed target)."""
    overrides = CONFIGS[result["config"]][1]
    expected = {
        "padding_free": "model.padding_free=true" in overrides,
        "gradient_checkpointing": "model.gradient_checkpointing=true" in overrides,
        "adapter": "adapter=lora" in overrides,
    }
    wrong = {key: result[key] for key, value in expected.items() if result[key] != value}
    if wrong or not result["losses_finite"]:
        raise RuntimeError(f"{result['config']}: asked {expected}, ran {wrong or 'a non-finite loss'}")


def run_child(config: str, args: argparse.Namespace) -> dict[str, Any]:
    forwarded = [f"--{flag.replace('_', '-')}={getattr(args, flag)}" for flag in (*SHAPE, "batch", "max_length")]
    forwarded += [f"--steps={args.steps}", f"--warmup={args.warmup}"]
    with tempfile.TemporaryDirectory() as tmp:
        result = Path(tmp) / "result.json"
        command = [sys.executable, __file__, "--child", config, "--result", str(result), *forwarded]
        done = subprocess.run(command, capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"{config} failed ({done.returncode}):\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}")
        return json.loads(result.read_text())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3, help="rounds of every configuration, order rotating")
    parser.add_argument("--steps", type=int, default=6, help="timed steps per run")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps at the start of each run")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--max-length", type=int, default=32)
    for flag, (key, default) in SHAPE.items():
        parser.add_argument(f"--{flag.replace('_', '-')}", type=int, default=default, help=f"model.backbone.{key}")
    parser.add_argument("--configs", default=",".join(CONFIGS), help=f"comma-separated, of {', '.join(CONFIGS)}")
    parser.add_argument("--out", type=Path, default=None, help="default: benchmarks/results/<name>.md")
    parser.add_argument("--child", choices=list(CONFIGS), help=argparse.SUPPRESS)
    parser.add_argument("--result", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        args.result.write_text(json.dumps(child(args)))
        return 0
    names = [ANCHOR, *(c for c in args.configs.split(",") if c != ANCHOR)]
    unknown = set(names) - set(CONFIGS)
    if unknown:
        parser.error(f"--configs: {sorted(unknown)} are not among {list(CONFIGS)}")
    name = "decoder_step" + ("" if args.max_length == 32 else str(args.max_length))  # step_time's naming
    out = args.out or Path(__file__).resolve().parent / "results" / f"{name}.md"

    load_before = os.getloadavg()
    run_child(ANCHOR, args)  # the machine runs fastest when fresh: an untimed burn-in so no timed run has an advantage
    rounds: list[dict[str, dict[str, Any]]] = []
    for index in range(args.rounds):
        order = names[index % len(names) :] + names[: index % len(names)]
        rounds.append({})
        for config in order:
            result = run_child(config, args)
            check_configuration(result)
            rounds[-1][config] = result
            step, memory = result["seconds_per_step"], result["increase_mib"]
            print(f"round {index + 1} {config}: {step:.3f} s/step, peak +{memory:.0f} MiB", flush=True)
    load_after = os.getloadavg()
    digests = {r["batches_sha256"] for results in rounds for r in results.values()}
    if len(digests) != 1:
        raise RuntimeError(f"the configurations trained on different batches: {sorted(digests)}")

    def median(config: str, key: str) -> float:
        return statistics.median(results[config][key] for results in rounds)

    def ratios(config: str, key: str) -> list[float]:
        # a peak no higher than the baseline (possible only for a tiny model, e.g. the test's) has no ratio
        return [
            results[config][key] / results[ANCHOR][key] if results[ANCHOR][key] > 0 else math.nan for results in rounds
        ]

    def ratio(config: str, key: str) -> float:
        return statistics.median(ratios(config, key))

    def breakdown(config: str) -> list[float]:
        """Weights, gradients, AdamW state (exact sizes) and the peak increase less weights and state, in MiB."""
        weights, gradients, state = (
            rounds[0][config][k] for k in ("parameter_mib", "gradient_mib", "optimizer_state_mib")
        )
        return [weights, gradients, state, median(config, "increase_mib") - weights - state]

    first = rounds[0][ANCHOR]
    device, threads = first["device"], first["threads"]
    shape = ", ".join(f"{flag.replace('_', ' ')} {getattr(args, flag)}" for flag in SHAPE)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    packed = {c: rounds[0][c]["packed_batches"] for c in names}
    label = {c: CONFIGS[c][0] for c in names}
    lines = [
        f"# Decoder training step: random Llama ({shape}; {first['parameters'] / 1e6:.1f} M parameters), "
        f"batch {args.batch}, max_length {args.max_length}, mean pooling, InfoNCE ({device}, {threads} threads, "
        f"torch {torch.__version__}; {args.rounds} rounds of {args.steps} steps after {args.warmup} warm-up, "
        "each configuration in a fresh process)",
        "",
        f"Real tokens a step: {first['real_tokens']:.0f} of {first['padded_tokens']:.0f} padded "
        f"({first['real_tokens'] / first['padded_tokens']:.0%}) per view; timed batches packed under "
        f"model.padding_free=true: {max(packed.values())} of {first['timed_batches']} (sentemb packs a batch only "
        "under 85% real tokens, PACK_BELOW in sentemb/encoders/models/padding_free.py; the others stay padded).",
        "",
        f"| configuration | s/step (median) | time / {label[ANCHOR]} (median of rounds) | time ratio per round | "
        "real tokens/s | trained parameters | optimizer state MiB | peak memory MiB (RSS increase) | "
        f"memory / {label[ANCHOR]} (median of rounds) | process peak RSS MiB |",
        "|---|---|---|---|---|---|---|---|---|---|",
        *[
            f"| {label[c]} | {median(c, 'seconds_per_step'):.3f} | {ratio(c, 'seconds_per_step'):.3f} | "
            f"{' / '.join(f'{r:.2f}' for r in ratios(c, 'seconds_per_step'))} | "
            f"{2 * first['real_tokens'] / median(c, 'seconds_per_step'):.0f} | {rounds[0][c]['trainable']:,} | "
            f"{rounds[0][c]['optimizer_state_mib']:.1f} | {median(c, 'increase_mib'):.0f} | "
            f"{ratio(c, 'increase_mib'):.3f} | {median(c, 'lifetime_peak_mib'):.0f} |"
            for c in names
        ],
        "",
        "Peak memory: the process's resident high-water mark over the training steps "
        f"({first['peak_method']}) minus its RSS before the model was built ({first['baseline_mib']:.0f} MiB: "
        "Python, torch, data), each configuration in a fresh process. The sizes known exactly, and what the peak "
        "holds besides weights and AdamW state: activations and gradients (they overlap in time: gradients are "
        "freed after each update, and backward frees activations as it writes them) and the allocator's slack:",
        "",
        "| configuration | weights MiB | gradients MiB | AdamW state MiB | peak − weights − AdamW state MiB |",
        "|---|---|---|---|---|",
        *[f"| {label[c]} | {' | '.join(f'{v:.0f}' for v in breakdown(c))} |" for c in names],
        "",
        f"Load average (1 min) before / after: {load_before[0]:.2f} / {load_after[0]:.2f} on {cores} cores; above the "
        f"run's own {threads} threads, other jobs shared the cores: absolute s/step are then slower, and a burst that "
        "hits one configuration moves that round's time ratio (the per-round column); memory is unaffected.",
        "Tokens/s and MFU on a GPU: not measured here"
        + (" (no CUDA device on this machine)." if device == "cpu" else " (this script reports s/step and memory)."),
    ]
    report = "\n".join(lines)
    print("\n" + report)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(report + "\n")

    figure = f"decoder step (Llama {args.layers}x{args.hidden}, batch {args.batch}, max_length {args.max_length})"
    anchor = f"{label[ANCHOR]}, same run"
    rows = [
        row(f"{figure}: {label[c]}, {what}", median(c, key), anchor, median(ANCHOR, key), ratio(c, key), "—", None)
        for what, key in (("s/step", "seconds_per_step"), ("peak memory MiB (RSS increase)", "increase_mib"))
        for c in names
        if c != ANCHOR
    ]
    write_rows(name, rows)
    return 0


if __name__ == "__main__":
    exit_with(main)
