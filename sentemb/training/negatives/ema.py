"""A momentum (EMA) copy of the encoder's backbone, the target any negatives part can build on.

    ξ ← m·ξ + (1 − m)·θ          (ESimCSE §3.2, MoCo, BYOL's target; over the backbone's trained parameters only)

`EMATarget` is a `NegativesPart` that holds ξ (`backbone`, a submodule: its weights travel in the state dict; under
an adapter only ξ's copies of the trained weights, `saved_with_adapter`), copies it from the encoder in `track`
(frozen parameters shared, not copied: they never change), or re-initialises the copy at random when
`starts_at_random`, keeps it in eval mode (no dropout), and steps it with `update`; `target_embeddings` embeds rows
through ξ with the online pooling and its train-only MLP. A part that uses ξ subclasses it (ESimCSE's queue,
momentum.py) and calls `update` where its method steps ξ.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from sentemb.common.errors import SentembConfigError
from sentemb.training.negatives.base import NEGATIVES_PREFIX, RESUME_FIX, NegativesPart, in_chunks

if TYPE_CHECKING:
    from sentemb.encoders.encoder import SentenceEncoder


def ema_update(momentum_params: Iterable[torch.Tensor], online_params: Iterable[torch.Tensor], m: float) -> None:
    """ξ ← m·ξ + (1 − m)·θ in place, as the two products then their sum (the formula's own rounding)."""
    momentum_params, online_params = list(momentum_params), list(online_params)
    if not momentum_params:
        return
    scaled = torch._foreach_mul(online_params, 1.0 - m)
    torch._foreach_mul_(momentum_params, m)
    torch._foreach_add_(momentum_params, scaled)


class EMATarget(NegativesPart):
    """ξ, a momentum copy of the encoder's backbone with momentum `momentum` (module docstring); built empty, then
    `track(encoder)` makes the copy."""

    def __init__(self, momentum: float = 0.995) -> None:
        super().__init__()
        if not (isinstance(momentum, int | float) and 0 <= momentum < 1):
            raise SentembConfigError(f"negatives.momentum={momentum} must be in [0, 1). Fix: negatives.momentum=0.995")
        self.momentum = float(momentum)
        self.backbone: nn.Module | None = None
        self.tracked: list[str] = []  # names of the backbone parameters ξ follows

    @property
    def starts_at_random(self) -> bool:
        """ξ starts from random weights (the backbone's own initialisation), every parameter its own; else a copy."""
        return False

    def track(self, encoder: SentenceEncoder) -> None:
        """ξ as a copy of the encoder's backbone θ (frozen parameters shared, not copied: they never change), or,
        `starts_at_random`, a full copy re-initialised at random."""
        online = encoder.backbone
        random_start = self.starts_at_random
        frozen = {} if random_start else {id(p): p for p in online.parameters() if not p.requires_grad}
        self.backbone = copy.deepcopy(online, memo=dict(frozen))
        self.tracked = [name for name, p in online.named_parameters() if id(p) not in frozen]
        for name, p in self.backbone.named_parameters():
            if name in self.tracked:
                p.requires_grad_(False)
        if random_start:
            init = getattr(self.backbone, "_init_weights", None)
            if init is None:
                raise SentembConfigError(
                    f"negatives.convention=reference: {type(online).__name__} has no Hugging Face _init_weights to "
                    "start the momentum encoder at random. Fix: negatives.convention=paper"
                )
            with torch.no_grad():
                self.backbone.apply(init)

    def saved_with_adapter(self) -> set[str]:
        """State-dict keys (relative to this module) an adapter run's checkpoint keeps: ξ's copies of the trained
        weights; the frozen base it shares with θ is rebuilt from the base model."""
        return {f"backbone.{name}" for name in self.tracked}

    @torch.no_grad()
    def update(self, online: nn.Module) -> None:
        """The EMA step over the tracked parameters."""
        if self.backbone is None:
            raise RuntimeError(f"{type(self).__name__}.track(encoder) was not called")
        theta = dict(online.named_parameters())
        xi = dict(self.backbone.named_parameters())
        ema_update([xi[name] for name in self.tracked], [theta[name].detach() for name in self.tracked], self.momentum)

    @torch.no_grad()
    def target_embeddings(
        self, encoder: SentenceEncoder, rows: dict[str, torch.Tensor], chunk: int | None
    ) -> torch.Tensor:
        """ξ's embeddings of `rows` (eval mode, no gradient) through the online pooling and its train-only MLP
        (ESimCSE's q = MLP_θ(Enc_ξ(x))); in GradCache's chunks when it is on."""
        return in_chunks(lambda part: encoder(part, train_head=True, backbone=self.backbone), rows, chunk)

    def train(self, mode: bool = True) -> EMATarget:
        """ξ stays in eval mode (no dropout) whatever the module's mode: it embeds without dropout."""
        super().train(mode)
        if self.backbone is not None:
            self.backbone.eval()
        return self

    def check_target_saved(self, entries: Mapping[str, Any], named: str, method: str) -> None:
        """A resumed checkpoint holds ξ's weights (`negatives.backbone.*`), trained with negatives=`method`."""
        if not any(key.startswith(f"{NEGATIVES_PREFIX}backbone.") for key in entries):
            raise SentembConfigError(
                f"{named} holds no momentum encoder (no {NEGATIVES_PREFIX}backbone.* weights), though it was trained "
                f"with negatives={method}. {RESUME_FIX}"
            )
