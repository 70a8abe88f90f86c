"""One DDP step (2 CPU processes, gloo) equals one process on the concatenated batch: loss and every gradient."""

from __future__ import annotations

import os
import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.utils.data import DistributedSampler

from sentemb.common.hydra_plumbing import resolved_container
from sentemb.training.module import SentembModule
from tests.conftest import compose_train

# one loss of each form the gather must keep exact, each with why it is in the sample
LOSSES = {
    "infonce": "a softmax over the gathered negatives",
    "focal": "a re-weighted softmax",
    "mmhe": "a modified uniformity over the gathered batch",
    "mbarlow": "a modified cross-correlation",
    "vicreg": "a variance and covariance of the gathered batch",
}
# GradCache under DDP: the cached rows are gathered, each rank replays its own chunks (2 sentences each here)
GRAD_CACHE = {"infonce+grad_cache": ["loss=infonce"], "mean+mbarlow+grad_cache": ["pooling=mean", "loss=mbarlow"]}
SENTENCES = [
    "a man is playing a guitar .", "the cat sits on the mat", "two dogs run through a field of grass",
    "a woman slices an onion", "stocks fell sharply on monday", "hi", "the weather is nice today",
    "children are playing football in the park near the school",
]  # fmt: skip


class StepLoss(nn.Module):
    """What Lightning's DDP wrapper does: the wrapped forward is the training step."""

    def __init__(self, module: SentembModule) -> None:
        super().__init__()
        self.module = module

    def forward(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        backward, total, _ = self.module.step_loss(batch)
        return backward, total


def build(configs) -> SentembModule:
    """The module of a composed config, or of its resolved parts (what the worker processes are sent)."""
    torch.manual_seed(0)  # the same weights in every process
    return SentembModule.from_config(configs)


def gradients(module: SentembModule) -> dict[str, torch.Tensor]:
    return {name: p.grad.detach().clone() for name, p in module.named_parameters() if p.grad is not None}


def _worker(rank: int, world: int, port: int, configs: dict, batch: dict, out: dict) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.set_num_threads(1)
    n = batch["input_ids"].shape[0] // world
    local = {k: v[rank * n : (rank + 1) * n] for k, v in batch.items()}
    for name, config in configs.items():
        module = build(config)
        ddp = nn.parallel.DistributedDataParallel(StepLoss(module))  # kept alive: its reducer runs in backward
        backward, total = ddp(local)
        module.backward(backward)  # DDP averages the ranks' gradients here (GradCache: after its replay)
        out[(rank, name)] = (total.detach(), gradients(module))
    dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rank_rows(batch: dict[str, torch.Tensor], rank: int, world: int) -> dict[str, torch.Tensor]:
    """This rank's slice of a global batch (DistributedSampler's contiguous share)."""
    n = batch["input_ids"].shape[0] // world
    return {k: v[rank * n : (rank + 1) * n] for k, v in batch.items()}


def spawned(worker, *args) -> dict:
    """`worker(rank, 2, port, *args, out)` in 2 gloo processes; what they put in `out`."""
    out = mp.Manager().dict()
    mp.spawn(worker, args=(2, _free_port(), *args, out), nprocs=2, join=True)
    return dict(out)


@pytest.fixture(scope="module")
def configs(tmp_path_factory) -> dict[str, dict]:
    out = {}
    variants = {name: [f"loss={name}"] for name in LOSSES} | GRAD_CACHE
    for name, overrides in variants.items():
        cfg = compose_train(["model=tiny", "model.dropout=0.0", *overrides], tmp_path_factory.mktemp(name))
        keys = ("model", "pooling", "loss", "optimizer", "scheduler")
        out[name] = {key: resolved_container(cfg[key]) for key in keys}
        out[name]["grad_cache"] = 2 if name in GRAD_CACHE else None
    return out


@pytest.mark.slow  # two spawned gloo processes (make test-slow)
def test_ddp_step_equals_one_process_on_the_global_batch(configs):
    reference = build(configs["infonce"])
    assert_ddp_equals_one_process(
        configs, dict(reference.encoder.tokenizer(SENTENCES, padding=True, return_tensors="pt"))
    )


def assert_ddp_equals_one_process(configs: dict, batch: dict) -> None:
    """Each config's step on 2 gloo processes (half the batch each) equals the plain step on the whole batch."""
    out = mp.Manager().dict()
    mp.spawn(_worker, args=(2, _free_port(), configs, batch, out), nprocs=2, join=True)
    for name, config in configs.items():
        single = build({**config, "grad_cache": None})  # the plain step on the global batch
        backward, total, _ = single.step_loss(batch)
        backward.backward()
        expected = gradients(single)
        for rank in (0, 1):
            loss, grads = out[(rank, name)]
            # other batch shapes (4 vs 8 rows) and DDP's all-reduce order: float32 apart by ~1e-7, asked: 1e-5
            torch.testing.assert_close(loss, total.detach(), rtol=1e-5, atol=1e-5, msg=f"{name} loss, rank {rank}")
            assert grads.keys() == expected.keys(), name
            for param, grad in grads.items():
                torch.testing.assert_close(
                    grad, expected[param], rtol=1e-5, atol=1e-5, msg=lambda m, p=param: f"{p}: {m}"
                )


def test_model_dropout_sets_every_dropout_and_zero_makes_the_views_equal(tmp_path):
    from sentemb.common.errors import SentembConfigError
    from sentemb.training.checks import prepare_run

    def module(dropout: str) -> SentembModule:
        cfg = compose_train(["model=tiny", f"model.dropout={dropout}"], tmp_path)
        return build(cfg)

    heavy = module("0.3")
    assert heavy.encoder.backbone.config.hidden_dropout_prob == 0.3
    assert heavy.encoder.backbone.config.attention_probs_dropout_prob == 0.3
    assert all(m.p == 0.3 for m in heavy.modules() if isinstance(m, nn.Dropout))
    batch = dict(heavy.encoder.tokenizer(SENTENCES[:4], padding=True, return_tensors="pt"))
    views = module("0.0").encoder.training_views(batch)
    # the same rows at other positions of one doubled batch: float32 GEMM edge blocks may round apart, ~1e-7
    torch.testing.assert_close(views.z1, views.z2, rtol=1e-6, atol=1e-6)
    noisy = heavy.encoder.training_views(batch)
    assert not torch.allclose(noisy.z1, noisy.z2), "dropout 0.3: the two views differ"
    with pytest.raises(SentembConfigError, match=r"model.dropout=1.5 must be a number in \[0, 1\)"):
        prepare_run(compose_train(["model=tiny", "model.dropout=1.5"], tmp_path))


def test_ddp_training_drops_the_ragged_last_batch(small_corpus, tmp_path):
    from types import SimpleNamespace

    from hydra.utils import instantiate

    cfg = compose_train(["model=tiny", f"data.corpus={small_corpus}", "data.batch_size=64"], tmp_path)
    from sentemb.encoders.part_configs import build_part

    data = instantiate(cfg.data, tokenizer=build_part("model.tokenizer", cfg.model.tokenizer))
    data.setup("fit")
    assert not data.train_dataloader().drop_last, "one process keeps every sentence"
    data.trainer = SimpleNamespace(world_size=2, global_rank=1)
    loader = data.train_dataloader()
    assert loader.drop_last, "every rank must gather equally many embeddings"
    # the rank's share comes from a DistributedSampler made by the datamodule (Lightning keeps such a loader)
    assert isinstance(loader.sampler, DistributedSampler) and (loader.sampler.rank, loader.sampler.num_replicas) == (
        1,
        2,
    )
    assert [len(batch["input_ids"]) for batch in loader] == [64, 64], "298 sentences: 149 a rank, 2 full batches"


def test_several_visible_gpus_with_a_single_device_trainer_warn(tmp_path, monkeypatch):
    from sentemb.training.trainer import build_trainer

    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    cfg = compose_train(["model=tiny", "trainer=cpu", "logger=none", "callbacks=none"], tmp_path)
    with pytest.warns(UserWarning, match="4 GPUs are visible but the trainer uses one: pass trainer=ddp"):
        build_trainer(cfg)
