"""Training step time of `python -m sentemb.train` against a bare PyTorch loop and sentence-transformers' trainer.

All runs take the same batches (the first warmup+steps batches of the default data module,
seed 42) in this process:
- the bare loop: the method written out by hand in float32 on padded batches (MiniLM, CLS + MLP,
  InfoNCE τ=0.05, AdamW 3e-5, linear decay, clip 1.0): the anchor;
- sentemb through the real Trainer with the default callbacks and W&B logger (dev evaluation
  excluded): padded fp32 (model.padding_free=false), padding-free fp32 (the default job) and the
  fast preset (trainer=fast: bf16 autocast where the hardware has it);
- sentence-transformers' `SentenceTransformerTrainer` with `MultipleNegativesRankingLoss` (scale
  1/τ) on (sentence, sentence) pairs, its documented unsupervised SimCSE recipe (mean pooling,
  max_seq_length as data.max_length), same model, batches (in order), lr and schedule, in fp32 and
  in bf16: the tool a user would pick instead.
Every run sees the same batches. Bare and sentemb padded fp32 draw the same dropout masks, so their
per-step losses agree (checked); padding-free draws its masks over the packed tokens, a different
draw of the same distribution (tests/test_padding_free.py shows its loss and gradients equal the
padded step's with dropout 0).
A step time is the interval between consecutive step ends. The machine drifts by a few percent,
so the runs rotate their order over rounds and a ratio is the median of the per-round ratios,
after an untimed burn-in run. sentemb logs (and computes the paradigm telemetry) every
trainer.log_every_n_steps=10 steps: one of the default mode's 10 timed steps, none of the quick
mode's 6; a logging step's extra ~50 ms is ~0.5% of a MiniLM CPU step over 10 steps.

`--pooling prompt|hicl --max-length 64` times those jobs (the bare loop and sentence-transformers
have no prompt or HiCL pooling): the anchor is then sentemb's own padded fp32 run.

    python benchmarks/step_time.py [--rounds 2] [--steps 6] [--warmup 2] [--pooling cls] [--max-length 32]
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
from transformers import TrainerCallback, get_linear_schedule_with_warmup

# the bare and sentemb fp32 runs are the same method through different code (F.cross_entropy vs sentemb's
# InfoNCE, Lightning's optimizer loop, packed vs padded matmuls): float32 losses of O(1) may round a few ulps
# apart (~1e-7) and drift over the <= 12 updates; 1e-4 still catches another loss, batch or dropout mask (1e-2+)
LOSS_TOLERANCE = 1e-4
PADDED, PADDING_FREE, FAST = "sentemb padded fp32", "sentemb padding-free fp32 (default)", "sentemb trainer=fast"
BARE, ST_FP32, ST_BF16 = (
    "bare PyTorch loop fp32",
    "sentence-transformers trainer fp32",
    "sentence-transformers trainer bf16",
)
SENTEMB_VARIANTS = {PADDED: ["model.padding_free=false"], PADDING_FREE: [], FAST: ["trainer=fast"]}

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from rows import row, write_rows  # noqa: E402

from sentemb.common.hydra_plumbing import compose_config  # noqa: E402
from sentemb.common.paths import CONF_DIR  # noqa: E402
from sentemb.encoders.part_configs import build_part  # noqa: E402
from sentemb.runs.wandb_runs import finish_wandb  # noqa: E402
from sentemb.training.checks import prepare_run  # noqa: E402
from sentemb.training.module import SentembModule  # noqa: E402
from sentemb.training.precision import fastest_precision  # noqa: E402
from sentemb.training.trainer import build_trainer  # noqa: E402


def bare_loop(
    cfg, batches: list[dict], total_steps: int, device: str = "cpu", autocast: torch.dtype | None = None
) -> tuple[list[float], list[float]]:
    """SimCSE unsup written out in plain PyTorch on `device` (`autocast`: e.g. torch.bfloat16 around the forward
    passes; the similarities stay float32); returns (step-end times, losses)."""
    torch.use_deterministic_algorithms(False)  # plain PyTorch defaults (Lightning may have switched them on)
    L.seed_everything(cfg.seed, workers=True)
    backbone = build_part("model.backbone", cfg.model.backbone).to(device)
    mlp = nn.Sequential(nn.Linear(backbone.config.hidden_size, backbone.config.hidden_size), nn.Tanh()).to(device)
    params = list(backbone.parameters()) + list(mlp.parameters())
    optimizer = torch.optim.AdamW(params, lr=cfg.optimizer.lr, weight_decay=0.0)
    scheduler = get_linear_schedule_with_warmup(optimizer, 0, total_steps)
    backbone.train()
    ends, losses = [time.perf_counter()], []
    for batch in torch.utils.data.DataLoader(batches, batch_size=None, shuffle=False):
        n = batch["input_ids"].shape[0]
        doubled = {k: torch.cat([v, v]).to(device, non_blocking=True) for k, v in batch.items()}
        with torch.autocast(torch.device(device).type, dtype=autocast, enabled=autocast is not None):
            cls = backbone(**doubled).last_hidden_state[:, 0]
            z = F.normalize(mlp(cls).float(), dim=-1)
        sim = z[:n] @ z[n:].T / cfg.loss.tau
        loss = F.cross_entropy(sim, torch.arange(n, device=device))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item())  # .item() waits for the step's kernels: the time below is the step's
        ends.append(time.perf_counter())
    return ends, losses


def synchronize(device: torch.device) -> None:
    """Wait for the GPU's queued kernels, so a wall-clock step time is the step's (no-op on the CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class StepClock(L.Callback):
    def __init__(self) -> None:
        self.ends: list[float] = []
        self.losses: list[float] = []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if not self.ends:
            synchronize(pl_module.device)
            self.ends.append(time.perf_counter())

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.losses.append(float(outputs["loss"]))
        synchronize(pl_module.device)
        self.ends.append(time.perf_counter())


def framework_run(cfg, batches: list[dict], total_steps: int) -> tuple[list[float], list[float]]:
    """The job's module, Trainer, callbacks and logger (minus dev evaluation) on the same batches."""
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


class TrainerClock(TrainerCallback):
    def __init__(self) -> None:
        self.ends: list[float] = []

    def on_step_begin(self, args, state, control, **kwargs) -> None:
        if not self.ends:
            synchronize(args.device)
            self.ends.append(time.perf_counter())

    def on_step_end(self, args, state, control, **kwargs) -> None:
        synchronize(args.device)
        self.ends.append(time.perf_counter())


def st_trainer_run(cfg, texts: list[list[str]], bf16: bool) -> tuple[list[float], list[float]]:
    """sentence-transformers' unsupervised SimCSE recipe on the same sentences, batches and order."""
    from datasets import Dataset
    from sentence_transformers import (
        DefaultBatchSampler,
        SentenceTransformer,
        SentenceTransformerTrainer,
        SentenceTransformerTrainingArguments,
    )
    from sentence_transformers.sentence_transformer.losses import MultipleNegativesRankingLoss
    from sentence_transformers.sentence_transformer.modules import Pooling, Transformer

    L.seed_everything(cfg.seed, workers=True)
    transformer = Transformer(cfg.model.name_or_path, max_seq_length=cfg.data.max_length)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = SentenceTransformer(modules=[transformer, Pooling(transformer.get_embedding_dimension())], device=device)
    flat = [sentence for batch in texts for sentence in batch]
    size = len(texts[0])

    def in_order(dataset, **kwargs):  # the same batches as the other runs, in the same order
        return DefaultBatchSampler(torch.utils.data.SequentialSampler(dataset), **{**kwargs, "batch_size": size})

    clock = TrainerClock()
    with tempfile.TemporaryDirectory() as tmp:
        args = SentenceTransformerTrainingArguments(
            output_dir=tmp,
            per_device_train_batch_size=size,
            learning_rate=cfg.optimizer.lr,
            weight_decay=0.0,
            lr_scheduler_type="linear",
            max_steps=len(texts),
            max_grad_norm=1.0,
            bf16=bf16,
            use_cpu=device == "cpu",
            save_strategy="no",
            report_to="none",
            logging_steps=1,
            disable_tqdm=True,
            seed=cfg.seed,
            batch_sampler=in_order,
        )
        trainer = SentenceTransformerTrainer(
            model=model,
            args=args,
            train_dataset=Dataset.from_dict({"anchor": flat, "positive": flat}),
            loss=MultipleNegativesRankingLoss(model, scale=1.0 / cfg.loss.tau),
            callbacks=[clock],
        )
        trainer.train()
    return clock.ends, []


def step_times(ends: list[float], warmup: int) -> list[float]:
    return [b - a for a, b in zip(ends[:-1], ends[1:], strict=True)][warmup:]


def batch_texts(datamodule, count: int) -> list[list[str]]:
    """The sentences of the data module's first `count` batches (its loader's own shuffled order)."""
    from datasets import load_dataset

    text = load_dataset("text", data_files={"train": str(datamodule.corpus)}, split="train")
    text = text.filter(lambda r: bool(r["text"].strip()))  # the data module drops blank lines the same way
    batches = iter(datamodule.train_dataloader().batch_sampler)
    return [[text[i]["text"] for i in next(batches)] for _ in range(count)]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=4, help="rounds of every run, order rotating")
    parser.add_argument("--steps", type=int, default=10, help="timed steps per run")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps at the start of each run")
    parser.add_argument("--pooling", default="cls", choices=["cls", "prompt", "hicl"])
    parser.add_argument("--max-length", type=int, default=32)
    parser.add_argument("--out", type=Path, default=None, help="default: benchmarks/results/<name>.md")
    args = parser.parse_args()
    default_job = args.pooling == "cls" and args.max_length == 32
    name = "step_time" if default_job else f"step_time_{args.pooling}{args.max_length}"
    out = args.out or Path(f"benchmarks/results/{name}.md")
    job = [f"pooling={args.pooling}", f"data.max_length={args.max_length}"]
    bf16_hardware = fastest_precision() != "32-true"

    with tempfile.TemporaryDirectory() as tmp:
        configs = {
            v: compose_config(CONF_DIR, "train", [*job, *o], output_dir=Path(tmp)) for v, o in SENTEMB_VARIANTS.items()
        }
        cfg = configs[PADDED]
        prepare_run(cfg)
        datamodule = instantiate(cfg.data, tokenizer=build_part("model.tokenizer", cfg.model.tokenizer))
        L.seed_everything(cfg.seed)
        datamodule.setup("fit")
        loader = iter(datamodule.train_dataloader())
        batches = [dict(next(loader)) for _ in range(args.warmup + args.steps)]
        total = len(datamodule.train_dataloader())
        runs = {variant: (lambda c=c: framework_run(c, batches, total)) for variant, c in configs.items()}
        if default_job:
            texts = batch_texts(datamodule, len(batches))
            retokenized = datamodule.tokenizer(texts[0], truncation=True, max_length=cfg.data.max_length, padding=True)
            assert retokenized["input_ids"] == batches[0]["input_ids"].tolist(), "the trainers see other sentences"
            runs = {BARE: lambda: bare_loop(cfg, batches, total), **runs}
            runs[ST_FP32] = lambda: st_trainer_run(cfg, texts, bf16=False)
            if bf16_hardware:
                runs[ST_BF16] = lambda: st_trainer_run(cfg, texts, bf16=True)
        anchor = BARE if default_job else PADDED

        # the machine runs fastest when fresh: an untimed burn-in so the first timed run has no advantage
        runs[anchor]()
        names = list(runs)
        rounds = []
        for index in range(args.rounds):
            order = names[index % len(names) :] + names[: index % len(names)]
            result = {}
            for run_name in order:
                ends, losses = runs[run_name]()
                result[run_name] = (statistics.mean(step_times(ends, args.warmup)), losses)
            rounds.append(result)

    timed = batches[args.warmup :]
    sentences = statistics.mean(b["input_ids"].shape[0] for b in timed)
    tokens = statistics.mean(int(b["attention_mask"].sum()) for b in timed)  # real tokens a step (one view)
    padded_tokens = statistics.mean(b["attention_mask"].numel() for b in timed)

    def median_ratio(value: str, reference: str) -> float:
        return statistics.median(r[value][0] / r[reference][0] for r in rounds)

    seconds = {n: statistics.median(r[n][0] for r in rounds) for n in names}
    exact = [PADDED] if default_job else []  # the same dropout masks as the bare loop
    loss_gap = {n: max(abs(a - b) for r in rounds for a, b in zip(r[BARE][1], r[n][1], strict=True)) for n in exact}
    lines = [
        f"# Step time, pooling={args.pooling}, data.max_length={args.max_length} ({args.rounds} rounds of "
        f"{args.steps} steps after {args.warmup} warm-up, batch {cfg.data.batch_size}, {torch.get_num_threads()} "
        f"threads, torch {torch.__version__}; fast preset precision here: {configs[FAST].trainer.precision})",
        "",
        f"Real tokens a step: {tokens:.0f} of {padded_tokens:.0f} padded ({tokens / padded_tokens:.0%}) per view.",
        "",
        f"| run | s/step (median) | time / {anchor} (median of rounds) | speed-up | sentences/s | real tokens/s |",
        "|---|---|---|---|---|---|",
        *[
            f"| {n} | {seconds[n]:.3f} | {median_ratio(n, anchor):.3f} | {1 / median_ratio(n, anchor):.2f}x | "
            f"{sentences / seconds[n]:.1f} | {2 * tokens / seconds[n]:.0f} |"
            for n in names
        ],
        "",
        *[
            f"largest per-step loss difference, bare vs {n} on the same batches: {loss_gap[n]:.2e} "
            f"(must stay within {LOSS_TOLERANCE:.0e}: {'ok' if loss_gap[n] <= LOSS_TOLERANCE else 'FAILED'})"
            for n in exact
        ],
    ]
    report = "\n".join(lines)
    print("\n" + report)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(report + "\n")

    figure = f"training step, pooling={args.pooling} max_length {args.max_length} (batch {cfg.data.batch_size}), s/step"
    same = all(gap <= LOSS_TOLERANCE for gap in loss_gap.values())

    def timing(value: str, reference: str, bound: float | None, label: str = "") -> dict:
        ratio = median_ratio(value, reference)
        target = "—" if bound is None else f"<= {bound:.3f}"
        passed = None if bound is None else ratio <= bound and same
        return row(f"{figure}: {value}{label}", seconds[value], reference, seconds[reference], ratio, target, passed)

    fast_bound = 1 / 2.0 if bf16_hardware else None  # >= 2x only where bf16 is native (AVX512-BF16/AMX, Ampere+)
    if default_job:
        rows = [
            timing(PADDED, BARE, 1.05),
            timing(PADDING_FREE, BARE, 1 / 1.3),
            timing(FAST, BARE, fast_bound),
            timing(PADDING_FREE, ST_FP32, 1.0),
            timing(FAST, ST_BF16 if bf16_hardware else ST_FP32, 1.0),
        ]
    else:
        rows = [timing(PADDING_FREE, PADDED, 1.0), timing(FAST, PADDED, None)]
    write_rows(name, rows)
    return 0 if all(r["passed"] is not False for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
