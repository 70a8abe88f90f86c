"""The LightningModule: encoder → pooling (→ train-only MLP) → objective.

Built from plain config dicts (saved as hyper-parameters), so a checkpoint alone rebuilds
the exact encoder, pooling and loss it was trained with.
"""

from __future__ import annotations

import re
from typing import Any

import lightning as L
import torch
import torch.distributed as dist
from hydra.utils import instantiate

from sentemb.encoders.backbones import freeze_all_but_top_layers
from sentemb.encoders.encoder import SentenceEncoder
from sentemb.encoders.pooling import TrainingViews
from sentemb.grad_cache import GradCache
from sentemb.losses import LossOutput
from sentemb.resume import rng_states, set_rng_states
from sentemb.run_record import TrainingDiverged

# checkpoints written before the encoder parts moved into sentemb/encoders/ name them by their old modules
MOVED_TARGET = re.compile(r"^sentemb\.(backbones|encoder|pooling|prompt|hicl|sarcse)\.")


def current_targets(node: Any) -> Any:
    """`node` with every `_target_` of a moved module renamed (sentemb.pooling.X → sentemb.encoders.pooling.X)."""
    if isinstance(node, dict):
        return {
            k: MOVED_TARGET.sub(r"sentemb.encoders.\1.", v) if k == "_target_" else current_targets(v)
            for k, v in node.items()
        }
    return node


def build_encoder(model: dict, pooling: dict, head: dict | None = None) -> SentenceEncoder:
    """Backbone + tokenizer from `model`, pooling from `pooling` (sized to the backbone), optional `head`.

    A head that makes the sentence vector itself (SARCSE) takes the pooling's place, or with HiCL
    the place of the per-segment pooling.
    """
    model, pooling, head = current_targets(model), current_targets(pooling), current_targets(head)
    dropout = model.get("dropout")  # checked by prepare_run
    # dropout is SimCSE's augmentation: model.dropout sets the hidden and attention dropout of any BERT/RoBERTa
    overrides = {} if dropout is None else {"hidden_dropout_prob": dropout, "attention_probs_dropout_prob": dropout}
    backbone = instantiate(model["backbone"], **overrides)
    if model.get("trainable_layers") is not None:  # checked by prepare_run
        freeze_all_but_top_layers(backbone, model["trainable_layers"])
    tokenizer = instantiate(model["tokenizer"])
    size = backbone.config.hidden_size
    pooler = instantiate(pooling, hidden_size=size)
    if head:
        vectoriser = instantiate(head, hidden_size=size)
        vectoriser.bind_tokenizer(tokenizer)
        pooler = pooler.with_head(vectoriser)
    return SentenceEncoder(backbone, tokenizer, pooler)


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


class SentembModule(L.LightningModule):
    def __init__(
        self,
        model: dict[str, Any],
        pooling: dict[str, Any],
        loss: dict[str, Any],
        optimizer: dict[str, Any],
        scheduler: dict[str, Any] | None = None,
        gather_negatives: bool = True,
        head: dict[str, Any] | None = None,
        grad_cache: int | None = None,
    ) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.encoder = build_encoder(model, pooling, head)
        self.loss = instantiate(loss)
        self.gather_negatives = gather_negatives
        self.grad_cache = GradCache(grad_cache) if grad_cache else None
        # from_pretrained returns the backbone in eval mode and Lightning keeps submodule modes:
        # without this, dropout is off and the two views are identical (no SimCSE at all)
        self.train()

    def on_fit_start(self) -> None:
        self.encoder.pooling.prepare_training(self.encoder.tokenizer)  # e.g. SARCSE's corpus token frequencies

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
        world = world_size() if self.gather_negatives else 1
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
        rows = self.grad_cache.cached_rows(self.encoder, self.encoder.training_batch(batch))
        return self.encoder.pooling.training_views(rows, batch["input_ids"].shape[0])

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

    def configure_optimizers(self) -> dict[str, Any]:
        trainable = [p for p in self.parameters() if p.requires_grad]  # model.trainable_layers freezes the rest
        optimizer = instantiate(self.hparams.optimizer)(params=trainable)
        if not self.hparams.scheduler:
            return {"optimizer": optimizer}
        scheduler = instantiate(self.hparams.scheduler)(
            optimizer, num_training_steps=int(self.trainer.estimated_stepping_batches)
        )
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}
