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
from sentemb.common.hydra_plumbing import part_name, resolved_container
from sentemb.common.parts import part
from sentemb.encoders.checkpoint import read_checkpoint
from sentemb.encoders.part_configs import build_part
from sentemb.losses.registry import negatives_refusal
from sentemb.training.distributed import world_size
from sentemb.training.sharding import devices_asked, is_sharded

if TYPE_CHECKING:
    from sentemb.encoders.encoder import SentenceEncoder
    from sentemb.losses import LossOutput

CONVENTIONS = ("paper", "reference")
# the losses with a negatives' denominator, named in the fixes of both parts' refusals
NEGATIVES_LOSSES = "infonce, focal, arccon, mpt, met, mat, paradigm"
# K's bound: every step scores N × K logits and the queue holds K × D floats on the device; 2^16 is MoCo's largest
# queue (ESimCSE's is 160), far above any corpus-sized use and far below a queue that would exhaust a device
MAX_QUEUE_SIZE = 65_536
# the queue's extra state, as get_extra_state writes it (`emptied_at_epoch` missing in older checkpoints)
QUEUE_STATE_KEYS = ("queue", "queue_ids", "emptied_at_epoch")
NEGATIVES_PREFIX = "negatives."  # the negatives part's keys in SentembModule's state dict
RESUME_FIX = (
    "Fix: resume from the run's own checkpoint as sentemb wrote it (its checkpoints/last.ckpt, or an earlier "
    "best-step<N>.ckpt), or start a new run"
)


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
        if not (isinstance(queue_size, int) and not isinstance(queue_size, bool) and 1 <= queue_size <= MAX_QUEUE_SIZE):
            raise SentembConfigError(
                f"negatives.queue_size={queue_size} must be a whole number from 1 to {MAX_QUEUE_SIZE} (every step "
                "scores each sentence against every queued row; ESimCSE: 2.5 × the batch, 160 for 64). "
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
        self.check_width(z1.shape[-1])
        return StepNegatives(negatives=self.negatives(sentences), sentences=sentences)

    def check_width(self, width: int) -> None:
        """The queue's rows are as wide as this run's embeddings: only a restored queue can differ (its width is
        known only once the encoder embeds), refused before the loss would raise a bare shape error."""
        if self.queue is not None and self.queue.shape[-1] != width:
            raise SentembConfigError(
                f"negatives._extra_state: the resumed checkpoint's momentum queue holds rows of width "
                f"{self.queue.shape[-1]}, this run's embeddings have {width}. {RESUME_FIX}"
            )

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
        if not any(key.startswith(f"{NEGATIVES_PREFIX}backbone.") for key in entries):
            raise SentembConfigError(
                f"{named} holds no momentum encoder (no {NEGATIVES_PREFIX}backbone.* weights), though it was trained "
                f"with negatives=momentum. {RESUME_FIX}"
            )
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


def check_resumed_negatives(
    ckpt_path: str | None, cfg: Mapping[str, Any], checkpoint: Mapping[str, Any] | None = None
) -> None:
    """The checkpoint a run resumes from (ckpt_path, the run folder's last.ckpt in a resume in place), before any
    model loads: it was trained with the negatives part this run asks for (a resume continues a run, with the state
    its part saved: a SimCSE checkpoint has no momentum encoder nor queue to go on with), and that part's state in it
    is one the part can take (the part's `check_resumed_state`; a part without one keeps no state, so none may be
    there). `checkpoint`: the file as `check_checkpoint_path` read it; else read with its tensors left on disk
    (`read_checkpoint`, which has checked the file itself)."""
    if not ckpt_path:
        return
    named = f"ckpt_path={ckpt_path}"
    if checkpoint is None:
        checkpoint = read_checkpoint(ckpt_path, mmap=True)
    asked = resolved_container(cfg.get("negatives")) or None
    saved_name = part_name((checkpoint.get("hyper_parameters") or {}).get("negatives"))
    asked_name = part_name(asked)
    if saved_name != asked_name:
        raise SentembConfigError(
            f"{named} was trained with negatives={saved_name or 'null (none)'}, this run asks for "
            f"negatives={asked_name or 'null (none)'}: a resume goes on with the state the run's own part saved "
            "(ESimCSE's momentum encoder and queue), which the other part has not. Fix: resume with the run's own "
            "negatives= (its .hydra/overrides.yaml), or start a new run"
        )
    if asked is None:
        return
    entries = {key: value for key, value in checkpoint["state_dict"].items() if key.startswith(NEGATIVES_PREFIX)}
    part_built = build_part("negatives", asked)  # its constructor only: nothing is copied or loaded before `track`
    check = getattr(part_built, "check_resumed_state", None)
    if check is not None:
        check(entries, named, cfg)
    elif entries:
        raise SentembConfigError(
            f"{named} holds state under {NEGATIVES_PREFIX}* ({', '.join(sorted(entries)[:3])}), which "
            f"negatives={asked_name} never saves. {RESUME_FIX}"
        )


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
