"""ESimCSE's momentum contrast: the EMA, the queue's order and contents, the step's order, state, refusals, resume."""

from __future__ import annotations

import copy
import os

import pytest
import torch
import torch.distributed as dist

from sentemb.common.errors import SentembConfigError
from sentemb.common.hydra_plumbing import resolved_container
from sentemb.training.checks import check_parts
from sentemb.training.module import SentembModule
from sentemb.training.momentum import MomentumQueue, ema_update, sentence_keys
from tests.conftest import compose_train
from tests.test_ddp_gradients import StepLoss, rank_rows, spawned
from tests.test_resume import resumed_losses, stopped_and_resumed

SENTENCES = [
    "a man is playing a guitar .", "the cat sits on the mat", "two dogs run through a field of grass",
    "a woman slices an onion", "stocks fell sharply on monday", "hi", "the weather is nice today",
    "children are playing football in the park near the school",
]  # fmt: skip
PARTS = ("model", "pooling", "loss", "optimizer", "scheduler", "negatives", "soft_negatives")


def module_of(overrides: list[str], tmp_path) -> SentembModule:
    torch.manual_seed(0)  # the same weights wherever it is built
    cfg = compose_train(["model=tiny", "negatives=momentum", "negatives.queue_size=6", *overrides], tmp_path)
    return SentembModule.from_config(cfg)


def tokens(module: SentembModule, sentences: list[str]) -> dict[str, torch.Tensor]:
    return dict(module.encoder.tokenizer(sentences, padding=True, return_tensors="pt"))


def test_the_momentum_update_is_the_ema_formula_bit_for_bit():
    gen = torch.Generator().manual_seed(0)
    online = [torch.randn(5, 3, generator=gen), torch.randn(7, generator=gen)]
    momentum = [torch.randn(5, 3, generator=gen), torch.randn(7, generator=gen)]
    before = [p.clone() for p in momentum]
    ema_update(momentum, online, 0.995)
    for new, old, theta in zip(momentum, before, online, strict=True):
        # ξ ← m·ξ + (1 − m)·θ, the same three float32 operations: equal, not close
        assert torch.equal(new, old * 0.995 + theta * (1.0 - 0.995))


def test_the_momentum_encoder_follows_the_online_one_and_starts_as_its_copy(tmp_path):
    module = module_of([], tmp_path)
    online, xi = module.encoder.backbone, module.negatives.backbone
    assert all(torch.equal(a, b) for a, b in zip(online.parameters(), xi.parameters(), strict=True))
    assert not any(p.requires_grad for p in xi.parameters()), "ξ is never trained by the optimizer"
    assert not xi.training, "ξ encodes without dropout"
    with torch.no_grad():
        for p in online.parameters():
            p.add_(0.5)
    expected = {name: p.clone() * 0.995 + dict(online.named_parameters())[name] * (1.0 - 0.995)
                for name, p in xi.named_parameters()}  # fmt: skip
    module.negatives.update(online)
    for name, p in xi.named_parameters():
        assert torch.equal(p, expected[name]), name


def test_reference_convention_starts_the_momentum_encoder_at_random(tmp_path):
    module = module_of(["negatives.convention=reference"], tmp_path)
    online, xi = module.encoder.backbone, module.negatives.backbone
    # the matrices are drawn anew (normal, std 0.02); LayerNorm's 1 and 0 are what any initialisation gives
    pairs = [(a, b) for a, b in zip(online.parameters(), xi.parameters(), strict=True) if a.dim() == 2]
    assert pairs and all(not torch.equal(a, b) for a, b in pairs), "the released code's ξ is newly initialised"


def test_the_queue_is_fifo_of_the_newest_k_and_leaves_out_the_batchs_own_sentences():
    queue = MomentumQueue(queue_size=5)
    rows = torch.arange(8, dtype=torch.float32)[:, None].repeat(1, 3)
    ids = torch.arange(100, 108)
    queue.enqueue(rows[:3], ids[:3])
    queue.enqueue(rows[3:7], ids[3:7])
    assert queue.queue[:, 0].tolist() == [2, 3, 4, 5, 6]  # cat(Q, new)[−K:], oldest first
    kept = queue.negatives(torch.tensor([104, 999]))  # sentence 104 is in this batch: not its own negative
    assert kept[:, 0].tolist() == [2, 3, 5, 6]
    assert torch.equal(queue.negatives(torch.tensor([999])), queue.queue)


