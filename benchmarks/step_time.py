"""Training step time of `python -m sentemb.train` (defaults) against a bare PyTorch SimCSE loop.

Both run in this process on the same batches (the first warmup+steps batches of the default
data module, seed 42): the bare loop is the method written out by hand (MiniLM, CLS + MLP,
InfoNCE τ=0.05, AdamW 3e-5, linear decay, clip 1.0); the framework run is the real Trainer
with the default callbacks and W&B logger, dev evaluation excluded. Both draw their batches
from the same DataLoader, so their dropout masks, and hence their losses, agree step by step.
A step time is the interval between consecutive step ends. The machine drifts by a few
percent between identical runs, so the two alternate over several rounds (ABBA order) and
the reported ratio is the median of the per-round ratios, after an untimed burn-in run.

    python benchmarks/step_time.py [--rounds 6] [--steps 10] [--warmup 2]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import lightning as L
import torch
import torch.nn.functional as F
from hydra.utils import instantiate
from torch import nn
from transformers import get_linear_schedule_with_warmup

# the two runs are the same method through different code (F.cross_entropy vs sentemb's InfoNCE, Lightning's
# optimizer loop): float32 losses of O(1) may round a few ulps apart (~1e-7) and drift over the <= 12 updates;
# 1e-4 leaves room for that and still catches another loss, batch or dropout mask (1e-2 and more)
LOSS_TOLERANCE = 1e-4

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from rows import row, write_rows  # noqa: E402

from sentemb.common.hydra_plumbing import compose_config  # noqa: E402
from sentemb.common.paths import CONF_DIR  # noqa: E402
from sentemb.runs.wandb_runs import finish_wandb  # noqa: E402
from sentemb.training.checks import prepare_run  # noqa: E402
from sentemb.training.module import SentembModule  # noqa: E402
from sentemb.training.trainer import build_trainer  # noqa: E402


def bare_loop(cfg, batches: list[dict], total_steps: int) -> tuple[list[float], list[float]]:
    """SimCSE unsup written out in plain PyTorch; returns (step-end times, losses)."""
    torch.use_deterministic_algorithms(False)  # plain PyTorch defaults (Lightning may have switched them on)
    L.seed_everything(cfg.seed, workers=True)
    backbone = instantiate(cfg.model.backbone)
    mlp = nn.Sequential(nn.Linear(backbone.config.hidden_size, backbone.config.hidden_size), nn.Tanh())
    params = list(backbone.parameters()) + list(mlp.parameters())
    optimizer = torch.optim.AdamW(params, lr=cfg.optimizer.lr, weight_decay=0.0)
    scheduler = get_linear_schedule_with_warmup(optimizer, 0, total_steps)
    backbone.train()
    ends, losses = [time.perf_counter()], []
    for batch in torch.utils.data.DataLoader(batches, batch_size=None, shuffle=False):
        n = batch["input_ids"].shape[0]
        doubled = {k: torch.cat([v, v]) for k, v in batch.items()}
        cls = backbone(**doubled).last_hidden_state[:, 0]
        z = F.normalize(mlp(cls), dim=-1)
        sim = z[:n] @ z[n:].T / cfg.loss.tau
        loss = F.cross_entropy(sim, torch.arange(n))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item())
        ends.append(time.perf_counter())
    return ends, losses


class StepClock(L.Callback):
    def __init__(self) -> None:
        self.ends: list[float] = []
        self.losses: list[float] = []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if not self.ends:
            self.ends.append(time.perf_counter())

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.losses.append(float(outputs["loss"]))
        self.ends.append(time.perf_counter())


def framework_run(cfg, batches: list[dict], total_steps: int) -> tuple[list[float], list[float]]:
    """The default job's module, Trainer, callbacks and logger (minus dev evaluation) on the same batches."""
    L.seed_everything(cfg.seed, workers=True)
    module = SentembModule.from_config(cfg)
    clock = StepClock()
    trainer = build_trainer(cfg, extra_callbacks=[clock], max_steps=len(batches))
    loader = torch.utils.data.DataLoader(batches, batch_size=None, shuffle=False)
    module.configure_optimizers = _fixed_schedule(module, total_steps)
    trainer.fit(module, train_dataloaders=loader)
    finish_wandb()
    return clock.ends, clock.losses


