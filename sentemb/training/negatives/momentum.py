"""ESimCSE's momentum contrast: a momentum copy ξ of the encoder and a FIFO queue of its past embeddings.

    ξ ← m·ξ + (1 − m)·θ                          (ESimCSE §3.2; m = 0.995, over the backbone's parameters only)
    L = −(1/B) Σ_i log e^{cos(z_i,z_i⁺)/τ} / (Σ_j e^{cos(z_i,z_j⁺)/τ} + Σ_{k∈Q} e^{cos(z_i,q_k)/τ})
    q = MLP_θ(Enc_ξ(x)[CLS])                       (view 1 of a past batch; ξ in eval mode, no gradient)

The queue's rows are extra negatives of the configured loss (any loss with a negatives' denominator:
`Objective.negatives_refusal`), at the same τ. Within a training step (the released code's order):
the online forward of the views; the EMA update (θ as it stands before this step's optimiser update);
the loss against the queue as it stood before the step; ξ encodes the batch's anchors; the queue
takes them, keeping its newest K; then backward. So the queue never holds the current batch: a
sentence's own positive is never its negative.

`convention`: `paper` (default) starts ξ as a copy of the encoder (the method's evident intent), keeps
the queue across epochs, and (sentemb's own choice, not the released code's) leaves out of a step's
negatives the queued entries whose sentence is in the current batch (the same token ids: a second
epoch, a duplicated line). `reference` does what caskcsg/sentemb's ESimCSE does (ESimCSE/esimcse/
trainers.py `compute_loss`, models.py `cl_forward`): ξ built before the pretrained weights load and
re-initialised (random, normal std = the model's initializer_range, the released log's "newly
initialized momentum_model"), the queue emptied at each epoch start, every queued row a negative,
and the first batch after an empty queue kept whole (`pre_z1 = eval_z`: only later batches cut the
queue to its newest K).

State: ξ is a submodule (its weights travel in the state dict; under an adapter only ξ's copies of
the trained weights, `saved_with_adapter`), the queue and its sentences' keys travel as this
module's extra state, checked field by field when a resumed checkpoint is read (`check_resumed_negatives`,
before any model loads) and again when it is loaded (`set_extra_state`). Under DDP every rank enqueues the
gathered keys of all ranks (in rank order, as the gathered negatives), so all ranks hold the same queue.

The queue is a `NegativesPart` (base.py) built on the momentum copy ξ of ema.py (`EMATarget`); what one
step's loss gets is a `StepNegatives`, handed back to the part after the loss with the step's embeddings (no
per-batch state is kept on the part).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import torch

from sentemb.common.batch_views import anchor_batch
from sentemb.common.errors import SentembConfigError
from sentemb.common.parts import part
from sentemb.training.negatives.base import (
    CONVENTIONS,
    NEGATIVES_PREFIX,
    RESUME_FIX,
    StepInputs,
    StepNegatives,
    gathered,
    refuse_loss_without_negatives,
    refuse_sharded,
)
from sentemb.training.negatives.ema import EMATarget
from sentemb.training.sharding import devices_asked

if TYPE_CHECKING:
    pass
# K's bound: every step scores N × K logits and the queue holds K × D floats on the device; 2^16 is MoCo's largest
# queue (ESimCSE's is 160), far above any corpus-sized use and far below a queue that would exhaust a device
MAX_QUEUE_SIZE = 65_536
# the queue's extra state, as get_extra_state writes it (`emptied_at_epoch` missing in older checkpoints)
QUEUE_STATE_KEYS = ("queue", "queue_ids", "emptied_at_epoch")


def sentence_keys(input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """One int64 per row naming its sentence by its real token ids (padding on either side ignored)."""
    keys = [
        hash(tuple(i for i, k in zip(ids, keep, strict=True) if k))
        for ids, keep in zip(input_ids.tolist(), attention_mask.tolist(), strict=True)
    ]  # Python's hash of a tuple of ints: the same in every process (only str hashing is salted)
    return torch.tensor(keys, dtype=torch.long, device=input_ids.device)


@part("negatives", "momentum")
class MomentumQueue(EMATarget):
    """ξ (`EMATarget`) and the queue; built empty, then `track(encoder)` copies its backbone into ξ (or, under
    `reference`, re-initialises the copy)."""

    def __init__(self, momentum: float = 0.995, queue_size: int = 160, convention: str = "paper") -> None:
        super().__init__(momentum)
        if not (isinstance(queue_size, int) and not isinstance(queue_size, bool) and 1 <= queue_size <= MAX_QUEUE_SIZE):
            raise SentembConfigError(
                f"negatives.queue_size={queue_size} must be a whole number from 1 to {MAX_QUEUE_SIZE} (every step "
                "scores each sentence against every queued row; ESimCSE: 2.5 × the batch, 160 for 64). "
                "Fix: e.g. negatives.queue_size=160"
            )
        if convention not in CONVENTIONS:
            raise SentembConfigError(f"negatives.convention={convention!r}: use paper or reference")
        self.queue_size, self.convention = queue_size, convention
        self.queue: torch.Tensor | None = None  # (k ≤ K, D), oldest first
        self.queue_ids: torch.Tensor | None = None  # (k,) each entry's sentence (sentence_keys)
        self.emptied_at_epoch = -1  # reference: the epoch whose start last emptied the queue (a resume keeps it)

    @property
    def starts_at_random(self) -> bool:
        """Under `reference` ξ starts at random, as the released code's (module docstring)."""
        return self.convention == "reference"

    def negatives(self, batch_ids: torch.Tensor) -> torch.Tensor | None:
        """The queue's embeddings as they stand: under `reference` every row (the released loss concatenates the
        whole `pre_z1`, models.py `cl_forward`); under `paper` without the entries of sentences in this (global)
        batch (sentemb's choice: a sentence is never its own negative, even from an earlier step)."""
        if self.queue is None or len(self.queue) == 0:
            return None
        if self.convention == "reference":
            return self.queue
        keep = ~torch.isin(self.queue_ids, batch_ids.to(self.queue_ids.device))
        return self.queue if bool(keep.all()) else self.queue[keep]

    @torch.no_grad()
    def enqueue(self, keys: torch.Tensor, ids: torch.Tensor) -> None:
        """Q ← cat(Q, keys)[−K:] (new tensors: the step's loss may still hold the old queue); `keys` this rank's,
        gathered here; `ids` the global batch's sentence keys, already gathered (`global_sentence_ids`). An empty
        queue takes the newest K of the batch (`paper`), or the whole batch (`reference`: the released trainer's
        `pre_z1 = eval_z.clone()` when `pre_z1` is None, trainers.py `compute_loss`)."""
        keys = gathered(keys.detach().float())
        if self.queue is None:
            first = 0 if self.convention == "reference" else max(len(keys) - self.queue_size, 0)
            self.queue, self.queue_ids = keys[first:], ids[first:]
            return
        self.queue = torch.cat([self.queue.to(keys.device), keys])[-self.queue_size :]
        self.queue_ids = torch.cat([self.queue_ids.to(ids.device), ids])[-self.queue_size :]

    def step_negatives(self, inputs: StepInputs) -> StepNegatives:
        """ESimCSE's step before its loss: every rank's anchors' sentence keys (`sentence_keys`, gathered), the EMA
        update of ξ (θ as it stands before this step's update), then the queue as it stood before this step, without
        the entries of this global batch's sentences."""
        anchors = anchor_batch(inputs.batch)
        sentences = gathered(sentence_keys(anchors["input_ids"], anchors["attention_mask"]))
        self.update(inputs.encoder.backbone)
        self.check_width(inputs.z1.shape[-1])
        return StepNegatives(negatives=self.negatives(sentences), carried={"sentences": sentences})

    def check_width(self, width: int) -> None:
        """The queue's rows are as wide as this run's embeddings: only a restored queue can differ (its width is
        known only once the encoder embeds), refused before the loss would raise a bare shape error."""
        if self.queue is not None and self.queue.shape[-1] != width:
            raise SentembConfigError(
                f"negatives._extra_state: the resumed checkpoint's momentum queue holds rows of width "
                f"{self.queue.shape[-1]}, this run's embeddings have {width}. {RESUME_FIX}"
            )

    def after_loss(self, inputs: StepInputs, step: StepNegatives) -> None:
        """ξ embeds this batch's anchors (`target_embeddings`: ESimCSE's q = MLP_θ(Enc_ξ(x)), not the online z1);
        every rank's keys join the queue."""
        keys = self.target_embeddings(inputs.encoder, anchor_batch(inputs.batch), inputs.chunk)
        self.enqueue(keys, step.carried["sentences"])

    def on_epoch_start(self, epoch: int) -> None:
        """The released code empties the queue at each epoch start (`reference`); the paper's queue goes on. A run
        resumed mid-epoch starts that epoch again in Lightning: the queue it saved is kept."""
        if self.convention == "reference" and epoch != self.emptied_at_epoch:
            self.queue = self.queue_ids = None
            self.emptied_at_epoch = epoch

    def get_extra_state(self) -> dict[str, Any]:
        epoch = self.emptied_at_epoch
        if self.queue is None:
            return {"queue": torch.zeros(0), "queue_ids": torch.zeros(0, dtype=torch.long), "emptied_at_epoch": epoch}
        return {"queue": self.queue.detach().cpu(), "queue_ids": self.queue_ids.cpu(), "emptied_at_epoch": epoch}

    def set_extra_state(self, state: dict[str, Any]) -> None:
        """The state `get_extra_state` wrote, checked first (`queue_state_problem`): a checkpoint not read through
        `check_resumed_negatives` (SentembModule.load_from_checkpoint) is refused here, naming the key."""
        problem = queue_state_problem(state, self.queue_size if self.convention == "paper" else None)
        if problem:
            raise SentembConfigError(f"negatives._extra_state: {problem}. {RESUME_FIX}")
        queue = state["queue"]
        self.emptied_at_epoch = int(state.get("emptied_at_epoch", -1))
        if queue.numel() == 0:
            self.queue = self.queue_ids = None
            return
        device = next(self.parameters(), queue).device
        self.queue, self.queue_ids = queue.float().to(device), state["queue_ids"].to(device)

    def check_resumed_state(self, entries: Mapping[str, Any], named: str, cfg: Mapping[str, Any]) -> None:
        """A resumed checkpoint's `negatives.*` entries (`entries`), before any model loads: ξ's weights are there
        and the queue's state is one this run can take (`queue_state_problem`: at most K rows, or under `reference`
        the whole first batch of an epoch, `resumed_rows_allowed`)."""
        self.check_target_saved(entries, named, "momentum")
        state = entries.get(f"{NEGATIVES_PREFIX}_extra_state")
        if state is None:
            raise SentembConfigError(
                f"{named} holds no momentum queue ({NEGATIVES_PREFIX}_extra_state), though it was trained with "
                f"negatives=momentum. {RESUME_FIX}"
            )
        problem = queue_state_problem(state, resumed_rows_allowed(self, cfg))
        if problem:
            raise SentembConfigError(f"{named}: {NEGATIVES_PREFIX}_extra_state: {problem}. {RESUME_FIX}")

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


