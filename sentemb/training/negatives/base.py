"""The negatives-part protocol: what SentembModule asks of a `negatives=` part, each hook with a working default.

A step runs, in this order (training/module.py): `training_batch` (the batch the encoders see) → the views and their
DDP gather (the step's `LossInputs` by role) → `step_negatives` (what this step's loss gets: a `StepNegatives`) →
`global_loss` (the loss on the inputs with them as `extra` and `excluded`, `apply_negatives` by default) →
`after_loss` (given the step's embeddings: a queue or memory takes them) → backward. What one step hands from
`step_negatives` to `after_loss` travels in its `StepNegatives` (`carried`), never on the part: a part keeps no
per-batch state. State a part keeps across steps (a queue, a memory) is a persistent buffer or torch's
`get_extra_state`/`set_extra_state`: checkpoints save and restore it, and a resumed checkpoint's entries are checked
before any model loads (`check_resumed_state`).

A new part subclasses `NegativesPart`, registers with `@part("negatives", "<name>")` in a module of this package,
and overrides only what it changes; `ema.py` is the momentum copy of the encoder any part can build on.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch import nn

from sentemb.common.errors import SentembConfigError
from sentemb.common.hydra_plumbing import part_name, resolved_container
from sentemb.common.parts import declared_part
from sentemb.encoders.checkpoint import read_checkpoint
from sentemb.encoders.part_configs import build_part
from sentemb.losses.inputs import LossInputs
from sentemb.losses.registry import negatives_losses, negatives_refusal
from sentemb.training.checkpoints import KeepsTrainedCopies
from sentemb.training.distributed import world_size
from sentemb.training.sharding import is_sharded

if TYPE_CHECKING:
    from sentemb.encoders.encoder import SentenceEncoder
    from sentemb.losses import LossOutput

CONVENTIONS = ("paper", "reference")
NEGATIVES_PREFIX = "negatives."  # the negatives part's keys in SentembModule's state dict
RESUME_FIX = (
    "Fix: resume from the run's own checkpoint as sentemb wrote it (its checkpoints/last.ckpt, or an earlier "
    "best-step<N>.ckpt), or start a new run"
)


@dataclass(frozen=True)
class StepInputs:
    """What a step hands its negatives part: the batch its encoders saw, the step's loss inputs by role (`roles`: the
    global anchors, positives, hard negatives, ..., gathered over the ranks), the encoder, the loss, and GradCache's
    sentences per forward (`chunk`; None: the batch at once), for a part that encodes the batch again."""

    batch: dict[str, torch.Tensor]
    roles: LossInputs
    encoder: SentenceEncoder
    loss: nn.Module
    chunk: int | None = None

    @property
    def z1(self) -> torch.Tensor:
        """The global anchors' embeddings."""
        return self.roles.anchors

    @property
    def z2(self) -> torch.Tensor:
        """The global positives' embeddings."""
        return self.roles.positives


@dataclass(frozen=True)
class StepNegatives:
    """What a negatives part gives one training step's loss, and gets back after it.

    `negatives`: extra negative rows (K, D), or None (the loss inputs' `extra`); `excluded`: the (N, N + K) bool mask
    of each anchor's false negatives among [positives | negatives] (`LossInputs.excluded`), or None; `carried`: the
    part's own values from `step_negatives` for its `after_loss` (e.g. the global batch's sentence keys); `logged`:
    detached scalars logged as they are named.
    """

    negatives: torch.Tensor | None = None
    excluded: torch.Tensor | None = None
    carried: Mapping[str, torch.Tensor] = field(default_factory=dict)
    logged: Mapping[str, torch.Tensor] = field(default_factory=dict)

    def inputs(self, roles: LossInputs) -> LossInputs:
        """The step's loss inputs with these negatives and exclusions."""
        return roles.with_roles(extra=self.negatives, excluded=self.excluded)


