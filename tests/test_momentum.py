"""ESimCSE's momentum contrast: the EMA, the queue's order and contents, the step's order, state, refusals, resume."""

from __future__ import annotations

import copy
import math
import os
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from sentemb.common.errors import SentembConfigError
from sentemb.common.hydra_plumbing import resolved_container
from sentemb.losses import build
from sentemb.losses.registry import negatives_losses
from sentemb.training.checks import check_parts, prepare_run
from sentemb.training.module import SentembModule
from sentemb.training.negatives.base import check_resumed_negatives
from sentemb.training.negatives.ema import ema_update
from sentemb.training.negatives.momentum import MomentumQueue, sentence_keys
from tests.conftest import compose_train
from tests.test_ddp_gradients import StepLoss, rank_rows, spawned
from tests.test_resume import resumed_losses, stopped_and_resumed

SENTENCES = [
    "a man is playing a guitar .", "the cat sits on the mat", "two dogs run through a field of grass",
    "a woman slices an onion", "stocks fell sharply on monday", "hi", "the weather is nice today",
    "children are playing football in the park near the school",
]  # fmt: skip
PARTS = ("model", "pooling", "loss", "optimizer", "scheduler", "negatives", "auxiliary")


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
        lambda self, inputs: seen.append(inputs.extra) or original(self, inputs),  # the loss's extra negatives
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
    with_queue = module.loss(views.z1, views.z2, extra=module.negatives.queue).loss
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
        (["negatives.queue_size=100000000"], "negatives.queue_size=100000000 must be a whole number from 1 to 65536"),
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
    for loss in negatives_losses():
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
def test_a_resumed_esimcse_run_equals_the_uninterrupted_run(esimcse, tmp_path):
    full, resumed, last = stopped_and_resumed(esimcse, tmp_path, stop_after=3)
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


# ---- convention=reference against the released code (caskcsg/sentemb @5eeec55103c1da738761bf8c6a9c085c6ad1c9a1)


def released_esimcse_losses(
    steps: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]], neg_size: int, temp: float
) -> tuple[list[float], torch.Tensor]:
    """The released queue and loss, restated as a loop over one epoch's steps (z1, z2, eval_z): ESimCSE/esimcse/
    trainers.py, `train` line 452 (`self.pre_z1=None` at each epoch) and `compute_loss` lines 619-636 (the loss with
    the queue as it stood, then `pre_z1 = eval_z.clone()` when None, else `cat((pre_z1, eval_z))[-neg_size:]`);
    ESimCSE/esimcse/models.py, `cl_forward` lines 231 and 244-248 (`Similarity`: cos / temp; every queued row a
    column of `cos_sim_neg`, cross-entropy against the diagonal)."""
    pre_z1, losses = None, []
    for z1, z2, eval_z in steps:
        rows = []
        for i in range(len(z1)):
            candidates = list(z2) + ([] if pre_z1 is None else list(pre_z1))
            logits = [float(torch.nn.functional.cosine_similarity(z1[i], c, dim=0)) / temp for c in candidates]
            rows.append(math.log(sum(math.exp(x) for x in logits)) - logits[i])
        losses.append(sum(rows) / len(rows))
        pre_z1 = eval_z.clone() if pre_z1 is None else torch.cat((pre_z1, eval_z.clone()), 0)[-neg_size:]
    return losses, pre_z1


def sentemb_queue_losses(
    steps: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]], ids: list[torch.Tensor], convention: str
) -> tuple[list[float], torch.Tensor]:
    """The same steps through MomentumQueue (K = 4) and loss=infonce at τ 0.05, in a step's order."""
    queue, loss = MomentumQueue(queue_size=4, convention=convention), build("infonce", tau=0.05)
    losses = []
    for (z1, z2, eval_z), batch_ids in zip(steps, ids, strict=True):
        negatives = queue.negatives(batch_ids)
        losses.append(float(loss(z1, z2, extra=negatives).loss if negatives is not None else loss(z1, z2).loss))
        queue.enqueue(eval_z, batch_ids)
    return losses, queue.queue


def esimcse_steps() -> tuple[list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]], list[torch.Tensor]]:
    """Three steps of fixed embeddings: a first batch of 6 over a queue of 4, then batches of 3 that repeat sentences
    still queued (ids 104, 105 again: a duplicated line, a second epoch)."""
    gen = torch.Generator().manual_seed(0)
    sizes, ids = (6, 3, 3), [torch.arange(100, 106), torch.tensor([104, 200, 105]), torch.tensor([105, 300, 301])]
    steps = []
    for n in sizes:
        z1 = torch.randn(n, 8, generator=gen)
        steps.append((z1, z1 + 0.5 * torch.randn(n, 8, generator=gen), torch.randn(n, 8, generator=gen)))
    return steps, ids


