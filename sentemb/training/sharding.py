"""Sharded data parallelism (`trainer=fsdp`): FSDP2's `fully_shard` through Lightning's ModelParallelStrategy.

Every process is a data-parallel rank that keeps 1/world of each weight, gradient and optimizer
state; a transformer layer's weights are all-gathered just before it runs and freed after it,
and its gradients are reduce-scattered (averaged over the ranks, as DDP averages them). Negatives
are gathered across the ranks as under DDP (`distributed.gather_with_grad`): with a
tensor-parallel size of 1 the default process group is the data-parallel group.

The units (`shard_encoder`): each transformer layer, then the backbone (unless it shares a weight
with the pooling: MNTP's lm_head tied to the embeddings), then the `SentenceEncoder` as the root,
which holds the rest (pooling, heads). FSDP gathers a unit's weights in the hooks of its
`forward`, so the encoder's training entry point `training_rows` (called instead of `forward` by
the plain step and by GradCache's chunks) is registered as a forward method too; the pooling's
`training_views` reads the rows only, never a weight. FSDP2 shards each parameter on its own, so
a LoRA adapter's trainable weights and the frozen base weights beside them in one layer need
nothing more (FSDP1's `use_orig_params`, which peft asks for, has no FSDP2 counterpart to set).
GradCache replays each chunk's backward on its own under FSDP (grad_cache.py). Checkpoints are
one file gathered on rank 0 (sentemb.training.checkpoints.GatheredCheckpoints), which
`read_checkpoint`, evaluation, export and exact resume read as they read any other.

Lightning's FSDPStrategy (FSDP1) is not used: it refuses CPU devices, so it could not be tested here.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import timedelta
from typing import Any

from lightning.fabric.plugins.collectives.torch_collective import default_pg_timeout
from lightning.pytorch.strategies import ModelParallelStrategy
from torch import nn

from sentemb.common.errors import SentembConfigError
from sentemb.encoders.models.adapters import base_model
from sentemb.training.checkpoints import GatheredCheckpoints
from sentemb.training.sharding_checks import devices_asked  # noqa: F401 - importable here as before

# this strategy's class path in conf/trainer/fsdp.yaml (trainer.strategy._target_)
STRATEGY_TARGET = "sentemb.training.sharding.FullyShardedStrategy"
# the encoder's methods that read its weights without going through `forward` (module docstring)
FORWARD_METHODS = ("training_rows",)
# precisions Lightning's ModelParallelStrategy accepts; 16-mixed's GradScaler is not among them
PRECISIONS = ("32-true", "bf16-mixed", "bf16-true", "16-true")


class FullyShardedStrategy(GatheredCheckpoints, ModelParallelStrategy):
    """Lightning's ModelParallelStrategy as FSDP alone: one data-parallel dimension over every process, and
    checkpoints gathered into one file on rank 0 (what evaluation, export and exact resume read:
    sentemb.training.checkpoints.GatheredCheckpoints)."""

    def __init__(self, process_group_backend: str | None = None, timeout: timedelta | None = default_pg_timeout):
        super().__init__(tensor_parallel_size=1, process_group_backend=process_group_backend, timeout=timeout)

    @property
    def mesh_shape(self) -> tuple[int, int]:
        """(data-parallel, tensor-parallel) sizes: every process of every node is a data-parallel rank."""
        return self.num_nodes * self.num_processes, 1

    def setup_environment(self) -> None:
        # Lightning's default data-parallel size is the node count: one node's processes would then average nothing
        self._data_parallel_size, self._tensor_parallel_size = self.mesh_shape
        super().setup_environment()


def is_sharded(trainer_cfg: Mapping[str, Any]) -> bool:
    """Whether a trainer config asks for this strategy (trainer=fsdp)."""
    strategy = trainer_cfg.get("strategy")
    return isinstance(strategy, Mapping) and strategy.get("_target_") == STRATEGY_TARGET


def check_sharding(cfg: Mapping[str, Any]) -> None:
    """trainer=fsdp: several processes, a precision FSDP2 takes; Lightning's FSDP1 (trainer.strategy=fsdp) refused."""
    trainer = cfg["trainer"]
    strategy = trainer.get("strategy")
    if isinstance(strategy, str) and strategy.startswith("fsdp"):
        raise SentembConfigError(
            f"trainer.strategy={strategy}: Lightning's FSDPStrategy (FSDP1) gets no per-layer sharding from sentemb "
            "and refuses CPU devices. Fix: trainer=fsdp (FSDP2 through Lightning's ModelParallelStrategy)"
        )
    if not is_sharded(trainer):
        return
    processes = devices_asked(trainer.get("devices")) * int(trainer.get("num_nodes") or 1)
    if processes == 1:
        raise SentembConfigError(
            f"trainer=fsdp with trainer.devices={trainer.get('devices')} and "
            f"trainer.num_nodes={trainer.get('num_nodes', 1)}: one process shards nothing. Fix: "
            "trainer.devices=2 or more (trainer.accelerator=cpu trainer.devices=2 for CPU processes), or "
            "trainer=gpu for one device"
        )
    precision = str(trainer.get("precision"))
    if precision not in PRECISIONS:
        raise SentembConfigError(
            f"trainer.precision={precision} with trainer=fsdp: Lightning's ModelParallelStrategy takes "
            f"{', '.join(PRECISIONS)} (no GradScaler). Fix: trainer.precision=bf16-mixed (32-true on GPUs without bf16)"
        )


