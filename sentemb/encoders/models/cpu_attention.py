"""Reduced-precision attention on a CPU whose kernels were chosen below its hardware (`ATEN_CPU_CAPABILITY=avx2`).

torch's CPU flash attention packs bf16/fp16 keys and values for oneDNN's matrix kernels whenever oneDNN finds
the hardware for them (AMX), but the packing itself (`pack_vnni2`) is compiled only into the AVX-512 kernel
family: on an AMX Xeon told to use the AVX2 kernels, every bf16 attention over 64 or more tokens raises
"pack_vnni2 is only supported when avx512 is supported". Which CPUs do so is torch's and oneDNN's business, so
it is not guessed: where the kernels in use are below the hardware's AVX-512, a small bf16 and fp16 attention
(forward and backward, at a size that takes the packing path) is tried once; if it fails, scaled-dot-product
attention leaves the flash backend for its math backend, in this whole process (one switch, read by every SDPA
call: transformers' padded attention, sentemb's packed one, any frozen model beside the encoder). Its cost is
speed only on such a machine, and the switch is torch's global one, so CUDA attention in the same process loses
its flash kernel too; the log says so.
"""

from __future__ import annotations

import functools
import logging

import torch
import torch.nn.functional as F

log = logging.getLogger(__name__)

FULL_KERNELS = "AVX512"  # torch.backends.cpu.get_cpu_capability() of the kernel family that can pack
PROBE_TOKENS = 128  # past the flash kernel's packing threshold (64 query and key tokens)
PROBE_HEAD_SIZE = 64


def kernels_below_hardware() -> bool:
    """The CPU has AVX-512 but torch runs a lower kernel family (ATEN_CPU_CAPABILITY): the only case where oneDNN
    (which reads the hardware) and ATen's kernels (which read the override) may disagree."""
    return bool(torch.cpu._is_avx512_supported()) and torch.backends.cpu.get_cpu_capability() != FULL_KERNELS


def reduced_flash_attention_fails(dtype: torch.dtype) -> str | None:
    """Why the CPU flash attention kernel cannot run `dtype` here (its error), or None when it runs."""
    shape = (1, 1, PROBE_TOKENS, PROBE_HEAD_SIZE)
    query, key, value = (torch.randn(shape, dtype=dtype, requires_grad=True) for _ in range(3))
    try:
        with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.FLASH_ATTENTION):
            F.scaled_dot_product_attention(query, key, value).sum().backward()
    except RuntimeError as err:
        return str(err).splitlines()[0]
    return None


@functools.cache
def guard_cpu_attention() -> bool:
    """Switch SDPA to its math backend for this process when the CPU flash kernel fails in bf16 or fp16 under the
    kernels in use (see the module's docstring); True when it did. Probes once a process."""
    if not kernels_below_hardware():
        return False
    failures = {dtype: reduced_flash_attention_fails(dtype) for dtype in (torch.bfloat16, torch.float16)}
    failed = {dtype: why for dtype, why in failures.items() if why}
    if not failed:
        return False
    torch.backends.cuda.enable_flash_sdp(False)  # the flag SDPA's CPU backend choice reads too
    log.warning(
        "CPU flash attention fails in %s under torch's %s kernels (%s): scaled-dot-product attention uses its math "
        "backend in this process (CUDA's flash kernel included). Unset ATEN_CPU_CAPABILITY to keep the flash kernel",
        ", ".join(str(dtype).removeprefix("torch.") for dtype in failed),
        torch.backends.cpu.get_cpu_capability(),
        next(iter(failed.values())),
    )
    return True
