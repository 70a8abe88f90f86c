"""A frozen model kept outside its owner's state: never trained, never saved, rebuilt rather than restored.

A part that runs a model it never trains (DCLR's complementary model, DiffCSE's generator) holds it in a
`FrozenModel`: not a submodule, so it is in no state dict, checkpoint, export, DDP bucket nor optimizer, and
`module.to()` does not move it; `on(device)` moves it where the batch is when first used there, in train mode
(dropout on, as both released codes run theirs).
"""

from __future__ import annotations

import torch
from torch import nn


class FrozenModel:
    """Holds at most one frozen model outside the owner's state (module docstring)."""

    def __init__(self, model: nn.Module | None = None) -> None:
        self.held: list[nn.Module] = []  # a plain list: nn.Module's attribute hooks never see the model
        self.hold(model)

    def hold(self, model: nn.Module | None) -> None:
        """Hold `model` (None: nothing), its parameters out of any optimizer (requires_grad False)."""
        self.held = [] if model is None else [model.requires_grad_(False)]

    def __bool__(self) -> bool:
        return bool(self.held)

    def __getitem__(self, index: int) -> nn.Module:
        return self.held[index]

    def on(self, device: torch.device) -> nn.Module | None:
        """The model on `device` (moved on its first use there), in train mode; None when nothing is held."""
        if not self.held:
            return None
        model = self.held[0]
        if any(p.device != device for p in model.parameters()):  # its first step, or after the owner moved
            model.to(device)
        return model.train()