def test_sentence_keys_ignore_padding_on_either_side():
    ids = torch.tensor([[5, 6, 7, 0], [0, 5, 6, 7], [5, 6, 8, 0]])
    mask = torch.tensor([[1, 1, 1, 0], [0, 1, 1, 1], [1, 1, 1, 0]])
    keys = sentence_keys(ids, mask).tolist()
    assert keys[0] == keys[1] != keys[2]


def test_a_step_uses_the_old_queue_then_enqueues_the_momentum_keys_of_its_anchors(tmp_path, monkeypatch):
    module = module_of(["model.dropout=0.0"], tmp_path)
    first, second = tokens(module, SENTENCES[:4]), tokens(module, SENTENCES[4:])
    seen = []
    original = type(module.loss).forward
    monkeypatch.setattr(
        type(module.loss),
        "forward",
        lambda self, z1, z2, negatives=None: seen.append(negatives) or original(self, z1, z2, negatives=negatives),
    )
    module.step_loss(first)
    assert seen[0] is None, "an empty queue: plain InfoNCE on the first step"
    with torch.no_grad():  # ξ (eval, no dropout) through the online pooling and its train-only MLP
        expected = module.encoder(first, train_head=True, backbone=module.negatives.backbone)
    torch.testing.assert_close(module.negatives.queue, expected, rtol=0, atol=0)  # the same computation
    queue_before = module.negatives.queue.clone()
    module.step_loss(second)
    assert torch.equal(seen[1], queue_before), "the loss sees the queue as it stood before the step"
    assert module.negatives.queue.shape[0] == 6 and torch.equal(module.negatives.queue[:2], queue_before[2:])
    # a second epoch: the same sentences again are left out of their own negatives (2 of them are still queued)
    queue_before = module.negatives.queue.clone()
    module.step_loss(first)
    assert torch.equal(seen[2], queue_before[2:]), "the queued keys of these very sentences are not their negatives"


def test_the_queue_adds_negatives_to_the_loss(tmp_path):
    module = module_of(["model.dropout=0.0"], tmp_path)
    batch = tokens(module, SENTENCES[:4])
    module.step_loss(tokens(module, SENTENCES[4:]))  # fills the queue with 4 other sentences
    views = module.training_views(batch)
    plain = module.loss(views.z1, views.z2).loss
    with_queue = module.loss(views.z1, views.z2, negatives=module.negatives.queue).loss
    assert with_queue > plain, "more negatives in the denominator: a larger InfoNCE"


@pytest.mark.parametrize(
    ("overrides", "reason"),
    [
        (["loss=barlow"], "no negatives' denominator"),
        (["loss=vicreg"], "loss=vicreg"),
        (["loss=align_mhe"], "loss=align_mhe"),
        (["loss=mmhe"], "loss=mmhe"),
        (["loss=paradigm", "loss.convention=reference"], "convention=reference"),
        (["negatives.convention=reference", "adapter=lora"], "frozen base"),
        (["negatives.queue_size=0"], "negatives.queue_size"),
        (["negatives.momentum=1.5"], "negatives.momentum"),
    ],
)
def test_refused_combinations_name_their_reason_before_any_model_loads(
    overrides, reason, tmp_path, forbid_model_loading
):
    cfg = compose_train(["model=tiny", "negatives=momentum", *overrides], tmp_path)
    with pytest.raises(SentembConfigError, match=reason):
        check_parts(cfg)


def test_every_loss_with_a_negatives_denominator_trains_with_the_queue(tmp_path):
    for loss in ("infonce", "focal", "arccon", "mpt", "met", "mat", "paradigm"):
        cfg = compose_train(["model=tiny", "negatives=momentum", f"loss={loss}"], tmp_path / loss)
        check_parts(cfg)
        module = SentembModule.from_config(cfg)
        module.step_loss(tokens(module, SENTENCES[:4]))
        backward, _, _ = module.step_loss(tokens(module, SENTENCES[4:]))
        assert torch.isfinite(backward), loss