def test_the_reference_queue_is_the_released_codes_every_row_and_whole_first_batch():
    """Findings 21 and 22: under `reference` every queued row is a negative (no entry of the batch's own sentences
    left out) and the first batch, larger than K, is queued whole; the paper form differs on both."""
    steps, ids = esimcse_steps()
    released, released_queue = released_esimcse_losses(steps, neg_size=4, temp=0.05)
    reference, reference_queue = sentemb_queue_losses(steps, ids, "reference")
    # float32 embeddings, Python-float logits on one side and torch's log-softmax on the other: ~1e-6 relative
    assert reference == pytest.approx(released, rel=1e-5)
    assert torch.equal(reference_queue, released_queue), "the same rows, copied: equal"
    paper, paper_queue = sentemb_queue_losses(steps, ids, "paper")
    assert paper[1] != pytest.approx(released[1], rel=1e-3), "paper: the first batch's newest 4 only, 104/105 left out"
    assert paper[2] != pytest.approx(released[2], rel=1e-3)


def test_the_first_reference_batch_stays_whole_until_the_next_one_cuts_the_queue_to_k():
    queue = MomentumQueue(queue_size=4, convention="reference")
    rows = torch.arange(9, dtype=torch.float32)[:, None].repeat(1, 2)
    queue.enqueue(rows[:6], torch.arange(6))
    assert queue.queue[:, 0].tolist() == [0, 1, 2, 3, 4, 5], "pre_z1 = eval_z: the whole first batch"
    assert torch.equal(queue.negatives(torch.tensor([0, 5])), queue.queue), "every row, its own sentences too"
    queue.enqueue(rows[6:], torch.arange(6, 9))
    assert queue.queue[:, 0].tolist() == [5, 6, 7, 8], "cat(pre_z1, eval_z)[-K:]"
    queue.on_epoch_start(1)
    queue.enqueue(rows[:6], torch.arange(6))
    assert queue.queue.shape[0] == 6, "emptied at the epoch's start, the next first batch kept whole"


# ---- a resumed checkpoint's queue state (finding 8): checked field by field before any model loads


@pytest.fixture(scope="module")
def esimcse_checkpoint(tmp_path_factory) -> dict:
    """A checkpoint of a tiny ESimCSE module (K = 6) after one step of 4 sentences, as a dict to tamper with."""
    module = module_of([], tmp_path_factory.mktemp("esimcse"))
    module.step_loss(tokens(module, SENTENCES[:4]))
    state = module.state_dict()
    assert state["negatives._extra_state"]["queue"].shape == (4, 32)
    return {"state_dict": state, "hyper_parameters": dict(module.hparams), "pytorch-lightning_version": "2.5.0"}


def saved(checkpoint: dict, tmp_path: Path, tamper=None) -> Path:
    checkpoint = copy.deepcopy(checkpoint)
    if tamper is not None:
        tamper(checkpoint)
    path = tmp_path / "last.ckpt"
    torch.save(checkpoint, path)
    return path


def queue_state(**changes):
    def tamper(checkpoint: dict) -> None:
        state = checkpoint["state_dict"]["negatives._extra_state"]
        for key, value in changes.items():
            if value is None:
                del state[key]
            else:
                state[key] = value(state[key]) if callable(value) else value

    return tamper


def without_queue(checkpoint: dict) -> None:
    del checkpoint["state_dict"]["negatives._extra_state"]


def plain_simcse(checkpoint: dict) -> None:
    checkpoint["hyper_parameters"]["negatives"] = None
    checkpoint["state_dict"] = {k: v for k, v in checkpoint["state_dict"].items() if not k.startswith("negatives.")}


def state_is_a_tensor(checkpoint: dict) -> None:
    checkpoint["state_dict"]["negatives._extra_state"] = torch.zeros(3)


TAMPERED = {
    "nan": (queue_state(queue=lambda q: q.index_fill(0, torch.tensor([1]), float("nan"))), "non-finite"),
    "one-dimensional": (queue_state(queue=lambda q: q.flatten()), "not \\(rows, width\\)"),
    "ids-of-other-rows": (queue_state(queue_ids=lambda ids: ids[:2]), "one sentence key per queued row"),
    "int-queue": (queue_state(queue=lambda q: q.long()), "not a float tensor"),
    "float-ids": (queue_state(queue_ids=lambda ids: ids.float()), "not an int64 tensor"),
    "200k-rows": (
        queue_state(queue=torch.zeros(1, 32).expand(200_000, 32), queue_ids=torch.zeros(1).long().expand(200_000)),
        "200000 rows, more than this run's queue can \\(6\\)",
    ),
    "epoch-text": (queue_state(emptied_at_epoch="soon"), "emptied_at_epoch"),
    "not-a-dict": (state_is_a_tensor, "not a momentum queue's state"),
    "no-queue": (without_queue, "holds no momentum queue \\(negatives._extra_state\\)"),
    "plain-simcse": (plain_simcse, "trained with negatives=null \\(none\\), this run asks for negatives=momentum"),
}


