"""The LightningModule: encoder → pooling (→ train-only MLP) → objective.

Built from plain config dicts (saved as hyper-parameters), so a checkpoint alone rebuilds
the exact encoder, pooling and loss it was trained with.
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import lightning as L
import torch
from hydra.utils import instantiate
from lightning.pytorch.plugins.precision import MixedPrecision
from lightning.pytorch.strategies import ModelParallelStrategy
from lightning.pytorch.utilities import GradClipAlgorithmType
from omegaconf import DictConfig
from torch import nn

from sentemb.common.batch_views import training_view_batches, view_roles
from sentemb.common.errors import SentembConfigError, TrainingDiverged
from sentemb.common.hydra_plumbing import resolved_container
from sentemb.common.numbers import Bounds, require_number
from sentemb.data.labelled import is_hard_negative
from sentemb.encoders.build import build_encoder
from sentemb.encoders.checkpoint import HPARAMS, read_checkpoint, renamed_hparams
from sentemb.encoders.models.adapters import is_adapted
from sentemb.encoders.models.frozen import FrozenModel
from sentemb.encoders.part_configs import build_part, checked_part
from sentemb.encoders.poolings.base import TrainingViews
from sentemb.losses import LossOutput
from sentemb.losses.base import LazyStats, Objective
from sentemb.losses.distill import bind_teacher_widths
from sentemb.losses.inputs import TeacherTargets
from sentemb.losses.matryoshka import Matryoshka
from sentemb.training.auxiliary import AuxiliaryTerm
from sentemb.training.auxiliary_checks import auxiliary_nodes
from sentemb.training.checkpoints import CheckpointContents
from sentemb.training.distributed import world_size
from sentemb.training.grad_cache import GradCache
from sentemb.training.loss_inputs import present_rows, step_inputs
from sentemb.training.negatives import NegativesPart, StepInputs, StepNegatives
from sentemb.training.negatives.base import gathered, in_chunks
from sentemb.training.sharding import shard_encoder
from sentemb.training.teacher import build_teacher, teacher_record, teacher_records

log = logging.getLogger(__name__)
UNIT = Bounds(0.0, 1.0)  # scheduler.warmup_ratio: a share of the run's steps


class SentembModule(CheckpointContents, L.LightningModule):
    """What a checkpoint holds beyond Lightning's own (RNG streams, an adapter run's trained weights, every part's
    state) is `CheckpointContents`' (sentemb/training/checkpoints.py).

    The recipe: an encoder (`model`, `pooling`, `head`, `adapter`), the global `loss`, and the step parts a config
    names by kind (`negatives=`: extra and false negatives; `auxiliary=`: a term beside the loss), each built from the
    registry of parts by name; no parameter names a method."""

    def __init__(
        self,
        model: dict[str, Any],
        pooling: dict[str, Any],
        loss: dict[str, Any],
        optimizer: dict[str, Any],
        scheduler: dict[str, Any] | None = None,
        head: dict[str, Any] | None = None,
        grad_cache: int | dict[str, int | None] | None = None,
        compile: bool = False,
        adapter: dict[str, Any] | None = None,
        negatives: dict[str, Any] | None = None,
        auxiliary: list[dict[str, Any]] | dict[str, Any] | None = None,
        matryoshka: dict[str, Any] | None = None,
        teacher: dict[str, Any] | None = None,
        **stored: Any,
    ) -> None:
        super().__init__()
        self.save_hyperparameters()
        # a checkpoint written under older names (`renamed_hparams`): its parts under today's, nothing else taken
        renamed = renamed_hparams(stored)
        unexpected = sorted(set(renamed) - {"auxiliary"})
        if unexpected:
            raise TypeError(f"SentembModule got unexpected keyword arguments {unexpected}")
        auxiliary = renamed.get("auxiliary", auxiliary)
        self.encoder = build_encoder(model, pooling, head, adapter)
        # an adapter run's checkpoints hold its trained weights only (CheckpointContents); the base is rebuilt
        self.strict_loading = not is_adapted(self.encoder.backbone)
        # the negatives part (sentemb/training/negatives/; none: the base part, which adds nothing); it takes what it
        # copies of the encoder now, before compile and any checkpoint
        self.negatives: NegativesPart = build_part("negatives", negatives) if negatives else NegativesPart()
        self.negatives.track(self.encoder)
        # the auxiliary terms beside the loss (sentemb/training/auxiliary/), in the config's order
        terms: list[AuxiliaryTerm] = [build_part("auxiliary", node) for node in auxiliary_nodes(auxiliary)]
        self.auxiliary = nn.ModuleList(terms)
        if compile:  # in place: parameter names (and checkpoints) stay those of the eager backbone
            self.encoder.backbone.compile(dynamic=True)  # dynamic: every batch packs another number of tokens
        self.loss: Objective = build_part("loss", loss)  # a registered objective by name (sentemb.common.parts)
        if matryoshka and matryoshka.get("dims"):  # the loss over each prefix of the embeddings (Kusupati et al. 2022)
            self.loss = Matryoshka(self.loss, matryoshka["dims"], matryoshka.get("weights"))
        self.grad_cache = GradCache.from_config(grad_cache)  # null, a sentence count, or {sentences, tokens}
        # the frozen teacher (teacher.path): outside the state as DCLR's complementary model, built at fit start;
        # its width now, so that a distillation loss's projection is built before any checkpoint loads
        self.teacher = FrozenModel()
        # None without a path (a config node's `path: null` too); a node with a path resolves to its record
        teacher = self.hparams["teacher"] = teacher_record(teacher)
        if teacher:  # distill_mse reads one teacher (several are refused with it): the first one's width
            student = getattr(self.encoder.pooling, "output_size", None) or self.encoder.hidden_size
            bind_teacher_widths(self.loss, int(student), int(teacher_records(teacher)[0]["width"]))
        # from_pretrained returns the backbone in eval mode and Lightning keeps submodule modes:
        # without this, dropout is off and the two views are identical (no SimCSE at all)
        self.train()

    @classmethod
    def load_from_checkpoint(cls, checkpoint_path: str | Path, *args: Any, **kwargs: Any) -> SentembModule:
        """Lightning's loader, after sentemb's checks: the file through `read_checkpoint` (whole, weights-only, its
        hyper-parameters plain data), and the loss, optimizer and scheduler it would build sentemb's own or torch's and
        transformers' (`check_built_targets`); read weights-only, and with no `hparams_file` (a YAML Lightning would
        merge in unchecked)."""
        if kwargs.get("hparams_file") is not None:
            raise SentembConfigError(
                "SentembModule.load_from_checkpoint: hparams_file is not read (a checkpoint holds its own "
                "hyper-parameters). Fix: drop hparams_file, or pass the values you change as keyword arguments"
            )
        hparams = read_checkpoint(checkpoint_path, mmap=True)["hyper_parameters"]  # tensors left on disk: a check
        check_built_targets(hparams, f"checkpoint={checkpoint_path}")
        return super().load_from_checkpoint(checkpoint_path, *args, **{**kwargs, "weights_only": True})

    @classmethod
    def from_config(cls, cfg: DictConfig | Mapping[str, Any]) -> SentembModule:
        """The module of a composed train config (conf/train.yaml), or of its parts already resolved: the one way
        train, tests and benchmarks build it. Its keys are the hyper-parameters a checkpoint holds (`HPARAMS`)."""
        parts = {key: resolved_container(cfg.get(key)) for key in HPARAMS}
        parts["teacher"] = teacher_record(parts["teacher"])  # its identity (sha256, width), read from its files
        return cls(**{**parts, "compile": bool(parts["compile"])})

    def data_views(self) -> dict[str, dict[str, Any]]:
        """The views the step parts read that the data must make: role → the options its maker reads."""
        return {role: options for term in self.auxiliary for role, options in term.data_views().items()}

    def configure_model(self) -> None:
        """trainer=fsdp (Lightning's ModelParallelStrategy): the encoder sharded over the data-parallel ranks, each
        transformer layer a unit (sentemb/training/sharding.py); other strategies keep the model whole."""
        if self._trainer is not None and isinstance(self.trainer.strategy, ModelParallelStrategy):
            shard_encoder(self, self.device_mesh["data_parallel"])

    def on_train_epoch_start(self) -> None:
        self.negatives.on_epoch_start(self.current_epoch)  # e.g. a queue emptied at each epoch (a reference)

    def on_fit_start(self) -> None:
        self.encoder.pooling.prepare_training(self.encoder.tokenizer)  # e.g. a head's corpus token frequencies
        self.teacher_model()  # loaded once the run starts (resumes rebuild it: it is in no checkpoint)
        total = sum(p.numel() for p in self.parameters())
        trainable = sum(p.numel() for p in self.parameters() if p.requires_grad)
        if self._trainer is None or self.trainer.is_global_zero:  # one line per job, not per rank
            log.info(
                f"model: {type(self.encoder.backbone).__name__} + {type(self.encoder.pooling).__name__}, "
                f"{total / 1e6:.1f} M parameters, {trainable / 1e6:.1f} M trained; loss: {type(self.loss).__name__}"
            )

    def step_loss(
        self, batch: dict[str, torch.Tensor]
    ) -> tuple[torch.Tensor, torch.Tensor, Mapping[str, torch.Tensor | float]]:
        """(loss to back-propagate, loss to log, logged parts) of one training batch: views → the global loss (with
        the negatives part's extra and false negatives) → the auxiliary terms (the pooling's and head's, then the
        auxiliary parts'), summed.

        The logged parts (loss terms and the paradigm telemetry, Figures 7–9) are computed when first
        read: training reads them on logging steps only (`on_train_batch_end`).

        Under DDP with gathered negatives every rank computes the global batch's loss but
        back-propagates only into its own slice, and DDP then averages the ranks' gradients: the
        update would be 1/world_size of one process's on the concatenated batch. The gathered loss
        is therefore scaled by world_size for backward, so the averaged gradient is exactly that
        one process's. Auxiliary terms are per-rank means over local data, which DDP's average turns
        into the mean over ranks (a reconstruction's is then the global mean; a local loss over segments takes
        its negatives among the rank's own). A global loss of weight 0 (a head trained alone, e.g.
        head=mntp with head.contrastive=false) is not computed at all: the auxiliary terms are the loss.

        The negatives part is asked, in this order: the batch the encoders see (`training_batch`), the step's
        negatives once the global views are there (`step_negatives`), the loss with them (`global_loss`), then
        `after_loss` with the step's embeddings (a queue takes the batch: never its own negative).
        """
        batch = self.negatives.training_batch(batch)
        views = self.training_views(batch)
        world = world_size()
        output, step = self.global_loss(views, world, batch)
        auxiliary = {**views.own_terms, **{term.label: self.auxiliary_term(term, views) for term in self.auxiliary}}
        terms = [weight * value for weight, value in auxiliary.values()]
        if output is not None:
            total = output.loss if views.global_weight == 1.0 else views.global_weight * output.loss
            backward = total * world if world > 1 else total
        elif terms:  # the auxiliary terms alone (head=mntp head.contrastive=false)
            total = backward = terms.pop(0)
        else:
            raise RuntimeError(f"{type(self.encoder.pooling).__name__}: the global loss has weight 0 and no other term")
        for term in terms:  # e.g. HiCL: α·L_local + (1 − α)·L_global
            total = total + term
            backward = backward + term
        parts = {f"train/loss/{label}": value.detach() for label, (_, value) in auxiliary.items()}
        if step is not None:
            parts.update(step.logged)  # e.g. a negatives part's share of excluded negatives
        if auxiliary and output is not None:
            parts["train/loss/global"] = output.loss.detach()
        if not torch.isfinite(total.detach()):  # fp16 overflow, a tiny τ: stop here, not with NaN weights later
            raise TrainingDiverged(
                f"training diverged at step {self.global_step}: train/loss = {total.item()} "
                f"({type(self.loss).__name__}). Fix: a larger loss.tau, a smaller optimizer.lr, or "
                "trainer.precision=32-true / bf16-mixed instead of 16-mixed"
            )
        if output is None:
            return backward, total, LazyStats(lambda: parts, total.device)
        # each term of a weighted sum, and the paradigm's telemetry
        parts.update({f"train/loss/{label}": value for label, value in output.terms.items()})
        logged = LazyStats(lambda: {**parts, **{f"paradigm/{k}": v for k, v in output.stats.items()}}, total.device)
        return backward, total, logged

    def global_loss(
        self, views: TrainingViews, world: int, batch: dict[str, torch.Tensor]
    ) -> tuple[LossOutput | None, StepNegatives | None]:
        """The loss on the step's inputs by role (`step_inputs`: the anchors, positives, hard negatives, scores,
        gathered from every rank), with the negatives part's (its `StepNegatives`, also returned, handed back to the
        part with the step's embeddings once the loss is there); (None, None) when its weight is 0 (a head trained
        alone): then neither the loss, the gather nor the negatives part runs."""
        if views.global_weight == 0:
            return None, None
        roles = step_inputs(views, batch, world, masks_duplicates=self.loss.takes_negatives())
        if self.hparams.get("teacher"):  # the teacher's embeddings of the same rows, gathered as the z's are
            roles = roles.with_roles(targets=self.teacher_targets(batch))
        inputs = StepInputs(batch, roles, self.encoder, self.loss, self.chunk_sentences())
        step = self.negatives.step_negatives(inputs)
        output = self.negatives.global_loss(inputs, step)
        self.negatives.after_loss(inputs, step)
        return output, step

    def teacher_model(self) -> nn.ModuleList | None:
        """The frozen teachers (built on first use from the `teacher` hyper-parameter, one per record, in its order),
        on the module's device, in eval mode; None without one."""
        records = teacher_records(self.hparams.get("teacher"))
        if not records:
            return None
        if not self.teacher:
            tokenizer = self.encoder.tokenizer
            self.teacher.hold(nn.ModuleList(build_teacher(record, tokenizer) for record in records))
        return self.teacher.on(self.device).eval()  # eval: no dropout in the targets

    def teacher_targets(self, batch: dict[str, torch.Tensor]) -> tuple[TeacherTargets, ...]:
        """Each teacher's embeddings of the anchor, positive and hard-negative views, with its weight (no gradient;
        once per step, in GradCache's chunks when it is on), every rank's gathered in rank order like the student's."""
        roles, rows = view_roles(batch), training_view_batches(batch)
        records = teacher_records(self.hparams.get("teacher"))
        targets = []
        for teacher, record in zip(self.teacher_model(), records, strict=True):
            embedded: dict[int, torch.Tensor] = {}  # a view that is the anchor's rows again (same ids): embedded once

            def embed(view: dict[str, torch.Tensor], teacher: nn.Module = teacher, embedded: dict = embedded):
                key = id(view["input_ids"])
                if key not in embedded:
                    embedded[key] = gathered(in_chunks(teacher, view, self.chunk_sentences()))
                return embedded[key]

            hard = [embed(view) for role, view in zip(roles, rows, strict=True) if is_hard_negative(role)]
            targets.append(TeacherTargets(embed(rows[0]), embed(rows[1]), tuple(hard), weight=float(record["weight"])))
        return tuple(targets)

    @staticmethod
    def auxiliary_term(term: AuxiliaryTerm, views: TrainingViews) -> tuple[float, torch.Tensor]:
        """(weight, loss) of an auxiliary term on the rows that have every view it reads (a built-in set's missing
        hard negative is never seen); a batch with none of them adds 0 with the step's graph."""
        kept, rows = views.rows_with(term.reads)
        if rows == 0:
            return 0.0, 0.0 * views.z1.sum()
        return term.term(kept)

    def chunk_sentences(self) -> int | None:
        """GradCache's sentences per forward (a negatives part encoding the batch again does it in these), or None."""
        return self.grad_cache.sentences if self.grad_cache is not None and self.grad_cache.sentences else None

    def training_views(self, batch: dict[str, torch.Tensor]) -> TrainingViews:
        """Every view's embeddings in one forward, with their roles (`view_roles`); with grad_cache, built from cached
        chunk outputs (grad_cache.py)."""
        if self.grad_cache is None:
            views = self.encoder.training_views(batch)
        else:
            prepared = self.encoder.training_batch(batch)
            rows = self.grad_cache.cached_rows(self.encoder, prepared)
            views = self.encoder.pooling.training_views(rows, prepared, batch["input_ids"].shape[0])
            views = views.named(view_roles(batch))
        if not any(term.reads for term in self.auxiliary):  # only a term reading a view asks which rows have it
            return views
        return replace(views, present=present_rows(batch, views))

    def backward(self, loss: torch.Tensor, *args: Any, **kwargs: Any) -> None:
        """Lightning's backward (the loss arrives already scaled under 16-mixed); GradCache then replays its chunks."""
        super().backward(loss, *args, **kwargs)
        if self.grad_cache is not None and self.grad_cache.pending is not None:
            self.grad_cache.replay_backward(self.encoder, distributed=world_size() > 1)

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> dict[str, Any]:
        backward, total, logged = self.step_loss(batch)
        # logged after the step (on_train_batch_end), once Lightning has decided whether this step is logged
        return {"loss": backward, "total": total.detach(), "logged": logged}

    def on_train_batch_end(self, outputs: Mapping[str, Any], batch: dict[str, torch.Tensor], batch_idx: int) -> None:
        """train/loss, its parts and the paradigm telemetry, on the steps Lightning writes to the loggers only.

        Those are every trainer.log_every_n_steps steps (1: every step, the per-step curves of
        Figures 7–9) and the step a stop was requested at. This hook runs after the callbacks' (a
        preemption's stop is known by then) and before Lightning writes; on other steps Lightning
        would discard the values, so the telemetry is not even computed.
        """
        if not logging_step(self.trainer):
            return
        n = batch["input_ids"].shape[0]
        self.log("train/loss", outputs["total"], prog_bar=True, batch_size=n)
        if outputs["logged"]:
            self.log_dict(dict(outputs["logged"]), batch_size=n)

    def configure_gradient_clipping(
        self,
        optimizer: torch.optim.Optimizer,
        gradient_clip_val: float | None = None,
        gradient_clip_algorithm: str | None = None,
    ) -> None:
        """A non-finite gradient stops training with the step and parameter named, before it reaches the weights;
        then the gradients are clipped. One gradient norm serves both (each pass costs ~1% of a MiniLM CPU step).

        Lightning calls this after the on_before_optimizer_step hooks, with the gradients unscaled.
        Under 16-mixed inf/NaN is the GradScaler's overflow signal (it skips the step and lowers the
        scale), so it is left to the scaler and Lightning clips; a non-finite loss still stops such a
        run (`step_loss`). Under bf16-mixed Lightning's AMP plugin would refuse any fused optimizer,
        although without a GradScaler the gradients are not scaled: the clipping here runs there too.
        """
        plugin = self.trainer.precision_plugin
        if isinstance(plugin, MixedPrecision) and plugin.scaler is not None:
            super().configure_gradient_clipping(optimizer, gradient_clip_val, gradient_clip_algorithm)
            return
        parameters = [p for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
        norm = torch.nn.utils.get_total_norm([p.grad for p in parameters])
        if not torch.isfinite(norm):
            self.raise_non_finite_gradient()
        if not gradient_clip_val:
            return
        if GradClipAlgorithmType(gradient_clip_algorithm or "norm") == GradClipAlgorithmType.VALUE:
            torch.nn.utils.clip_grad_value_(parameters, gradient_clip_val)
        else:  # what torch.nn.utils.clip_grad_norm_ does, with the norm already computed
            torch.nn.utils.clip_grads_with_norm_(parameters, gradient_clip_val, norm)

    def raise_non_finite_gradient(self) -> None:
        """The TrainingDiverged of a non-finite gradient norm: the parameter whose gradient is not finite, or, every
        gradient finite, the norm's own overflow (float32 sums of squares pass 3.4e38 from |g| ~ 1e19)."""
        name = next(
            (n for n, p in self.named_parameters() if p.grad is not None and not torch.isfinite(p.grad).all()), None
        )
        if name is None:  # a bare next() would raise StopIteration, which Lightning takes for the end of the data
            raise TrainingDiverged(
                f"training diverged at step {self.global_step}: the total gradient norm overflowed to inf although "
                "each parameter's gradient is finite (train/loss was finite): the gradients are too large to clip. "
                "Fix: a larger loss.tau (e.g. 0.05), a smaller optimizer.lr"
            )
        raise TrainingDiverged(
            f"training diverged at step {self.global_step}: the gradient of {name} is not finite "
            f"(train/loss was finite). Fix: a smaller optimizer.lr, a larger loss.tau, or trainer.precision=32-true"
        )

    def configure_optimizers(self) -> dict[str, Any]:
        trainable = [p for p in self.parameters() if p.requires_grad]  # model.trainable_layers freezes the rest
        options = {}
        plugin = self.trainer.precision_plugin
        if isinstance(plugin, MixedPrecision) and plugin.scaler is not None and self.hparams.optimizer.get("fused"):
            # a fused optimizer unscales inside its step, after the GradScaler path would clip: not clippable there
            log.info("optimizer.fused=true is not used under 16-mixed (gradient clipping needs unscaled gradients)")
            options["fused"] = False
        optimizer = instantiate(self.hparams.optimizer)(params=trainable, **options)
        if not self.hparams.scheduler:
            return {"optimizer": optimizer}
        steps = int(self.trainer.estimated_stepping_batches)
        scheduler = instantiate(with_warmup_steps(self.hparams.scheduler, steps))(optimizer, num_training_steps=steps)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}