def _fixed_schedule(module: SentembModule, total_steps: int):
    """Same linear-decay horizon as the bare loop (the real job uses the epoch's length)."""

    def configure():
        optimizer = instantiate(module.hparams.optimizer)(params=module.parameters())
        scheduler = get_linear_schedule_with_warmup(optimizer, 0, total_steps)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}

    return configure


def step_times(ends: list[float], warmup: int) -> list[float]:
    return [b - a for a, b in zip(ends[:-1], ends[1:], strict=True)][warmup:]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=6, help="bare/sentemb pairs, alternating order")
    parser.add_argument("--steps", type=int, default=10, help="timed steps per run")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps at the start of each run")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/step_time.md"))
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        cfg = compose_config(CONF_DIR, "train", [], output_dir=Path(tmp))
        prepare_run(cfg)
        datamodule = instantiate(cfg.data, tokenizer=instantiate(cfg.model.tokenizer))
        L.seed_everything(cfg.seed)
        datamodule.setup("fit")
        loader = iter(datamodule.train_dataloader())
        batches = [dict(next(loader)) for _ in range(args.warmup + args.steps)]
        total = len(datamodule.train_dataloader())

        # the machine runs fastest when fresh: an untimed burn-in so the first timed run has no advantage
        bare_loop(cfg, batches, total)
        rounds = []
        for index in range(args.rounds):
            order = ("bare", "sentemb") if index % 2 == 0 else ("sentemb", "bare")
            result = {}
            for name in order:
                run = bare_loop if name == "bare" else framework_run
                ends, losses = run(cfg, batches, total)
                result[name] = (statistics.mean(step_times(ends, args.warmup)), losses)
            rounds.append(result)

    ratios = [r["sentemb"][0] / r["bare"][0] for r in rounds]
    ratio = statistics.median(ratios)
    pooled = statistics.mean(r["sentemb"][0] for r in rounds) / statistics.mean(r["bare"][0] for r in rounds)
    loss_gap = max(abs(a - b) for r in rounds for a, b in zip(r["bare"][1], r["sentemb"][1], strict=True))
    lines = [
        f"# Step time: sentemb default job vs bare PyTorch loop ({args.rounds} rounds of {args.steps} steps after "
        f"{args.warmup} warm-up, batch {cfg.data.batch_size}, {torch.get_num_threads()} threads, "
        f"torch {torch.__version__})",
        "",
        "| round | order | bare s/step | sentemb s/step | ratio |",
        "|---|---|---|---|---|",
        *[
            f"| {i + 1} | {' then '.join(r)} | {r['bare'][0]:.3f} | {r['sentemb'][0]:.3f} | {ratios[i]:.3f} |"
            for i, r in enumerate(rounds)
        ],
        "",
        f"ratio sentemb / bare, median of rounds: **{ratio:.3f}** (range {min(ratios):.3f}-{max(ratios):.3f}; "
        f"pooled means {pooled:.3f})",
        f"largest per-step loss difference, bare vs sentemb on the same batches: {loss_gap:.2e} "
        f"(must stay within {LOSS_TOLERANCE:.0e}: {'ok' if loss_gap <= LOSS_TOLERANCE else 'FAILED'})",
    ]
    report = "\n".join(lines)
    print("\n" + report)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(report + "\n")
    bare, sentemb = (statistics.mean(r[name][0] for r in rounds) for name in ("bare", "sentemb"))
    passed = ratio <= 1.05 and loss_gap <= LOSS_TOLERANCE
    figure = f"training step, default job (batch {cfg.data.batch_size}), s/step; per-step losses equal"
    write_rows("step_time", [row(figure, sentemb, "bare PyTorch loop, same batches", bare, ratio, "<= 1.05", passed)])
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