def transformer_layers(backbone: nn.Module) -> nn.ModuleList:
    """The backbone's transformer layers (inside a peft wrapper too): decoders' `.layers`, BERT's `.encoder.layer`."""
    model = base_model(backbone)
    layers = getattr(model, "layers", None)
    if layers is None:
        layers = getattr(getattr(model, "encoder", None), "layer", None)
    if not isinstance(layers, nn.ModuleList):
        raise SentembConfigError(
            f"trainer=fsdp: {type(model).__name__} has neither .layers (the decoder families) nor "
            ".encoder.layer (BERT, RoBERTa), so its transformer layers cannot be sharded one by one. "
            "Fix: trainer=ddp, or one of those model families"
        )
    return layers


def shares_parameters(first: nn.Module, second: nn.Module) -> bool:
    """Whether two modules hold a parameter in common (a tied weight)."""
    return not {id(p) for p in first.parameters()}.isdisjoint(id(p) for p in second.parameters())


def shard_encoder(module: nn.Module, mesh: Any) -> None:
    """FSDP2 units of `module.encoder` over the data-parallel `mesh` (module docstring); then no parameter of `module`
    may be left unsharded: its gradient would not be averaged across the ranks."""
    from torch.distributed.fsdp import FSDPModule, fully_shard, register_fsdp_forward_method
    from torch.distributed.tensor import DTensor

    encoder = module.encoder
    if isinstance(encoder, FSDPModule):  # configure_model runs at every fit; the units are set once
        return
    for layer in transformer_layers(encoder.backbone):
        fully_shard(layer, mesh=mesh)
    if not shares_parameters(encoder.backbone, encoder.pooling):  # a tied weight must stay in one unit
        fully_shard(encoder.backbone, mesh=mesh)
    fully_shard(encoder, mesh=mesh)
    for method in FORWARD_METHODS:
        register_fsdp_forward_method(encoder, method)
    # FSDP makes each unit's gathered weights at its first all-gather; made under encode()'s inference mode (the dev
    # evaluation before training) they would be inference tensors that training may not update in place. One unit
    # at a time: the whole model gathered at once is what sharding is there to avoid
    for unit in [m for m in encoder.modules() if isinstance(m, FSDPModule)]:
        unit.unshard()
        unit.reshard()
    unsharded = [name for name, p in module.named_parameters() if not isinstance(p, DTensor)]
    if unsharded:
        raise RuntimeError(f"trainer=fsdp: {unsharded[0]} lies outside the encoder, so FSDP would not average it")