# what a checkpoint's optimizer and scheduler may name (Lightning's load_from_checkpoint builds them): an optimizer
# class of torch.optim, a schedule of transformers or torch (the loss is a registered part, by name)
BUILT_FROM = {
    "optimizer": re.compile(r"torch\.optim\.[A-Z]\w*"),
    "scheduler": re.compile(r"transformers\.(optimization\.)?get_\w*schedule\w*|torch\.optim\.lr_scheduler\.[A-Z]\w*"),
}


def check_built_targets(hparams: Mapping[str, Any], named: str) -> None:
    """What Lightning's `load_from_checkpoint` would build: the loss a registered objective (`checked_part`), the
    optimizer and scheduler `_target_`s torch's or transformers' own, by name (nothing is imported to check); else
    refused before anything is built."""
    try:
        checked_part("loss", hparams.get("loss"))
    except SentembConfigError as err:
        raise SentembConfigError(f"{named}: {err}") from None
    for part, names in BUILT_FROM.items():
        node = hparams.get(part)
        target = node.get("_target_") if isinstance(node, Mapping) else None
        if node and not (isinstance(target, str) and names.fullmatch(target)):
            raise SentembConfigError(
                f"{named}: {part}._target_={target!r} is not one of torch's optimizers or the "
                "schedules of transformers and torch: refused, nothing was built. Fix: load the encoder alone "
                "(sentemb.encoders.build.load_checkpoint_encoder), or a checkpoint written by sentemb.train"
            )


