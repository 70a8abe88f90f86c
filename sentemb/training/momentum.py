"""ESimCSE's momentum contrast: a momentum copy ξ of the encoder and a FIFO queue of its past embeddings.

    ξ ← m·ξ + (1 − m)·θ                          (ESimCSE §3.2; m = 0.995, over the backbone's parameters only)
    L = −(1/B) Σ_i log e^{cos(z_i,z_i⁺)/τ} / (Σ_j e^{cos(z_i,z_j⁺)/τ} + Σ_{k∈Q} e^{cos(z_i,q_k)/τ})
    q = MLP_θ(Enc_ξ(x)[CLS])                       (view 1 of a past batch; ξ in eval mode, no gradient)

The queue's rows are extra negatives of the configured loss (any loss with a negatives' denominator:
`Objective.negatives_refusal`), at the same τ. Within a training step (the released code's order):
the online forward of the views; the EMA update (θ as it stands before this step's optimiser update);
the loss against the queue as it stood before the step; ξ encodes the batch's anchors; the queue
takes them, keeping its newest K; then backward. So the queue never holds the current batch: a
sentence's own positive is never its negative. Entries whose sentence is in the current batch (the
same token ids: a second epoch, a duplicated line) are left out of that step's negatives too.

`convention`: `paper` (default) starts ξ as a copy of the encoder (the method's evident intent) and
keeps the queue across epochs; `reference` does what caskcsg/sentemb's ESimCSE does: ξ built before
the pretrained weights load and re-initialised (random, normal std = the model's initializer_range,
the released log's "newly initialized momentum_model"), and the queue emptied at each epoch start.

State: ξ is a submodule (its weights travel in the state dict; under an adapter only ξ's copies of
the trained weights, `saved_with_adapter`), the queue and its sentences' keys travel as this
module's extra state. Under DDP every rank enqueues the gathered keys of all ranks (in rank order,
as the gathered negatives), so all ranks hold the same queue.

Every `negatives=` part (registry kind "negatives": this queue, DCLR's sentemb/training/dclr.py) answers the
same small protocol, `NegativesPart`, which SentembModule calls in a step's order; what one step's loss gets
is a `StepNegatives`, handed back to the part after the loss (no per-batch state is kept on the part).
`check_negatives` runs the configured part's own `check_config` before any model loads.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import torch
import torch.distributed as dist
from torch import nn

from sentemb.common.batch_views import anchor_batch
from sentemb.common.errors import SentembConfigError
from sentemb.common.parts import part
from sentemb.encoders.part_configs import build_part
from sentemb.losses.registry import negatives_refusal
from sentemb.training.distributed import world_size
from sentemb.training.sharding import is_sharded

if TYPE_CHECKING:
    from sentemb.encoders.encoder import SentenceEncoder
    from sentemb.losses import LossOutput

CONVENTIONS = ("paper", "reference")
# the losses with a negatives' denominator, named in the fixes of both parts' refusals
NEGATIVES_LOSSES = "infonce, focal, arccon, mpt, met, mat, paradigm"


@dataclass(frozen=True)
class StepNegatives:
    """What a negatives part gives one training step's loss, and gets back after it.

    `negatives`: extra negative rows (K, D), or None; `excluded`: the (N, N + K) bool mask of each anchor's false
    negatives (`Objective.forward`), or None; `sentences`: the global batch's sentence keys where the part needs them
    after the loss (the queue); `logged`: detached scalars logged as they are named (e.g. train/dclr/excluded_share).
    """

    negatives: torch.Tensor | None = None
    excluded: torch.Tensor | None = None
    sentences: torch.Tensor | None = None
    logged: Mapping[str, torch.Tensor] = field(default_factory=dict)


class NegativesPart(Protocol):
    """What SentembModule asks of a `negatives=` part, in a run's and a step's order.

    - `check_config(cfg)`: on the part built from `cfg["negatives"]` (its constructor checks its options), what it
      cannot go with in the run's config `cfg`, before any model loads;
    - `track(encoder)`: once, in the module's constructor, before any checkpoint loads and before compile;
    - `on_epoch_start(epoch)`: at each training epoch's start;
    - `training_batch(batch)`: the batch the step's encoders see (DCLR's reference: padding attended);
    - `step_negatives(batch, z1, z2, encoder=, loss=, chunk=)`: after the views and their DDP gather (z1, z2 the
      global batch's), before the loss;
    - `global_loss(loss, z1, z2, step)`: the step's global loss with them (`apply_negatives` by default);
    - `after_loss(batch, step, encoder=, chunk=)`: after the loss, before backward (the queue takes the batch).

    `chunk`: GradCache's sentences per forward (None: the batch at once), for a part that encodes the batch again.
    """

    def check_config(self, cfg: Mapping[str, Any]) -> None: ...

    def track(self, encoder: SentenceEncoder) -> None: ...

    def on_epoch_start(self, epoch: int) -> None: ...

    def training_batch(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]: ...

    def step_negatives(
        self,
        batch: dict[str, torch.Tensor],
        z1: torch.Tensor,
        z2: torch.Tensor,
        *,
        encoder: SentenceEncoder,
        loss: nn.Module,
        chunk: int | None,
    ) -> StepNegatives: ...

    def global_loss(self, loss: nn.Module, z1: torch.Tensor, z2: torch.Tensor, step: StepNegatives) -> LossOutput: ...

    def after_loss(
        self, batch: dict[str, torch.Tensor], step: StepNegatives, *, encoder: SentenceEncoder, chunk: int | None
    ) -> None: ...


def apply_negatives(loss: nn.Module, z1: torch.Tensor, z2: torch.Tensor, step: StepNegatives) -> LossOutput:
    """loss(z1, z2) with the step's negatives and exclusions, each passed only when there is one (a loss of your own
    that takes no such keyword keeps working without them)."""
    given = {"negatives": step.negatives, "excluded": step.excluded}
    return loss(z1, z2, **{key: value for key, value in given.items() if value is not None})


def in_chunks(
    embed: Callable[[dict[str, torch.Tensor]], torch.Tensor], rows: dict[str, torch.Tensor], size: int | None
) -> torch.Tensor:
    """embed(rows) computed `size` rows at a time (GradCache's chunks; None: at once), concatenated."""
    count = rows["input_ids"].shape[0]
    size = size or count
    return torch.cat([embed({k: v[start : start + size] for k, v in rows.items()}) for start in range(0, count, size)])


def refuse_loss_without_negatives(cfg: Mapping[str, Any], named: str, why: str, losses: str = NEGATIVES_LOSSES) -> None:
    """A loss that takes no extra negatives (`negatives_refusal`) refused for `named` (negatives=<part>), saying
    `why` the part needs them, and the `losses` it takes in the fix."""
    loss = cfg.get("loss") or {}
    reason = negatives_refusal(loss)
    if reason:
        raise SentembConfigError(
            f"{named} with loss={loss.get('name')}: {reason} {why} Fix: a loss that takes extra negatives "
            f"({losses}), or no negatives= group"
        )


def refuse_sharded(cfg: Mapping[str, Any], named: str, why: str) -> None:
    """trainer=fsdp refused for `named`, saying `why`."""
    if is_sharded(cfg.get("trainer") or {}):
        raise SentembConfigError(f"{named} with trainer=fsdp: {why}. Fix: trainer=ddp (or one device)")


def ema_update(momentum_params: Iterable[torch.Tensor], online_params: Iterable[torch.Tensor], m: float) -> None:
    """ξ ← m·ξ + (1 − m)·θ in place, as the two products then their sum (the formula's own rounding)."""
    momentum_params, online_params = list(momentum_params), list(online_params)
    if not momentum_params:
        return
    scaled = torch._foreach_mul(online_params, 1.0 - m)
    torch._foreach_mul_(momentum_params, m)
    torch._foreach_add_(momentum_params, scaled)


def sentence_keys(input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """One int64 per row naming its sentence by its real token ids (padding on either side ignored)."""
    keys = [
        hash(tuple(i for i, k in zip(ids, keep, strict=True) if k))
        for ids, keep in zip(input_ids.tolist(), attention_mask.tolist(), strict=True)
    ]  # Python's hash of a tuple of ints: the same in every process (only str hashing is salted)
    return torch.tensor(keys, dtype=torch.long, device=input_ids.device)


def gathered(tensor: torch.Tensor) -> torch.Tensor:
    """Every rank's rows, in rank order (no gradient: the queue is a constant)."""
    if world_size() == 1:
        return tensor
    parts = [torch.zeros_like(tensor) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, tensor.contiguous())
    return torch.cat(parts)


@part("negatives", "momentum")
class MomentumQueue(nn.Module):
    """ξ and the queue (a `NegativesPart`); built empty, then `track(encoder)` copies its backbone into ξ (or, under
    `reference`, re-initialises the copy)."""

    def __init__(self, momentum: float = 0.995, queue_size: int = 160, convention: str = "paper") -> None:
        super().__init__()
        if not (isinstance(momentum, int | float) and 0 <= momentum < 1):
            raise SentembConfigError(f"negatives.momentum={momentum} must be in [0, 1). Fix: negatives.momentum=0.995")
        if not (isinstance(queue_size, int) and not isinstance(queue_size, bool) and queue_size >= 1):
            raise SentembConfigError(
                f"negatives.queue_size={queue_size} must be an integer >= 1 (ESimCSE: 2.5 × the batch, 160 for 64). "
                "Fix: e.g. negatives.queue_size=160"
            )
        if convention not in CONVENTIONS:
            raise SentembConfigError(f"negatives.convention={convention!r}: use paper or reference")
        self.momentum, self.queue_size, self.convention = float(momentum), queue_size, convention
        self.backbone: nn.Module | None = None
        self.tracked: list[str] = []  # names of the backbone parameters ξ follows
        self.queue: torch.Tensor | None = None  # (k ≤ K, D), oldest first
        self.queue_ids: torch.Tensor | None = None  # (k,) each entry's sentence (sentence_keys)
        self.emptied_at_epoch = -1  # reference: the epoch whose start last emptied the queue (a resume keeps it)

    def track(self, encoder: SentenceEncoder) -> None:
        """ξ as a copy of the encoder's backbone θ (frozen parameters shared, not copied: they never change), or
        under `reference` a full copy re-initialised at random."""
        online = encoder.backbone
        frozen = (
            {} if self.convention == "reference" else {id(p): p for p in online.parameters() if not p.requires_grad}
        )
        self.backbone = copy.deepcopy(online, memo=dict(frozen))
        self.tracked = [name for name, p in online.named_parameters() if id(p) not in frozen]
        for name, p in self.backbone.named_parameters():
            if name in self.tracked:
                p.requires_grad_(False)
        if self.convention == "reference":
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
            raise RuntimeError("MomentumQueue.track(backbone) was not called")
        theta = dict(online.named_parameters())
        xi = dict(self.backbone.named_parameters())
        ema_update([xi[name] for name in self.tracked], [theta[name].detach() for name in self.tracked], self.momentum)

    def negatives(self, batch_ids: torch.Tensor) -> torch.Tensor | None:
        """The queue's embeddings as they stand, without the entries of sentences in this (global) batch."""
        if self.queue is None or len(self.queue) == 0:
            return None
        keep = ~torch.isin(self.queue_ids, batch_ids.to(self.queue_ids.device))
        return self.queue if bool(keep.all()) else self.queue[keep]

    @torch.no_grad()
    def enqueue(self, keys: torch.Tensor, ids: torch.Tensor) -> None:
        """Q ← cat(Q, keys)[−K:] (new tensors: the step's loss may still hold the old queue); `keys` this rank's,
        gathered here; `ids` the global batch's sentence keys, already gathered (`global_sentence_ids`)."""
        keys = gathered(keys.detach().float())
        if self.queue is None:
            self.queue, self.queue_ids = keys[-self.queue_size :], ids[-self.queue_size :]
            return
        self.queue = torch.cat([self.queue.to(keys.device), keys])[-self.queue_size :]
        self.queue_ids = torch.cat([self.queue_ids.to(ids.device), ids])[-self.queue_size :]

    def training_batch(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return batch

    def step_negatives(
        self,
        batch: dict[str, torch.Tensor],
        z1: torch.Tensor,
        z2: torch.Tensor,
        *,
        encoder: SentenceEncoder,
        loss: nn.Module,
        chunk: int | None,
    ) -> StepNegatives:
        """ESimCSE's step before its loss: every rank's anchors' sentence keys (`sentence_keys`, gathered), the EMA
        update of ξ (θ as it stands before this step's update), then the queue as it stood before this step, without
        the entries of this global batch's sentences."""
        anchors = anchor_batch(batch)
        sentences = gathered(sentence_keys(anchors["input_ids"], anchors["attention_mask"]))
        self.update(encoder.backbone)
        return StepNegatives(negatives=self.negatives(sentences), sentences=sentences)

    def global_loss(self, loss: nn.Module, z1: torch.Tensor, z2: torch.Tensor, step: StepNegatives) -> LossOutput:
        return apply_negatives(loss, z1, z2, step)

    @torch.no_grad()
    def after_loss(
        self, batch: dict[str, torch.Tensor], step: StepNegatives, *, encoder: SentenceEncoder, chunk: int | None
    ) -> None:
        """ξ (eval mode, no gradient) embeds this batch's anchors through the online pooling and its train-only MLP
        (ESimCSE's q = MLP_θ(Enc_ξ(x))); every rank's keys join the queue. In GradCache's chunks when it is on."""
        keys = in_chunks(
            lambda rows: encoder(rows, train_head=True, backbone=self.backbone), anchor_batch(batch), chunk
        )
        self.enqueue(keys, step.sentences)

    def on_epoch_start(self, epoch: int) -> None:
        """The released code empties the queue at each epoch start (`reference`); the paper's queue goes on. A run
        resumed mid-epoch starts that epoch again in Lightning: the queue it saved is kept."""
        if self.convention == "reference" and epoch != self.emptied_at_epoch:
            self.queue = self.queue_ids = None
            self.emptied_at_epoch = epoch

    def train(self, mode: bool = True) -> MomentumQueue:
        """ξ stays in eval mode (no dropout) whatever the module's mode: ESimCSE encodes the queue without dropout."""
        super().train(mode)
        if self.backbone is not None:
            self.backbone.eval()
        return self

    def get_extra_state(self) -> dict[str, Any]:
        epoch = self.emptied_at_epoch
        if self.queue is None:
            return {"queue": torch.zeros(0), "queue_ids": torch.zeros(0, dtype=torch.long), "emptied_at_epoch": epoch}
        return {"queue": self.queue.detach().cpu(), "queue_ids": self.queue_ids.cpu(), "emptied_at_epoch": epoch}

    def set_extra_state(self, state: dict[str, Any]) -> None:
        queue = state["queue"]
        self.emptied_at_epoch = int(state.get("emptied_at_epoch", -1))
        if queue.numel() == 0:
            self.queue = self.queue_ids = None
            return
        device = next(self.parameters(), queue).device
        self.queue, self.queue_ids = queue.to(device), state["queue_ids"].to(device)

    def check_config(self, cfg: Mapping[str, Any]) -> None:
        """What negatives=momentum cannot go with, before any model loads: a loss without a negatives' denominator
        (`Objective.negatives_refusal`), an adapter under `reference` (its random start has no counterpart when the
        base is frozen), trainer=fsdp (ξ is not sharded)."""
        refuse_loss_without_negatives(
            cfg, "negatives=momentum", "ESimCSE's queue adds negatives to a loss's denominator."
        )
        if self.convention == "reference" and cfg.get("adapter"):
            raise SentembConfigError(
                "negatives.convention=reference with adapter=: the released code starts the momentum encoder from "
                "random weights and trains every weight; with a frozen base the random base would never be replaced "
                "by the pretrained one as it is there. Fix: negatives.convention=paper, or no adapter"
            )
        refuse_sharded(cfg, "negatives=momentum", "the momentum encoder is a whole copy of the model, not sharded")


def check_negatives(cfg: Mapping[str, Any]) -> None:
    """The configured negatives part's own pre-run checks, before any model loads: built from its config (its
    constructor checks its options; nothing is copied or loaded until `track`), then its `check_config` (the loss and
    trainer it cannot go with). Nothing without a negatives= group."""
    node = cfg.get("negatives")
    if not node:
        return
    check = getattr(build_part("negatives", node), "check_config", None)
    if check is not None:  # a part of your own may declare none
        check(cfg)