def resume_config(path: Path, tmp_path: Path, extra: list[str] = ()):
    return compose_train(["model=tiny", "negatives=momentum", "negatives.queue_size=6", f"ckpt_path={path}", *extra],
                         tmp_path)  # fmt: skip


@pytest.mark.parametrize(("tamper", "message"), TAMPERED.values(), ids=TAMPERED.keys())
def test_a_resumed_queue_state_is_checked_field_by_field_naming_file_key_and_fix(
    tamper, message, esimcse_checkpoint, tmp_path, forbid_model_loading
):
    path = saved(esimcse_checkpoint, tmp_path, tamper)
    with pytest.raises(SentembConfigError, match=message) as err:
        check_resumed_negatives(str(path), resume_config(path, tmp_path))
    assert f"ckpt_path={path}" in str(err.value) and "Fix:" in str(err.value)


def test_the_sound_state_passes_and_a_momentum_checkpoint_needs_negatives_momentum(
    esimcse_checkpoint, tmp_path, forbid_model_loading
):
    path = saved(esimcse_checkpoint, tmp_path)
    check_resumed_negatives(str(path), resume_config(path, tmp_path))
    plain = compose_train(["model=tiny", f"ckpt_path={path}"], tmp_path)
    with pytest.raises(SentembConfigError, match="trained with negatives=momentum, this run asks for negatives=null"):
        check_resumed_negatives(str(path), plain)
    with pytest.raises(SentembConfigError, match=r"more than this run's queue can \(2\)"):  # K lowered on resume
        check_resumed_negatives(str(path), resume_config(path, tmp_path, ["negatives.queue_size=2"]))
    # the released code's first batch may exceed K: under reference up to the global batch
    reference = ["negatives.convention=reference", "negatives.queue_size=2", "data.batch_size=4"]
    check_resumed_negatives(str(path), resume_config(path, tmp_path, reference))


def test_a_nan_queue_is_refused_by_the_pre_run_checks_before_any_model_loads(
    esimcse_checkpoint, tiny_overrides, tmp_path, forbid_model_loading
):
    path = saved(esimcse_checkpoint, tmp_path, TAMPERED["nan"][0])
    cfg = resume_config(path, tmp_path / "run", tiny_overrides)
    with pytest.raises(SentembConfigError, match=f"ckpt_path={path}: negatives._extra_state: queue holds non-finite"):
        prepare_run(cfg)


def test_a_bad_state_loaded_without_the_pre_run_check_is_refused_naming_the_key(esimcse_checkpoint, tmp_path):
    module = module_of([], tmp_path)
    state = copy.deepcopy(esimcse_checkpoint["state_dict"])
    state["negatives._extra_state"]["queue"][0, 0] = float("inf")
    with pytest.raises(SentembConfigError, match="negatives._extra_state: queue holds non-finite"):
        module.load_state_dict(state)


def test_a_restored_queue_of_another_width_is_refused_before_the_loss(esimcse_checkpoint, tmp_path):
    module = module_of([], tmp_path)
    state = copy.deepcopy(esimcse_checkpoint["state_dict"])
    state["negatives._extra_state"]["queue"] = torch.zeros(4, 7)
    module.load_state_dict(state)
    with pytest.raises(SentembConfigError, match="negatives._extra_state: .* width 7, this run's embeddings have 32"):
        module.step_loss(tokens(module, SENTENCES[4:]))


def test_a_part_that_keeps_no_state_refuses_a_checkpoint_holding_some(
    esimcse_checkpoint, tmp_path, forbid_model_loading
):
    """negatives=dclr saves nothing under negatives.* (its complementary model is rebuilt, its noise drawn anew): a
    checkpoint recorded as DCLR's that holds such state is refused, not left to Lightning's strict load."""

    def as_dclr(checkpoint: dict) -> None:
        checkpoint["hyper_parameters"]["negatives"] = {"name": "dclr", "complementary": "initial"}

    path = saved(esimcse_checkpoint, tmp_path, as_dclr)
    cfg = compose_train(["model=tiny", "negatives=dclr", "negatives.complementary=initial", f"ckpt_path={path}"],
                        tmp_path)  # fmt: skip
    with pytest.raises(SentembConfigError, match=r"holds state under negatives\.\*.*negatives=dclr never saves"):
        check_resumed_negatives(str(path), cfg)
