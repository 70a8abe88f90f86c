"""torch.distributed helpers of a training step: the world size and SimCSE's gather of negatives across ranks."""

from __future__ import annotations

import torch
import torch.distributed as dist


def world_size() -> int:
    """Processes in the default group (1 without torch.distributed)."""
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def gather_with_grad(z: torch.Tensor) -> torch.Tensor:
    """All ranks' embeddings, the local slice kept as the autograd-tracked tensor (SimCSE's trick)."""
    if world_size() == 1:
        return z
    gathered = [torch.zeros_like(z) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, z.contiguous())
    gathered[dist.get_rank()] = z
    return torch.cat(gathered)
