"""GradCache cost: MiniLM at batch 512 in chunks of 64 against plain batch-64 steps on the same sentences.

Each configuration runs in a fresh process (`--child`), so its peak memory is its own: peak RSS
on CPU (`ru_maxrss`: the process's high-water mark, Python and torch included), and
`torch.cuda.max_memory_allocated` on a GPU. The child also reports its RSS right before the first
step (model, data and tokenised batches loaded), so the step's own increment shows too. Both
configurations train the default job's module (CLS + MLP, InfoNCE, AdamW, clip 1.0) on the same
sentences: the cached run takes batches of 512, the plain run the same 512 sentences as 8
batches of 64, each padded to its own longest (GradCache trims each chunk the same way). Time
per sample is the mean step time over the timed steps divided by the batch size; the two
configurations alternate (plain, cached, cached, plain, ...) and the ratios use pooled means.
A third configuration chunks the same batches by real tokens (`grad_cache.tokens`, rows sorted by
length) with a budget of the sentence chunks' mean token count (--tokens, default: measured on
the batches), so both make about as many chunks: time per sample and peak memory against the
sentence chunks.

    python benchmarks/grad_cache.py [--rounds 2] [--steps 2] [--warmup 1] [--batch 512] [--chunk 64] [--tokens N]
Targets (issue 11): peak memory <= 1.5x the plain batch-64 step, time per sample <= 1.4x; token chunks
(issue 20): time per sample <= the sentence chunks' (reported: their peak memory ratio).
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from rows import row, write_rows  # noqa: E402

MEMORY_TARGET, TIME_TARGET = 1.5, 1.4


def rss_mib() -> float:
    with open("/proc/self/statm") as handle:
        return int(handle.read().split()[1]) * resource.getpagesize() / 2**20


def split(batch: dict[str, torch.Tensor], rows: int) -> list[dict[str, torch.Tensor]]:
    """Batches of `rows` sentences, each trimmed to its own longest (what a batch-64 DataLoader would pad to)."""
    from sentemb.training.grad_cache import row_chunks

    return row_chunks(batch, rows)


def child(args: argparse.Namespace) -> dict:
    import lightning as L
    from hydra.utils import instantiate

    from sentemb.common.hydra_plumbing import compose_config
    from sentemb.common.paths import CONF_DIR
    from sentemb.encoders.part_configs import build_part
    from sentemb.training.checks import prepare_run
    from sentemb.training.module import SentembModule

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    with tempfile.TemporaryDirectory() as tmp:
        cfg = compose_config(CONF_DIR, "train", [f"data.batch_size={args.batch}"], output_dir=Path(tmp))
        prepare_run(cfg)
        datamodule = instantiate(cfg.data, tokenizer=build_part("model.tokenizer", cfg.model.tokenizer))
        datamodule.setup("fit")
        loader = iter(datamodule.train_dataloader())
        big = [dict(next(loader)) for _ in range(args.warmup + args.steps)]
    cached = args.child != "plain"
    batches = big if cached else [small for batch in big for small in split(batch, args.chunk)]
    per_step = args.batch if cached else args.chunk
    warmup = args.warmup * (1 if cached else args.batch // args.chunk)
    # the token budget: the mean real tokens of a sentence chunk (2·chunk rows: both views)
    tokens = args.tokens or round(
        2 * args.chunk * statistics.mean(float(b["attention_mask"].sum(1).float().mean()) for b in big)
    )

    L.seed_everything(cfg.seed)
    cfg.grad_cache = {"cached": args.chunk, "cached_tokens": {"sentences": None, "tokens": tokens}}.get(args.child)
    module = SentembModule.from_config(cfg)
    module.to(device).train()
    optimizer = torch.optim.AdamW(module.parameters(), lr=cfg.optimizer.lr, weight_decay=0.0)
    before = rss_mib()
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    ends = [time.perf_counter()]
    for batch in batches:
        batch = {k: v.to(device) for k, v in batch.items()}
        with torch.autocast(device.type, dtype=torch.float16, enabled=device.type == "cuda"):
            backward, _, _ = module.step_loss(batch)
        module.backward(backward)
        torch.nn.utils.clip_grad_norm_(module.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if device.type == "cuda":
            torch.cuda.synchronize()
        ends.append(time.perf_counter())
    timed = [b - a for a, b in zip(ends[:-1], ends[1:], strict=True)][warmup:]
    return {
        "config": args.child,
        "tokens": tokens,
        "device": device.type,
        "seconds_per_sample": statistics.mean(timed) / per_step,
        "peak_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "before_first_step_mib": before,
        "cuda_peak_mib": torch.cuda.max_memory_allocated() / 2**20 if device.type == "cuda" else None,
        "timed_steps": len(timed),
        "batch": per_step,
    }


def run_child(name: str, args: argparse.Namespace) -> dict:
    command = [sys.executable, __file__, "--child", name, *sys.argv[1:]]
    out = subprocess.run(command, check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2, help="plain/cached pairs, alternating order")
    parser.add_argument("--steps", type=int, default=2, help="timed batch-512 steps (the plain run: 8x as many)")
    parser.add_argument("--warmup", type=int, default=1, help="untimed batch-512 steps first (plain: 8x)")
    parser.add_argument("--batch", type=int, default=512)
    parser.add_argument("--chunk", type=int, default=64)
    parser.add_argument("--tokens", type=int, default=None, help="token budget (default: a sentence chunk's mean)")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/grad_cache.md"))
    parser.add_argument("--child", choices=["plain", "cached", "cached_tokens"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.batch % args.chunk:
        parser.error("--batch must be a multiple of --chunk: the plain run takes the same sentences")
    if args.child:
        print(json.dumps(child(args)))
        return 0

    runs: dict[str, list[dict]] = {"plain": [], "cached": [], "cached_tokens": []}
    for index in range(args.rounds):
        for name in list(runs) if index % 2 == 0 else list(runs)[::-1]:
            runs[name].append(run_child(name, args))
            print(json.dumps(runs[name][-1]), flush=True)

    def mean(name: str, key: str) -> float:
        return statistics.mean(r[key] for r in runs[name])

    def peak(name: str) -> float:  # the high-water mark is what must fit
        key = "cuda_peak_mib" if runs[name][0]["device"] == "cuda" else "peak_mib"
        return max(r[key] for r in runs[name])

    time_ratio = mean("cached", "seconds_per_sample") / mean("plain", "seconds_per_sample")
    token_time_ratio = mean("cached_tokens", "seconds_per_sample") / mean("cached", "seconds_per_sample")
    token_memory_ratio = peak("cached_tokens") / peak("cached")
    budget = runs["cached_tokens"][0]["tokens"]
    memory_ratio = peak("cached") / peak("plain")
    step_memory = {n: max(r["peak_mib"] - r["before_first_step_mib"] for r in runs[n]) for n in runs}
    device = runs["plain"][0]["device"]
    labels = {
        "plain": f"plain batch {args.chunk}",
        "cached": f"batch {args.batch}, grad_cache.sentences={args.chunk}",
        "cached_tokens": f"batch {args.batch}, grad_cache.tokens={budget}",
    }
    lines = [
        f"# GradCache: batch {args.batch} in chunks of {args.chunk} vs plain batch {args.chunk} (MiniLM, {device}, "
        f"{torch.get_num_threads()} threads, torch {torch.__version__}; {args.rounds} rounds, {args.steps} timed "
        f"batch-{args.batch} steps = {args.steps * args.batch // args.chunk} plain steps each)",
        "",
        "| configuration | ms / sample | peak memory MiB | step's increment over the loaded process MiB |",
        "|---|---|---|---|",
        *[
            f"| {labels[n]} | {1000 * mean(n, 'seconds_per_sample'):.2f} | {peak(n):.0f} | {step_memory[n]:.0f} |"
            for n in runs
        ],
        "",
        f"peak memory ratio cached / plain: **{memory_ratio:.3f}** (target <= {MEMORY_TARGET}: "
        f"{'ok' if memory_ratio <= MEMORY_TARGET else 'FAILED'})",
        f"time per sample ratio cached / plain: **{time_ratio:.3f}** (target <= {TIME_TARGET}: "
        f"{'ok' if time_ratio <= TIME_TARGET else 'FAILED'})",
        f"step's own memory ratio (peak minus the process before its first step): "
        f"{step_memory['cached'] / step_memory['plain']:.3f}",
        f"token chunks / sentence chunks: time per sample **{token_time_ratio:.3f}** (target <= 1.0: "
        f"{'ok' if token_time_ratio <= 1.0 else 'FAILED'}), peak memory {token_memory_ratio:.3f}",
    ]
    report = "\n".join(lines)
    print("\n" + report)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(report + "\n")
    anchor = f"plain batch {args.chunk}, fresh process"
    label = f"GradCache batch {args.batch} / chunks {args.chunk}"
    cached_ms, plain_ms = (1000 * mean(n, "seconds_per_sample") for n in ("cached", "plain"))
    write_rows(
        "grad_cache",
        [
            row(f"{label}: peak memory MiB", peak("cached"), anchor, peak("plain"), memory_ratio,
                f"<= {MEMORY_TARGET}", memory_ratio <= MEMORY_TARGET),
            row(f"{label}: ms per sample", cached_ms, anchor, plain_ms, time_ratio,
                f"<= {TIME_TARGET}", time_ratio <= TIME_TARGET),
            row(f"GradCache batch {args.batch} / token chunks {budget}: ms per sample",
                1000 * mean("cached_tokens", "seconds_per_sample"), f"sentence chunks {args.chunk}", cached_ms,
                token_time_ratio, "<= 1.0", token_time_ratio <= 1.0),
            row(f"GradCache batch {args.batch} / token chunks {budget}: peak memory MiB", peak("cached_tokens"),
                f"sentence chunks {args.chunk}", peak("cached"), token_memory_ratio, "—", None),
        ],
    )  # fmt: skip
    passed = memory_ratio <= MEMORY_TARGET and time_ratio <= TIME_TARGET and token_time_ratio <= 1.0
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