class NegativesPart(KeepsTrainedCopies, nn.Module):
    """A `negatives=` part; the defaults add nothing (the loss on the global batch alone), so a part writes only
    the hooks it changes."""

    def check_config(self, cfg: Mapping[str, Any]) -> None:
        """What the part cannot go with in the run's config `cfg`, before any model loads (its options: its
        constructor). Nothing by default."""

    def check_resumed_state(self, entries: Mapping[str, Any], named: str, cfg: Mapping[str, Any]) -> None:
        """A resumed checkpoint's `negatives.*` entries, before any model loads: by default each must be one of the
        part's own state-dict keys as it is built (a part without state takes none)."""
        own = {f"{NEGATIVES_PREFIX}{key}" for key in self.state_dict()}
        stray = sorted(set(entries) - own)
        if stray:
            declared = declared_part(self)
            raise SentembConfigError(
                f"{named} holds state under {NEGATIVES_PREFIX}* ({', '.join(stray[:3])}), which "
                f"negatives={declared.name if declared else type(self).__name__} never saves. {RESUME_FIX}"
            )

    def track(self, encoder: SentenceEncoder) -> None:
        """Once, in the module's constructor, before any checkpoint loads and before compile: what the part copies
        of the encoder. Nothing by default."""

    def on_epoch_start(self, epoch: int) -> None:
        """At each training epoch's start. Nothing by default."""

    def training_batch(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The batch the step's encoders see: the batch, by default."""
        return batch

    def step_negatives(self, inputs: StepInputs) -> StepNegatives:
        """After the views and their DDP gather, before the loss: none by default."""
        return StepNegatives()

    def global_loss(self, inputs: StepInputs, step: StepNegatives) -> LossOutput:
        """The step's global loss with its negatives (`apply_negatives`)."""
        return apply_negatives(inputs, step)

    def after_loss(self, inputs: StepInputs, step: StepNegatives) -> None:
        """After the loss, before backward, with the step's global embeddings (as the loss had them). Nothing by
        default."""


def apply_negatives(inputs: StepInputs, step: StepNegatives) -> LossOutput:
    """The loss on the step's inputs by role with the step's negatives and exclusions."""
    return inputs.loss(step.inputs(inputs.roles))


def in_chunks(
    embed: Callable[[dict[str, torch.Tensor]], torch.Tensor], rows: dict[str, torch.Tensor], size: int | None
) -> torch.Tensor:
    """embed(rows) computed `size` rows at a time (GradCache's chunks; None: at once), concatenated."""
    count = rows["input_ids"].shape[0]
    size = size or count
    return torch.cat([embed({k: v[start : start + size] for k, v in rows.items()}) for start in range(0, count, size)])


def gathered(tensor: torch.Tensor) -> torch.Tensor:
    """Every rank's rows, in rank order (no gradient: for constants such as a queue's keys)."""
    if world_size() == 1:
        return tensor
    parts = [torch.zeros_like(tensor) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, tensor.contiguous())
    return torch.cat(parts)


def refuse_loss_without_negatives(cfg: Mapping[str, Any], named: str, why: str, losses: str | None = None) -> None:
    """A loss that takes no extra negatives (`negatives_refusal`) refused for `named` (negatives=<part>), saying
    `why` the part needs them, and the `losses` it takes in the fix (the registry's that take them by default)."""
    loss = cfg.get("loss") or {}
    reason = negatives_refusal(loss)
    if reason:
        raise SentembConfigError(
            f"{named} with loss={loss.get('name')}: {reason} {why} Fix: a loss that takes extra negatives "
            f"({losses or ', '.join(negatives_losses())}), or no negatives= group"
        )


def refuse_sharded(cfg: Mapping[str, Any], named: str, why: str) -> None:
    """trainer=fsdp refused for `named`, saying `why`."""
    if is_sharded(cfg.get("trainer") or {}):
        raise SentembConfigError(f"{named} with trainer=fsdp: {why}. Fix: trainer=ddp (or one device)")


def check_resumed_negatives(
    ckpt_path: str | None, cfg: Mapping[str, Any], checkpoint: Mapping[str, Any] | None = None
) -> None:
    """The checkpoint a run resumes from (ckpt_path, the run folder's last.ckpt in a resume in place), before any
    model loads: it was trained with the negatives part this run asks for (a resume continues a run, with the state
    its part saved: a SimCSE checkpoint has no momentum encoder nor queue to go on with), and that part's state in it
    is one the part can take (the part's `check_resumed_state`). `checkpoint`: the file as `check_checkpoint_path`
    read it; else read with its tensors left on disk (`read_checkpoint`, which has checked the file itself)."""
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
    # its constructor only: nothing is copied or loaded before `track`
    build_part("negatives", asked).check_resumed_state(entries, named, cfg)
