"""Poolings: token states (B, L, H) and attention mask (B, L) → sentence embedding (B, H).

`train_head=True` is the training path: CLS pooling then adds SimCSE's MLP (Linear+Tanh),
which evaluation never uses (SimCSE §3: "we take [CLS] without MLP at test time").
"""

from __future__ import annotations

import torch
from torch import nn


class CLSPooling(nn.Module):
    """[CLS] state; during training passed through SimCSE's MLP (Linear + Tanh)."""

    def __init__(self, hidden_size: int, mlp: str = "train") -> None:
        super().__init__()
        if mlp not in ("train", "always", "none"):
            raise ValueError(f"pooling.mlp={mlp!r}: use 'train' (SimCSE unsup), 'always' or 'none'")
        self.mlp_use = mlp
        self.mlp = None if mlp == "none" else nn.Sequential(nn.Linear(hidden_size, hidden_size), nn.Tanh())

    def forward(self, hidden: torch.Tensor, attention_mask: torch.Tensor, train_head: bool = False) -> torch.Tensor:
        cls = hidden[:, 0]
        if self.mlp is not None and (self.mlp_use == "always" or train_head):
            return self.mlp(cls)
        return cls


class MeanPooling(nn.Module):
    """Average of the token states the attention mask keeps (padding excluded)."""

    def __init__(self, hidden_size: int) -> None:
        super().__init__()

    def forward(self, hidden: torch.Tensor, attention_mask: torch.Tensor, train_head: bool = False) -> torch.Tensor:
        mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
        return (hidden * mask).sum(1) / mask.sum(1).clamp(min=1.0)