def with_warmup_steps(scheduler: Mapping[str, Any], steps: int) -> dict[str, Any]:
    """The scheduler's node with `warmup_ratio` (a share of the run's `steps`, as sentence-transformers' trainer sets
    it) turned into the `num_warmup_steps` transformers' schedules take: ceil(ratio × steps), HF Trainer's rounding."""
    node = dict(scheduler)
    ratio = node.pop("warmup_ratio", None)
    if ratio is not None:
        node["num_warmup_steps"] = math.ceil(steps * float(ratio))
    return node


def check_warmup_ratio(scheduler: Mapping[str, Any] | None) -> None:
    """scheduler.warmup_ratio, where set: a share of the steps in [0, 1], with a schedule that has warmup steps."""
    if not scheduler or scheduler.get("warmup_ratio") is None:
        return
    require_number("scheduler.warmup_ratio", scheduler["warmup_ratio"], UNIT, "e.g. scheduler.warmup_ratio=0.1")
    if "num_warmup_steps" not in scheduler:
        raise SentembConfigError(
            f"scheduler.warmup_ratio with scheduler._target_={scheduler.get('_target_')}: that schedule has no "
            "num_warmup_steps to set. Fix: transformers.get_linear_schedule_with_warmup (conf/train.yaml's), or drop it"
        )


def logging_step(trainer: L.Trainer) -> bool:
    """Whether Lightning writes this training step's metrics to the loggers (its own test, which Lightning's
    LearningRateMonitor and DeviceStatsMonitor read too): every trainer.log_every_n_steps steps, and at a stop."""
    return trainer._logger_connector.should_update_logs or bool(trainer.fast_dev_run)
