"""`trainer=fast`'s precision: the fastest setting this machine runs exactly enough (losses stay float32 either way).

- CUDA GPU of compute capability 8.0 or newer (Ampere, Hopper, ...): bf16-mixed, no loss scaling needed;
- older CUDA GPU: 16-mixed (fp16 autocast with Lightning's GradScaler);
- CPU with AVX512-BF16 or AMX: bf16-mixed (oneDNN runs bf16 matmuls natively, about 1.7x fp32 on MiniLM);
- any other CPU: 32-true (bf16 there is emulated and slower than fp32).
"""

from __future__ import annotations

import torch

CPU_BF16 = "bf16-mixed"


def cpu_has_native_bf16() -> bool:
    """AVX512-BF16 or AMX tiles (torch's own CPU feature probes, as /proc/cpuinfo's avx512_bf16 / amx_bf16)."""
    return bool(torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported())


def fastest_precision(accelerator: str = "auto") -> str:
    """The Lightning `precision` for `trainer.accelerator`: see the module docstring for the rule."""
    uses_cuda = accelerator in ("auto", "gpu", "cuda") and torch.cuda.is_available()
    if uses_cuda:
        major, _ = torch.cuda.get_device_capability()
        return "bf16-mixed" if major >= 8 else "16-mixed"
    return CPU_BF16 if cpu_has_native_bf16() else "32-true"