def test_the_checkpoint_holds_the_momentum_encoder_and_the_queue(tmp_path):
    module = module_of([], tmp_path)
    module.step_loss(tokens(module, SENTENCES[:4]))
    state = module.state_dict()
    assert "negatives._extra_state" in state and torch.equal(state["negatives._extra_state"]["queue"],
                                                              module.negatives.queue)  # fmt: skip
    assert any(key.startswith("negatives.backbone.") for key in state)
    restored = module_of([], tmp_path / "again")
    restored.load_state_dict(copy.deepcopy(state))
    assert torch.equal(restored.negatives.queue, module.negatives.queue)
    assert not any(key.startswith("negatives") for key in module.encoder.state_dict()), "exports hold θ only"


def test_an_adapter_run_saves_only_the_momentum_copies_of_its_trained_weights(tmp_path):
    module = module_of(["adapter=lora"], tmp_path)
    kept = module.trained_keys()
    momentum = {key for key in kept if key.startswith("negatives.backbone.")}
    assert momentum and all("lora_" in key for key in momentum), "ξ's copies of the LoRA weights only"
    assert "negatives._extra_state" in kept
    shared = [p for p in module.negatives.backbone.parameters() if p.requires_grad is False]
    base = {id(p) for p in module.encoder.backbone.parameters() if not p.requires_grad}
    assert any(id(p) in base for p in shared), "the frozen base is shared with θ, not copied"


@pytest.fixture
def esimcse(tiny_overrides) -> list[str]:
    # mid-epoch, dropout on, dev every 3 steps; a queue of 40 (2.5 × 16) filled from step 2 on
    return [*tiny_overrides, "trainer.max_steps=6", "eval.every_n_steps=3", "negatives=momentum",
            "negatives.queue_size=40", "data.dup_rate=0.32"]  # fmt: skip


@pytest.mark.slow  # three training runs (make test-slow); the state's round trip is tested above in make test
def test_a_resumed_esimcse_run_equals_the_uninterrupted_run(esimcse, tmp_path, monkeypatch):
    full, resumed, last = stopped_and_resumed(esimcse, tmp_path, monkeypatch, stop_after=3)
    saved = torch.load(last, map_location="cpu", weights_only=True)["state_dict"]
    assert saved["negatives._extra_state"]["queue"].shape[0] == 40, "3 steps of 16 keys, the newest 40 kept"
    losses, resumed_run = resumed_losses(tmp_path)
    # the same computation on bit-identical weights, ξ, queue, optimizer, data position and RNG: equal, not close
    assert len(losses) == 6 and resumed_run == losses
    assert full["stsb/test/spearman"] == resumed["stsb/test/spearman"]


# ---- DDP: 2 gloo processes with the queue equal one process on the concatenated batch


def _worker(rank: int, world: int, port: int, config: dict, batches: list, out: dict) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.set_num_threads(1)
    torch.manual_seed(0)
    module = SentembModule.from_config(config)
    ddp = torch.nn.parallel.DistributedDataParallel(StepLoss(module))
    for step, batch in enumerate(batches):
        module.zero_grad()
        backward, total = ddp(rank_rows(batch, rank, world))
        module.backward(backward)
        grads = {name: p.grad.clone() for name, p in module.named_parameters() if p.grad is not None}
        out[(rank, step)] = (total.detach(), grads, module.negatives.queue.clone())
    dist.destroy_process_group()


