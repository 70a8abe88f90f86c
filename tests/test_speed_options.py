"""The speed options: trainer=fast's precision rule, and torch.compile of the backbone (compile=true)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from sentemb.training import precision
from sentemb.training.module import SentembModule
from tests.conftest import compose_train


@pytest.mark.parametrize(
    ("cuda", "capability", "cpu_bf16", "accelerator", "expected"),
    [
        (True, (9, 0), False, "auto", "bf16-mixed"),  # Hopper
        (True, (8, 0), False, "gpu", "bf16-mixed"),  # Ampere
        (True, (7, 0), True, "auto", "16-mixed"),  # Volta: fp16 with loss scaling
        (True, (7, 5), True, "cpu", "bf16-mixed"),  # a GPU machine told to train on its CPU
        (False, None, True, "auto", "bf16-mixed"),  # AVX512-BF16 / AMX
        (False, None, False, "auto", "32-true"),  # bf16 would be emulated
    ],
)
def test_fastest_precision_follows_the_hardware(monkeypatch, cuda, capability, cpu_bf16, accelerator, expected):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *args: capability)
    monkeypatch.setattr(precision, "cpu_has_native_bf16", lambda: cpu_bf16)
    assert precision.fastest_precision(accelerator) == expected


def test_the_fast_preset_picks_this_machines_precision(tmp_path: Path):
    cfg = compose_train(["model=tiny", "trainer=fast"], tmp_path)
    assert cfg.trainer.precision == precision.fastest_precision(cfg.trainer.accelerator)
    assert cfg.trainer.deterministic is False
    assert compose_train(["model=tiny"], tmp_path).trainer.precision == "32-true", "the default job stays fp32"


def test_compile_compiles_the_backbone_in_place(tmp_path: Path):
    eager = SentembModule.from_config(compose_train(["model=tiny"], tmp_path))
    compiled = SentembModule.from_config(compose_train(["model=tiny", "compile=true"], tmp_path))
    assert compiled.encoder.backbone._compiled_call_impl is not None
    assert eager.encoder.backbone._compiled_call_impl is None
    assert compiled.state_dict().keys() == eager.state_dict().keys(), "checkpoints keep the eager names"


@pytest.mark.slow
def test_a_compiled_step_has_the_eager_loss_and_gradients(small_corpus: Path, tmp_path: Path):
    lines = small_corpus.read_text(encoding="utf-8").splitlines()[:8]
    results = []
    for flag in ("false", "true"):
        torch.manual_seed(0)
        module = SentembModule.from_config(
            compose_train(["model=tiny", "model.dropout=0.0", f"compile={flag}"], tmp_path)
        )
        batch = dict(module.encoder.tokenizer(lines, padding=True, return_tensors="pt"))
        backward, total, _ = module.step_loss(batch)
        backward.backward()
        results.append((total.detach(), {n: p.grad for n, p in module.named_parameters() if p.grad is not None}))
    # inductor fuses and reorders float32 arithmetic: last-bit differences (~1e-7), asked: 1e-5
    torch.testing.assert_close(results[1][0], results[0][0], rtol=1e-5, atol=1e-5)
    for name, grad in results[0][1].items():
        torch.testing.assert_close(results[1][1][name], grad, rtol=1e-4, atol=1e-5, msg=name)


def attach_trainer(module: SentembModule, precision: str) -> None:
    import lightning as L

    module.trainer = L.Trainer(precision=precision, accelerator="cpu", logger=False, enable_checkpointing=False)


def test_bf16_clips_the_fused_optimizers_gradients(tmp_path: Path):
    # Lightning's AMP plugin refuses clipping with any fused optimizer; under bf16 there is no scaler, so it is safe
    module = SentembModule.from_config(compose_train(["model=tiny"], tmp_path))
    attach_trainer(module, "bf16-mixed")
    optimizer = module.configure_optimizers()["optimizer"]
    assert optimizer.defaults["fused"] is True
    for parameter in module.parameters():
        parameter.grad = torch.ones_like(parameter)
    module.configure_gradient_clipping(optimizer, gradient_clip_val=0.5)
    norm = torch.nn.utils.get_total_norm([p.grad for p in module.parameters()])
    # unclipped: ~1e3; a float32 norm over ~1e6 entries rounds in the 4th digit
    assert norm == pytest.approx(0.5, rel=1e-3)


def test_fp16_with_a_scaler_gets_the_unfused_optimizer(tmp_path: Path):
    from lightning.pytorch.plugins.precision import MixedPrecision

    module = SentembModule.from_config(compose_train(["model=tiny"], tmp_path))
    attach_trainer(module, "32-true")
    assert module.configure_optimizers()["optimizer"].defaults["fused"] is True
    # 16-mixed as on a GPU (on CPU Lightning turns it into bf16): a GradScaler in the precision plugin
    module.trainer.strategy.precision_plugin = MixedPrecision("16-mixed", "cpu", torch.amp.GradScaler("cpu"))
    assert module.configure_optimizers()["optimizer"].defaults["fused"] is False
