"""Negatives gathered across processes keep the gradient of the local slice (SimCSE's all_gather)."""

from __future__ import annotations

import os
import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from sentemb.losses import InfoNCE
from sentemb.training.distributed import gather_with_grad


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank: int, world: int, port: int, z1_all: torch.Tensor, z2_all: torch.Tensor, out: dict) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    n = z1_all.shape[0] // world
    z1 = z1_all[rank * n : (rank + 1) * n].clone().requires_grad_()
    z2 = z2_all[rank * n : (rank + 1) * n].clone().requires_grad_()
    g1, g2 = gather_with_grad(z1), gather_with_grad(z2)
    loss = InfoNCE()(g1, g2).loss
    loss.backward()
    out[rank] = (g1.detach(), loss.detach(), z1.grad.clone())
    dist.destroy_process_group()


def test_gather_with_grad_matches_single_process_global_batch():
    torch.manual_seed(0)
    world, n = 2, 4
    z1_all, z2_all = torch.randn(world * n, 8), torch.randn(world * n, 8)
    out = mp.Manager().dict()
    mp.spawn(_worker, args=(world, _free_port(), z1_all, z2_all, out), nprocs=world, join=True)

    reference_z1 = z1_all.clone().requires_grad_()
    reference = InfoNCE()(reference_z1, z2_all.clone().requires_grad_()).loss
    reference.backward()
    for rank in range(world):
        gathered, loss, grad = out[rank]
        assert torch.equal(gathered, z1_all), "every rank sees the global batch, in rank order"
        # another process with its own thread count may reduce in another order: float32 on O(1) values, ~1e-7
        torch.testing.assert_close(loss, reference.detach(), rtol=1e-5, atol=1e-6)
        # each rank back-propagates into its own slice only (DDP then averages the gradients)
        torch.testing.assert_close(grad, reference_z1.grad[rank * n : (rank + 1) * n], rtol=1e-5, atol=1e-6)


def _rng_worker(rank: int, world: int, port: int, out: dict) -> None:
    from sentemb.training.checkpoints import rng_states, set_rng_states

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(0)  # seed_everything: one seed on every rank
    torch.rand(10 * (rank + 1))  # dropout on each rank's own token count: the streams part
    saved = rng_states()  # a checkpoint of this step (every rank saves)
    expected = torch.rand(4)  # what this rank draws next in the uninterrupted run
    torch.manual_seed(123)  # a resumed process: another state until the checkpoint's is set
    set_rng_states(saved)
    out[rank] = (expected, torch.rand(4), len(saved["ranks"]))
    dist.destroy_process_group()


@pytest.mark.slow  # two spawned processes, ~11 s
def test_every_rank_resumes_its_own_random_stream():
    out = mp.Manager().dict()
    mp.spawn(_rng_worker, args=(2, _free_port(), out), nprocs=2, join=True)
    for rank in range(2):
        expected, resumed, saved_ranks = out[rank]
        assert saved_ranks == 2 and torch.equal(resumed, expected), f"rank {rank}"
    assert not torch.equal(out[0][0], out[1][0]), "the two ranks' streams had parted"
