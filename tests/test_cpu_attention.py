"""bf16 attention on a CPU holds under either of torch's x86 kernel families.

On an AMX Xeon under `ATEN_CPU_CAPABILITY=avx2`, torch's CPU flash attention raises "pack_vnni2 is only supported
when avx512 is supported" for bf16 over 64+ tokens (oneDNN reads the hardware, the packing is compiled only into
the AVX-512 kernels). `guard_cpu_attention` probes that kernel where the kernels are below the hardware and moves
SDPA to its math backend if it fails. The first test runs the real bf16 paths on this machine's kernels (on such a
Xeon under the override it is the finding itself); the others stand in for that machine: SDPA replaced by one that
raises torch's error wherever the flash backend would run bf16 over 64+ tokens, as the Xeon's does.

On such a Xeon the guard has already fired when these tests run (importing sentemb's attention probes once a
process), so the flash switch is off before the first test. Each test therefore sets the switch it assumes and
puts it back afterwards, and every test runs twice here: in a process as this machine leaves it and in one where
the guard has fired (the switch turned off as the guard turns it off; emulated here, on a CPU without AMX).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator

import pytest
import torch

from sentemb.encoders.build import build_encoder
from sentemb.encoders.models import cpu_attention
from sentemb.encoders.models.padding_free import PackedRows, padding_free_states
from tests.parts import CLS, TINY_BERT

PACK_ERROR = "pack_vnni2 is only supported when avx512 is supported"
TOKENS = 80  # past the flash kernel's packing threshold (64)


@contextlib.contextmanager
def flash_sdp(enabled: bool) -> Iterator[None]:
    """SDPA's process-wide flash switch (the one the guard turns off) set to `enabled`, and put back as it was."""
    before = torch.backends.cuda.flash_sdp_enabled()
    torch.backends.cuda.enable_flash_sdp(enabled)
    try:
        yield
    finally:
        torch.backends.cuda.enable_flash_sdp(before)


@pytest.fixture(autouse=True, params=["as imported here", "guard fired at import"])
def imported_process(request) -> Iterator[None]:
    """The process as importing sentemb left it: here, and as on an AMX Xeon under the override, where the guard
    has turned the flash switch off before any test runs (emulated: this CPU has no AMX)."""
    if request.param == "as imported here":
        yield
        return
    with flash_sdp(False):
        yield


@pytest.fixture
def flash_on() -> Iterator[None]:
    """The flash backend on, as in a process the guard left alone, whatever the guard did at import."""
    with flash_sdp(True):
        yield


@pytest.fixture
def xeon_under_avx2(monkeypatch, flash_on):
    """This machine as an AMX Xeon under ATEN_CPU_CAPABILITY=avx2 before the guard ran: AVX-512 below the kernels in
    use, the flash backend on, and an SDPA whose flash backend cannot pack bf16 or fp16 over 64+ tokens."""
    real = torch.nn.functional.scaled_dot_product_attention

    def sdpa(query, key, *args, **kwargs):
        reduced = query.dtype in (torch.bfloat16, torch.float16)
        long = query.shape[-2] >= 64 and key.shape[-2] >= 64
        if reduced and long and torch.backends.cuda.flash_sdp_enabled():
            raise RuntimeError(PACK_ERROR)
        return real(query, key, *args, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", sdpa)
    monkeypatch.setattr(cpu_attention, "kernels_below_hardware", lambda: True)


def bf16_encoder():
    torch.manual_seed(0)
    encoder = build_encoder({**TINY_BERT, "dropout": 0.0, "padding_free": True}, CLS, None)
    return encoder.to(torch.bfloat16).train()


def long_batch(encoder) -> dict[str, torch.Tensor]:
    """Two sentences of TOKENS and TOKENS - 20 tokens (padded: the packed path lays them out per sentence)."""
    words = ["word"] * (TOKENS - 2)
    batch = encoder.tokenizer([" ".join(words), " ".join(words[:-20])], padding=True, return_tensors="pt")
    return dict(batch)


def padded_and_packed(encoder) -> tuple[torch.Tensor, torch.Tensor]:
    """The bf16 backbone's states of a long batch, padded and padding-free, each with a backward pass."""
    batch = long_batch(encoder)
    padded = encoder.padded_states(batch)
    packed = padding_free_states(encoder.backbone, batch)
    (padded.float().sum() + packed.float().sum()).backward()
    return padded, packed


def test_bf16_attention_over_long_sentences_runs_on_these_kernels():
    cpu_attention.guard_cpu_attention()  # what importing sentemb's attention did already
    encoder = bf16_encoder()
    padded, packed = padded_and_packed(encoder)
    keep = PackedRows.of(long_batch(encoder)["attention_mask"]).key_mask[..., None]
    assert torch.isfinite(padded).all() and torch.isfinite(packed).all()
    # bf16 keeps 8 bits of mantissa and the two layouts sum in different orders: a few bf16 ulps of slack
    torch.testing.assert_close(packed * keep, padded * keep, rtol=0.05, atol=0.05)


def test_without_the_guard_such_a_cpu_fails_as_reported(xeon_under_avx2):
    with pytest.raises(RuntimeError, match=PACK_ERROR):
        padded_and_packed(bf16_encoder())


def test_the_guard_moves_such_a_cpu_to_the_math_backend_and_says_so(xeon_under_avx2, caplog):
    with caplog.at_level(logging.WARNING, logger=cpu_attention.__name__):
        assert cpu_attention.guard_cpu_attention.__wrapped__()
    assert not torch.backends.cuda.flash_sdp_enabled()
    assert "bfloat16, float16" in caplog.text and PACK_ERROR in caplog.text and "ATEN_CPU_CAPABILITY" in caplog.text
    padded, packed = padded_and_packed(bf16_encoder())
    assert torch.isfinite(padded).all() and torch.isfinite(packed).all()


def test_kernels_that_run_bf16_keep_the_flash_backend(monkeypatch, flash_on):
    probed = []
    monkeypatch.setattr(cpu_attention, "kernels_below_hardware", lambda: True)
    monkeypatch.setattr(cpu_attention, "reduced_flash_attention_fails", lambda dtype: probed.append(dtype))
    assert not cpu_attention.guard_cpu_attention.__wrapped__()
    assert probed == [torch.bfloat16, torch.float16] and torch.backends.cuda.flash_sdp_enabled()


def test_kernels_at_the_hardwares_level_are_not_probed(monkeypatch, flash_on):
    monkeypatch.setattr(cpu_attention, "kernels_below_hardware", lambda: False)
    monkeypatch.setattr(cpu_attention, "reduced_flash_attention_fails", pytest.fail)
    assert not cpu_attention.guard_cpu_attention.__wrapped__()
    assert torch.backends.cuda.flash_sdp_enabled()
