"""The LightningModule: encoder → pooling (→ train-only MLP) → objective.

Built from plain config dicts (saved as hyper-parameters), so a checkpoint alone rebuilds
the exact encoder, pooling and loss it was trained with.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import lightning as L
import torch
from hydra.utils import instantiate
from lightning.pytorch.plugins.precision import MixedPrecision, Precision
from lightning.pytorch.utilities import GradClipAlgorithmType
from omegaconf import DictConfig

from sentemb.common.errors import TrainingDiverged
from sentemb.common.hydra_plumbing import resolved_container
from sentemb.encoders.build import build_encoder
from sentemb.encoders.pooling import TrainingViews
from sentemb.losses import LossOutput
from sentemb.training.distributed import gather_with_grad, world_size
from sentemb.training.grad_cache import GradCache
from sentemb.training.resume import rng_states, set_rng_states

log = logging.getLogger(__name__)


class SentembModule(L.LightningModule):
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
    ) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.encoder = build_encoder(model, pooling, head)
        if compile:  # in place: parameter names (and checkpoints) stay those of the eager backbone
            self.encoder.backbone.compile(dynamic=True)  # dynamic: every batch packs another number of tokens
        self.loss = instantiate(loss)
        self.grad_cache = GradCache.from_config(grad_cache)  # null, a sentence count, or {sentences, tokens}
        # from_pretrained returns the backbone in eval mode and Lightning keeps submodule modes:
        # without this, dropout is off and the two views are identical (no SimCSE at all)
        self.train()

    @classmethod
    def from_config(cls, cfg: DictConfig | Mapping[str, Any]) -> SentembModule:
        """The module of a composed train config (conf/train.yaml), or of its parts already resolved: the one way
        train, tests and benchmarks build it."""
        parts = ("model", "pooling", "loss", "optimizer", "scheduler", "head")
        parts = {key: resolved_container(cfg.get(key)) for key in parts}
        return cls(**parts, grad_cache=resolved_container(cfg.get("grad_cache")), compile=bool(cfg.get("compile")))

    def on_fit_start(self) -> None:
        self.encoder.pooling.prepare_training(self.encoder.tokenizer)  # e.g. SARCSE's corpus token frequencies
        total = sum(p.numel() for p in self.parameters())
        trainable = sum(p.numel() for p in self.parameters() if p.requires_grad)
        if self._trainer is None or self.trainer.is_global_zero:  # one line per job, not per rank
            log.info(
                f"model: {type(self.encoder.backbone).__name__} + {type(self.encoder.pooling).__name__}, "
                f"{total / 1e6:.1f} M parameters, {trainable / 1e6:.1f} M trained; loss: {type(self.loss).__name__}"
            )

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        checkpoint["rng_states"] = rng_states()  # resumes draw the dropout masks the uninterrupted run would have

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        if self._trainer is not None and "rng_states" in checkpoint:  # resuming a fit, not loading for evaluation
            set_rng_states(checkpoint["rng_states"])

    def step_loss(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
        """(loss to back-propagate, loss to log, logged parts) of one training batch.

        Under DDP with gathered negatives every rank computes the global batch's loss but
        back-propagates only into its own slice, and DDP then averages the ranks' gradients: the
        update would be 1/world_size of one process's on the concatenated batch. The gathered loss
        is therefore scaled by world_size for backward, so the averaged gradient is exactly that
        one process's. Auxiliary terms are per-rank means over local data, which DDP's average turns
        into the mean over ranks: for SARCSE's reconstruction that is the global mean; HiCL's local
        loss takes its negatives among the rank's own segments (not gathered).
        """
        views = self.training_views(batch)
        z1, z2 = views.z1, views.z2
        world = world_size()
        if world > 1:
            z1, z2 = gather_with_grad(z1), gather_with_grad(z2)
        output: LossOutput = self.loss(z1, z2)
        total = output.loss if views.global_weight == 1.0 else views.global_weight * output.loss
        backward = total * world if world > 1 else total
        logged = {}
        for label, (weight, value) in views.auxiliary.items():  # e.g. HiCL: α·L_local + (1 − α)·L_global
            total = total + weight * value
            backward = backward + weight * value
            logged[f"train/loss/{label}"] = value.detach()
        if views.auxiliary:
            logged["train/loss/global"] = output.loss.detach()
        if not torch.isfinite(total.detach()):  # fp16 overflow, a tiny τ: stop here, not with NaN weights later
            raise TrainingDiverged(
                f"training diverged at step {self.global_step}: train/loss = {total.item()} "
                f"({type(self.loss).__name__}). Fix: a larger loss.tau, a smaller optimizer.lr, or "
                "trainer.precision=32-true / bf16-mixed instead of 16-mixed"
            )
        # each term of a weighted sum, and the paradigm's telemetry (Figures 7–9), every step
        logged.update({f"train/loss/{label}": value for label, value in output.terms.items()})
        logged.update({f"paradigm/{name}": value for name, value in output.stats.items()})
        return backward, total, logged

    def training_views(self, batch: dict[str, torch.Tensor]) -> TrainingViews:
        """Both dropout views (unsup. SimCSE); with grad_cache, built from cached chunk outputs (grad_cache.py)."""
        if self.grad_cache is None:
            return self.encoder.training_views(batch)
        prepared = self.encoder.training_batch(batch)
        rows = self.grad_cache.cached_rows(self.encoder, prepared)
        return self.encoder.pooling.training_views(rows, prepared, batch["input_ids"].shape[0])

    def backward(self, loss: torch.Tensor, *args: Any, **kwargs: Any) -> None:
        """Lightning's backward (the loss arrives already scaled under 16-mixed); GradCache then replays its chunks."""
        super().backward(loss, *args, **kwargs)
        if self.grad_cache is not None and self.grad_cache.pending is not None:
            self.grad_cache.replay_backward(self.encoder, distributed=world_size() > 1)

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        n = batch["input_ids"].shape[0]
        backward, total, logged = self.step_loss(batch)
        self.log("train/loss", total, prog_bar=True, batch_size=n)
        if logged:
            self.log_dict(logged, batch_size=n)
        return backward

    def on_before_optimizer_step(self, optimizer: torch.optim.Optimizer) -> None:
        """A non-finite gradient stops training with the step and parameter named, before it reaches the weights.

        Under 16-mixed the gradients arrive unscaled here, and inf/NaN is the GradScaler's overflow
        signal (it skips the step and lowers the scale), so it is left to the scaler; a non-finite
        loss still stops such a run (`step_loss`).
        """
        if self.trainer.precision == "16-mixed":
            return
        named = [(name, p.grad) for name, p in self.named_parameters() if p.grad is not None]
        if not named or torch.isfinite(torch.nn.utils.get_total_norm([g for _, g in named])):
            return
        name = next(name for name, grad in named if not torch.isfinite(grad).all())
        raise TrainingDiverged(
            f"training diverged at step {self.global_step}: the gradient of {name} is not finite "
            f"(train/loss was finite). Fix: a smaller optimizer.lr, a larger loss.tau, or trainer.precision=32-true"
        )

    def configure_gradient_clipping(
        self,
        optimizer: torch.optim.Optimizer,
        gradient_clip_val: float | None = None,
        gradient_clip_algorithm: str | None = None,
    ) -> None:
        """Lightning's clipping, except under bf16-mixed, whose AMP plugin refuses any fused optimizer although
        without a GradScaler the gradients it would clip are not scaled: there the plain clipping runs."""
        plugin = self.trainer.precision_plugin
        if gradient_clip_val and isinstance(plugin, MixedPrecision) and plugin.scaler is None:
            algorithm = GradClipAlgorithmType(gradient_clip_algorithm or "norm")
            Precision.clip_gradients(plugin, optimizer, gradient_clip_val, algorithm)
            return
        super().configure_gradient_clipping(optimizer, gradient_clip_val, gradient_clip_algorithm)

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
        scheduler = instantiate(self.hparams.scheduler)(
            optimizer, num_training_steps=int(self.trainer.estimated_stepping_batches)
        )
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}
