"""Checkpoint writes: sentemb's atomic write (temporary file, fsync, rename) against Lightning's own, same run.

A run writes a checkpoint at each dev evaluation (best-step<N>.ckpt, last.ckpt): the default MiniLM job's holds
its weights and AdamW's two moments (~270 MB). Both writers save the same checkpoint dict into the same folder,
interleaved round by round; the figure is the median of the per-round ratios (atomic / Lightning).

    python benchmarks/checkpoint_write.py [--rounds 5] [--model minilm] [--out DIR]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from rows import exit_with, row, write_rows  # noqa: E402

from sentemb.common.hydra_plumbing import compose_config  # noqa: E402
from sentemb.common.paths import CONF_DIR  # noqa: E402
from sentemb.training.checkpoints import AtomicCheckpointIO  # noqa: E402
from sentemb.training.module import SentembModule  # noqa: E402

TARGET = 1.25  # the atomic write's fsync and rename may cost a little; a checkpoint every 125 steps


def checkpoint_of(model: str) -> dict:
    """A checkpoint dict as Lightning saves one: the module's weights and AdamW's state after one step."""
    cfg = compose_config(CONF_DIR, "train", [f"model={model}", "logger=none"])
    module = SentembModule.from_config(cfg)
    parameters = [p for p in module.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(parameters, lr=1e-5)
    for p in parameters:
        p.grad = torch.zeros_like(p)
    optimizer.step()
    return {"state_dict": module.state_dict(), "optimizer_states": [optimizer.state_dict()], "global_step": 1}


def seconds(writer: object, checkpoint: dict, path: Path) -> float:
    started = time.perf_counter()
    writer.save_checkpoint(checkpoint, path)
    return time.perf_counter() - started


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--model", default="minilm")
    parser.add_argument("--out", type=Path, default=None, help="the folder written to (default: a temporary one)")
    args = parser.parse_args()
    checkpoint = checkpoint_of(args.model)
    size = sum(t.numel() * t.element_size() for t in checkpoint["state_dict"].values())
    ratios, plain, atomic = [], [], []
    with tempfile.TemporaryDirectory(dir=args.out) as folder:
        writers = {"lightning": TorchCheckpointIO(), "atomic": AtomicCheckpointIO()}
        seconds(writers["lightning"], checkpoint, Path(folder) / "warmup.ckpt")  # first-touch of the page cache
        for _ in range(args.rounds):
            anchor = seconds(writers["lightning"], checkpoint, Path(folder) / "lightning.ckpt")
            figure = seconds(writers["atomic"], checkpoint, Path(folder) / "atomic.ckpt")
            plain.append(anchor)
            atomic.append(figure)
            ratios.append(figure / anchor)
        written = (Path(folder) / "atomic.ckpt").stat().st_size
    ratio = statistics.median(ratios)
    print(
        f"{args.model}: weights {size / 2**20:.0f} MiB, checkpoint {written / 2**20:.0f} MiB; Lightning's write "
        f"{statistics.median(plain):.3f} s, atomic {statistics.median(atomic):.3f} s; ratio {ratio:.2f} "
        f"(per round {', '.join(f'{r:.2f}' for r in ratios)})"
    )
    passed = ratio <= TARGET
    rows = [
        row(
            f"checkpoint write, atomic ({args.model}, s)",
            statistics.median(atomic),
            "Lightning's TorchCheckpointIO",
            statistics.median(plain),
            ratio,
            f"<= {TARGET}",
            passed,
        )
    ]
    write_rows("checkpoint_write", rows)
    return 0 if passed else 1


if __name__ == "__main__":
    exit_with(main)