def queue_state_problem(state: Any, rows_allowed: int | None) -> str | None:
    """Why `state` is not a momentum queue's extra state (a float (rows, width) queue of finite values, an int64
    sentence key per row, the epoch that last emptied it; an empty queue as `get_extra_state` writes it), or has
    more rows than `rows_allowed` (None: unbounded here); None when it is one. Shapes are read before values, so a
    huge queue left on disk (a checkpoint read with mmap) is refused without being read."""
    if not (isinstance(state, Mapping) and {"queue", "queue_ids"} <= set(state) <= set(QUEUE_STATE_KEYS)):
        found = sorted(map(str, state)) if isinstance(state, Mapping) else type(state).__name__
        return f"is not a momentum queue's state (a dict of {', '.join(QUEUE_STATE_KEYS)}), but {found}"
    queue, ids, epoch = state["queue"], state["queue_ids"], state.get("emptied_at_epoch", -1)
    if not (isinstance(queue, torch.Tensor) and queue.is_floating_point()):
        return f"queue is {described(queue)}, not a float tensor"
    if not (isinstance(ids, torch.Tensor) and ids.dtype == torch.long):
        return f"queue_ids is {described(ids)}, not an int64 tensor (one sentence key per queued row)"
    if not (isinstance(epoch, int) and not isinstance(epoch, bool) and epoch >= -1):
        return f"emptied_at_epoch is {epoch!r}, not an epoch (a whole number >= -1)"
    if queue.numel() == 0 and ids.numel() == 0:  # an empty queue (get_extra_state's zeros(0))
        return None
    if queue.dim() != 2 or queue.shape[1] < 1:
        return f"queue has shape {tuple(queue.shape)}, not (rows, width)"
    if ids.dim() != 1 or ids.shape[0] != queue.shape[0]:
        return f"queue_ids has shape {tuple(ids.shape)}, not ({queue.shape[0]},): one sentence key per queued row"
    if rows_allowed is not None and queue.shape[0] > rows_allowed:
        return f"queue holds {queue.shape[0]} rows, more than this run's queue can ({rows_allowed})"
    if not bool(torch.isfinite(queue).all()):
        return "queue holds non-finite values (NaN or inf)"
    return None


def described(value: Any) -> str:
    """A value's type, and a tensor's dtype and shape, for a refusal."""
    if isinstance(value, torch.Tensor):
        return f"a {str(value.dtype).removeprefix('torch.')} tensor of shape {tuple(value.shape)}"
    return f"a {type(value).__name__}"


def resumed_rows_allowed(queue: MomentumQueue, cfg: Mapping[str, Any]) -> int:
    """The most rows a resumed run's queue can hold: K; under `reference` the whole global batch when it is larger
    (the first batch after an empty queue is kept whole), the batch per process times the processes asked (where
    Lightning picks them, trainer.devices=auto or -1: every visible GPU, at least one)."""
    if queue.convention == "paper":
        return queue.queue_size
    data, trainer = cfg.get("data") or {}, cfg.get("trainer") or {}
    batch = data.get("batch_size")
    if not (isinstance(batch, int) and not isinstance(batch, bool) and batch > 0):
        return queue.queue_size
    devices = devices_asked(trainer.get("devices")) or max(torch.cuda.device_count(), 1)
    return max(queue.queue_size, batch * devices * int(trainer.get("num_nodes") or 1))