@pytest.mark.slow  # two spawned gloo processes (make test-slow)
def test_ddp_with_the_queue_equals_one_process_on_the_concatenated_batch(tmp_path):
    cfg = compose_train(["model=tiny", "model.dropout=0.0", "negatives=momentum", "negatives.queue_size=12"], tmp_path)
    config = {key: resolved_container(cfg.get(key)) for key in PARTS}
    torch.manual_seed(0)
    single = SentembModule.from_config(config)
    batches = [tokens(single, SENTENCES), tokens(single, SENTENCES[::-1]), tokens(single, SENTENCES[2:6] * 2)]
    out = spawned(_worker, config, batches)
    for step, batch in enumerate(batches):
        single.zero_grad()
        backward, total, _ = single.step_loss(batch)
        backward.backward()
        expected = {name: p.grad for name, p in single.named_parameters() if p.grad is not None}
        for rank in (0, 1):
            loss, grads, queue = out[(rank, step)]
            # other batch shapes (4 vs 8 rows) and DDP's all-reduce order: float32 apart by ~1e-7, asked: 1e-5
            torch.testing.assert_close(loss, total.detach(), rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(queue, single.negatives.queue, rtol=1e-5, atol=1e-5)
            for name, grad in grads.items():
                torch.testing.assert_close(grad, expected[name], rtol=1e-5, atol=1e-5, msg=name)


@pytest.mark.parametrize("option", ["grad_cache=3", "model.padding_free=false"])
def test_grad_cache_and_padded_batches_give_the_plain_step_with_the_queue(option, tmp_path):
    """GradCache's chunks and padded batches compose with the queue: the same loss, gradients and queue as the
    default step (padding-free, one forward)."""

    def two_steps(extra: list[str]) -> tuple[torch.Tensor, dict[str, torch.Tensor], torch.Tensor]:
        module = module_of(["model.dropout=0.0", "data.dup_rate=0.32", *extra], tmp_path / str(len(extra)))
        module.step_loss(tokens(module, SENTENCES[4:]))  # fills the queue
        backward, total, _ = module.step_loss(tokens(module, SENTENCES[:4]))
        if module.grad_cache is not None:
            module.backward(backward)  # the loss's backward, then GradCache's replay of its chunks
        else:
            backward.backward()
        grads = {n: p.grad.clone() for n, p in module.named_parameters() if p.grad is not None}
        return total.detach(), grads, module.negatives.queue.clone()

    (loss, grads, queue), (loss2, grads2, queue2) = two_steps([]), two_steps([option])
    # other chunk and padding shapes: float32 apart by ~1e-7
    torch.testing.assert_close(loss2, loss, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(queue2, queue, rtol=1e-5, atol=1e-6)
    assert grads.keys() == grads2.keys()
    for name in grads:  # the embeddings' gradients sum every token's row in another order: ~2e-6 apart on ~0.1
        torch.testing.assert_close(grads2[name], grads[name], rtol=1e-5, atol=1e-5, msg=name)


@pytest.mark.slow  # CLI subprocesses (make test-slow)
def test_sigterm_after_step_3_then_the_same_command_ends_as_the_uninterrupted_esimcse_run(small_corpus, tmp_path):
    from tests.test_preemption import KILL_AT_3, losses, record, train_command

    job = ["model=tiny", "logger=csv", f"data.corpus={small_corpus}", "data.batch_size=16", "trainer.max_steps=6",
           "eval.every_n_steps=2", "eval.at_start=false", "trainer.log_every_n_steps=1", "negatives=momentum",
           "negatives.queue_size=40", "data.dup_rate=0.32"]  # fmt: skip
    train_command(job, tmp_path / "full")
    run_dir = tmp_path / "preempted"
    train_command([*job, *KILL_AT_3], run_dir, expect=128 + 15)  # SIGTERM's shell status
    saved = torch.load(run_dir / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)
    assert saved["global_step"] == 3 and saved["state_dict"]["negatives._extra_state"]["queue"].shape[0] == 40
    train_command([*job, *KILL_AT_3], run_dir)  # the same command resumes by itself
    assert record(run_dir)["status"] == "ok"
    # bit-identical weights, ξ, queue, optimizer, data position and RNG: equal, not close
    assert losses(run_dir) == losses(tmp_path / "full") and len(losses(run_dir)) == 6
    assert (
        record(run_dir)["metrics"]["stsb/test/spearman"] == record(tmp_path / "full")["metrics"]["stsb/test/spearman"]
    )


def test_a_sweep_over_losses_with_the_queue_is_refused_before_its_first_job(tmp_path):
    """The sweep check runs the same pre-run checks on every job's config (no Hydra run folder set there)."""
    from tests.test_entry_checks import sweep_refused

    message = sweep_refused(["model=tiny", "negatives=momentum"], ["loss=infonce,barlow"], tmp_path)
    assert "loss=barlow" in message and "no negatives' denominator" in message
