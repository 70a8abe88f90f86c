"""DiffCSE's head (sentemb/encoders/heads/diffcse.py) against naive reference loops, and its runs."""

from __future__ import annotations

import math
import os

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

from sentemb.common.errors import SentembConfigError
from sentemb.common.hydra_plumbing import resolved_container
from sentemb.encoders.heads import diffcse
from sentemb.encoders.heads.diffcse import DiffCSEHead, masked_inputs, selected_positions
from sentemb.training.checks import check_parts
from sentemb.training.module import SentembModule
from tests.conftest import compose_train
from tests.test_ddp_gradients import StepLoss, gradients, rank_rows, spawned
from tests.test_resume import logged, resumed_losses, stopped_and_resumed
from tests.test_train import run

SENTENCES = [
    "a man is playing a guitar .", "the cat sits on the mat", "two dogs run through a field of grass",
    "a woman slices an onion", "stocks fell sharply on monday", "hi", "the weather is nice today",
    "children are playing football in the park near the school",
]  # fmt: skip
DIFFCSE = ["model=tiny", "head=diffcse", "pooling.mlp=none", "head.generator=tiny"]
PARTS = ("model", "pooling", "head", "loss", "optimizer", "scheduler")


def module_of(overrides: list[str], tmp_path) -> SentembModule:
    torch.manual_seed(0)  # the same weights wherever it is built
    module = SentembModule.from_config(compose_train([*DIFFCSE, *overrides], tmp_path))
    module.on_fit_start()  # builds the generator (a fit does this)
    return module


def tokens(module: SentembModule, sentences: list[str]) -> dict[str, torch.Tensor]:
    return dict(module.encoder.tokenizer(sentences, padding=True, return_tensors="pt"))


# ---- the generator's input


def test_masking_selects_the_ratio_of_real_non_special_tokens_and_never_a_special_one():
    torch.manual_seed(0)
    ids = torch.randint(5, 1000, (400, 50))
    ids[:, 0], ids[:, -1] = 101, 102  # [CLS] … [SEP]
    mask = torch.ones_like(ids)
    mask[200:, 30:] = 0  # padding
    ids[200:, 30:] = 0
    special = torch.tensor([0, 101, 102])
    selected = selected_positions(ids, mask, special, 0.3)
    maskable = mask.bool() & ~torch.isin(ids, special)
    assert not selected[~maskable].any(), "never a special token or padding"
    n = int(maskable.sum())
    # a binomial share of n ≈ 14,000 draws: 5 standard deviations
    assert abs(selected.sum().item() / n - 0.3) < 5 * math.sqrt(0.3 * 0.7 / n)


def test_masked_inputs_are_80_percent_mask_10_random_10_kept_of_the_selected():
    torch.manual_seed(0)
    ids = torch.full((300, 100), 7)
    selected = torch.rand(ids.shape) < 0.5
    out = masked_inputs(ids, selected, mask_id=103, vocab_size=30522)
    assert (out[~selected] == 7).all(), "unselected tokens are never touched"
    chosen = out[selected]
    n = chosen.numel()
    masked, kept = (chosen == 103).float().mean().item(), (chosen == 7).float().mean().item()
    tolerance = 5 * math.sqrt(0.1 * 0.9 / n)  # binomial shares of ~15,000 draws: 5 standard deviations
    assert abs(masked - 0.8) < 5 * math.sqrt(0.8 * 0.2 / n) and abs(kept - 0.1) < tolerance + 1 / 30522


def test_the_uniform_generator_replaces_selected_tokens_by_non_special_ids_only(tmp_path):
    module = module_of(["head.generator=uniform", "head.masking_ratio=0.5"], tmp_path)
    head = module.encoder.pooling
    batch = tokens(module, SENTENCES)
    torch.manual_seed(1)
    edit, replaced = head.edited(batch["input_ids"], batch["attention_mask"])
    special = torch.tensor(module.encoder.tokenizer.all_special_ids)
    changed = edit != batch["input_ids"]
    assert torch.equal(replaced.bool(), changed & batch["attention_mask"].bool())
    assert changed.any() and not torch.isin(edit[changed], special).any()
    assert not changed[torch.isin(batch["input_ids"], special)].any(), "[CLS], [SEP] and padding stay"


@pytest.mark.parametrize("convention", ["paper", "reference"])
def test_the_mlm_generator_edits_as_the_convention_says(convention, tmp_path):
    module = module_of([f"head.convention={convention}", "head.masking_ratio=0.5"], tmp_path)
    head = module.encoder.pooling
    batch = tokens(module, SENTENCES)
    torch.manual_seed(2)
    edit, replaced = head.edited(batch["input_ids"], batch["attention_mask"])
    pad = ~batch["attention_mask"].bool()
    assert not replaced.bool()[pad].any(), "padding is never labelled replaced"
    if convention == "reference":  # argmax everywhere, the first token restored, padding id 0
        assert torch.equal(edit[:, 0], batch["input_ids"][:, 0]) and (edit[pad] == 0).all()
    else:  # sampled at the selected tokens only: [CLS], [SEP] and padding kept
        special = torch.isin(batch["input_ids"], torch.tensor(module.encoder.tokenizer.all_special_ids))
        assert torch.equal(edit[special], batch["input_ids"][special])


# ---- the discriminator's loss


def naive_rtd(head: DiffCSEHead, edited, mask, replaced, z, convention: str) -> torch.Tensor:
    """The embedding layer's output with row i's position 0 replaced by z_i, the transformer layers with the padding
    masked, the 2-way head, and −log softmax per token in a Python loop."""
    disc = head.discriminator
    states = disc.embeddings(input_ids=edited).clone()
    states[:, 0] = z
    additive = (1.0 - mask[:, None, None, :].float()) * torch.finfo(torch.float32).min
    states = disc.encoder(states, attention_mask=additive).last_hidden_state
    logits = head.rtd_head(states)
    total, count = 0.0, 0
    for i in range(edited.shape[0]):
        for t in range(edited.shape[1]):
            if convention == "paper" and not mask[i, t]:
                continue
            total = total - torch.log_softmax(logits[i, t], dim=-1)[replaced[i, t]]
            count += 1
    return total / count


@pytest.mark.parametrize("convention", ["paper", "reference"])
def test_the_rtd_loss_is_a_per_token_cross_entropy_conditioned_on_z_at_position_0(convention, tmp_path):
    module = module_of([f"head.convention={convention}", "model.dropout=0.0"], tmp_path)
    head = module.encoder.pooling
    batch = tokens(module, SENTENCES[:4])
    mask = batch["attention_mask"]
    torch.manual_seed(3)
    edited, replaced = head.edited(batch["input_ids"], mask)
    z = torch.randn(4, head.rtd_head.in_features)
    loss = head.rtd_loss(head.rtd_logits(edited, mask, z), replaced, mask)
    # the same layers in another order of summation (a Python loop of log-softmaxes): float32, 1e-5
    torch.testing.assert_close(loss, naive_rtd(head, edited, mask, replaced, z, convention), rtol=1e-5, atol=1e-6)
    other = head.rtd_loss(head.rtd_logits(edited, mask, z + 1.0), replaced, mask)
    assert not torch.equal(loss, other), "the discriminator reads z"


def test_rtd_gradients_reach_the_encoder_only_through_the_sentence_embedding(tmp_path):
    module = module_of(["model.dropout=0.0"], tmp_path)
    head = module.encoder.pooling
    head.projector.eval()  # running statistics: the projector is the same function in both computations
    batch = tokens(module, SENTENCES[:4])
    torch.manual_seed(4)
    prepared = module.encoder.training_batch(batch)
    conditioning = []  # the z the discriminator is conditioned on
    rtd_logits = head.rtd_logits
    head.rtd_logits = lambda edited, mask, z: conditioning.append(z) or rtd_logits(edited, mask, z)
    views = head.training_views(module.encoder.training_rows(prepared), prepared, 4)
    rtd = views.own_terms["rtd"][1]
    encoder_params = [p for p in module.encoder.backbone.parameters()]
    direct = torch.autograd.grad(rtd, encoder_params, retain_graph=True, allow_unused=True)
    # the same term through z alone: dL/dz, then z's own backward into the encoder
    (z,) = conditioning
    (dz,) = torch.autograd.grad(rtd, z, retain_graph=True)
    through_z = torch.autograd.grad(z, encoder_params, grad_outputs=dz, allow_unused=True)
    assert any(g is not None and g.abs().sum() > 0 for g in direct)
    for a, b in zip(direct, through_z, strict=True):
        if a is None:
            assert b is None or not b.any()
            continue
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)  # one chain rule, split in two: float32 rounding


def test_the_projector_normalises_both_views_together_and_replaces_the_mlp(tmp_path):
    module = module_of([], tmp_path)
    views = module.encoder.training_views(tokens(module, SENTENCES))
    both = torch.cat([views.z1, views.z2])
    # BatchNorm without affine over the 2B rows: each feature has mean 0 and biased variance 1 over both views
    torch.testing.assert_close(both.mean(0), torch.zeros(both.shape[1]), atol=1e-5, rtol=0)
    torch.testing.assert_close(both.var(0, unbiased=False), torch.ones(both.shape[1]), atol=1e-3, rtol=0)
    with torch.no_grad():  # evaluation is the pooling's raw [CLS]
        module.eval()
        hidden, prepared = module.encoder.hidden_states(tokens(module, SENTENCES[:2]))
        torch.testing.assert_close(module.encoder(tokens(module, SENTENCES[:2])), hidden[:, 0])


# ---- refusals, state


@pytest.mark.parametrize(
    ("overrides", "needle"),
    [
        (["pooling.mlp=train"], "pooling.mlp=none"),
        (["pooling=prompt"], "own tokens"),
        (["pooling=mean", "head.masking_ratio=1.5"], "head.masking_ratio"),
        (["pooling.mlp=none", "head.generator=/no/such/folder"], "head.generator"),
        (["pooling.mlp=none", "head.convention=other"], "head.convention"),
    ],
)
def test_bad_diffcse_settings_are_refused_before_any_model_loads(overrides, needle, tmp_path):
    cfg = compose_train(["model=tiny", "head=diffcse", *overrides], tmp_path)
    with pytest.raises(SentembConfigError, match=needle):
        check_parts(cfg)


def test_the_generator_is_not_state_the_discriminator_and_batch_statistics_are(tmp_path):
    module = module_of([], tmp_path)
    keys = set(module.state_dict())
    assert any(k.startswith("encoder.pooling.discriminator.") for k in keys)
    assert "encoder.pooling.projector.1.running_mean" in keys
    assert not any("generator" in k or k.startswith("encoder.pooling.frozen") for k in keys)
    generator = module.encoder.pooling.frozen[0]
    assert all(not p.requires_grad for p in generator.parameters())
    assert not {id(p) for p in generator.parameters()} & {id(p) for p in module.parameters()}


def test_the_discriminator_starts_as_the_encoders_pretrained_copy(tmp_path):
    module = module_of([], tmp_path)
    disc, backbone = module.encoder.pooling.discriminator, module.encoder.backbone
    for (name, a), (_, b) in zip(disc.named_parameters(), backbone.named_parameters(), strict=True):
        assert torch.equal(a, b) and a.data_ptr() != b.data_ptr(), name


def test_a_lora_run_keeps_the_generator_out_and_saves_the_discriminator(tmp_path):
    module = module_of(["adapter=lora"], tmp_path)
    kept = module.trained_keys()
    assert any(k.startswith("encoder.pooling.discriminator.") for k in kept), "the discriminator trains whole"
    assert not any("generator" in k or "frozen" in k for k in kept)
    assert all(p.requires_grad for p in module.encoder.pooling.discriminator.parameters())


def test_a_tiny_diffcse_run_trains_and_logs_the_rtd_term(tiny_overrides, tmp_path):
    metrics = run([*tiny_overrides, *DIFFCSE, "trainer.max_steps=3", "trainer.log_every_n_steps=1"], tmp_path)
    assert math.isfinite(metrics["stsb/test/spearman"])
    assert len(logged(tmp_path, "train/loss/rtd")) == 3


@pytest.mark.slow  # three training runs (make test-slow)
def test_a_resumed_diffcse_run_equals_the_uninterrupted_run(tiny_overrides, tmp_path):
    overrides = [*tiny_overrides, *DIFFCSE, "trainer.max_steps=6", "eval.every_n_steps=3"]
    full, resumed, _ = stopped_and_resumed(overrides, tmp_path, stop_after=3)
    losses, resumed_run = resumed_losses(tmp_path)
    # bit-identical weights, BatchNorm statistics, optimizer, data position and RNG; the generator rebuilt the same
    assert len(losses) == 6 and resumed_run == losses
    assert full["stsb/test/spearman"] == resumed["stsb/test/spearman"]


# ---- DDP: 2 gloo processes equal one process on the concatenated batch


def fixed_edit(head: DiffCSEHead, input_ids: torch.Tensor, attention_mask: torch.Tensor):
    """A deterministic edit (every third real token + 1): each process edits its rows as one process would."""
    change = attention_mask.bool() & (torch.arange(input_ids.shape[1]) % 3 == 1)
    edit = torch.where(change, input_ids + 1, input_ids)
    return edit, change.long()


def _worker(rank: int, world: int, port: int, config: dict, batches: list, out: dict) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.set_num_threads(1)
    torch.manual_seed(0)
    diffcse.DiffCSEHead.edited = fixed_edit
    module = SentembModule.from_config(config)
    module.on_fit_start()
    module.encoder.pooling.projector.eval()  # per-rank batch statistics differ from one process's (see the test)
    ddp = torch.nn.parallel.DistributedDataParallel(StepLoss(module))
    for step, batch in enumerate(batches):
        module.zero_grad()
        backward, total = ddp(rank_rows(batch, rank, world))
        module.backward(backward)
        out[(rank, step)] = gradients(module)
    dist.destroy_process_group()


@pytest.mark.slow  # two spawned gloo processes (make test-slow)
def test_ddp_diffcse_equals_one_process_on_the_concatenated_batch(tmp_path, monkeypatch):
    cfg = compose_train([*DIFFCSE, "model.dropout=0.0"], tmp_path)
    config = {key: resolved_container(cfg.get(key)) for key in PARTS}
    monkeypatch.setattr(diffcse.DiffCSEHead, "edited", fixed_edit)
    torch.manual_seed(0)
    single = SentembModule.from_config(config)
    single.on_fit_start()
    # BatchNorm's batch statistics are each rank's own under DDP (the released code's too); trainer.sync_batchnorm=true
    # (Lightning's SyncBatchNorm, CUDA only) makes them the global batch's. Here the projector uses its running
    # statistics, so everything else (gather, RTD, discriminator, DDP's average) is what is compared
    single.encoder.pooling.projector.eval()
    # each rank's half holds the same sentences: its per-rank RTD mean (over its real tokens) is the global one
    batches = [tokens(single, SENTENCES[:4] * 2), tokens(single, SENTENCES[4:] * 2)]
    out = spawned(_worker, config, batches)
    for step, batch in enumerate(batches):
        single.zero_grad()
        backward, _, _ = single.step_loss(batch)
        backward.backward()
        expected = gradients(single)
        for rank in (0, 1):
            grads = out[(rank, step)]
            assert grads.keys() == expected.keys()
            for name, grad in grads.items():  # batch shapes and DDP's all-reduce order: float32 apart by ~1e-7
                torch.testing.assert_close(grad, expected[name], rtol=1e-4, atol=1e-5, msg=name)


def test_an_unknown_generator_vocabulary_is_refused(tmp_path, monkeypatch):
    module = module_of(["head.generator=uniform"], tmp_path)

    class OtherTokenizer:
        def get_vocab(self) -> dict[str, int]:
            return {"a": 0}

    monkeypatch.setattr(diffcse, "check_model_source", lambda *a, **k: None)
    monkeypatch.setattr(diffcse.AutoTokenizer, "from_pretrained", lambda *a, **k: OtherTokenizer())
    with pytest.raises(SentembConfigError, match="vocabulary differs"):
        diffcse.pretrained_masked_lm("some/mlm", module.encoder.tokenizer)


def test_the_loss_of_a_step_is_contrastive_plus_lambda_rtd(tmp_path):
    module = module_of(["model.dropout=0.0"], tmp_path)
    batch = tokens(module, SENTENCES)
    torch.manual_seed(5)
    _, total, parts = module.step_loss(batch)
    rtd, contrastive = parts["train/loss/rtd"], parts["train/loss/global"]
    # the two logged terms, recombined in float32
    torch.testing.assert_close(total.detach(), contrastive + 0.005 * rtd, rtol=1e-6, atol=1e-7)
    assert F.relu(rtd) > 0


def test_grad_cache_gives_the_plain_diffcse_step(tmp_path, monkeypatch):
    """GradCache's chunks carry the edits as extra row keys: the same loss and gradients as one forward."""
    monkeypatch.setattr(diffcse.DiffCSEHead, "edited", fixed_edit)  # the same edits in both computations

    def step(extra: list[str]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        module = module_of(["model.dropout=0.0", *extra], tmp_path / str(len(extra)))
        backward, total, _ = module.step_loss(tokens(module, SENTENCES))
        if module.grad_cache is not None:
            module.backward(backward)  # the loss's backward, then GradCache's replay of its chunks
        else:
            backward.backward()
        return total.detach(), gradients(module)

    (loss, grads), (cached, cached_grads) = step([]), step(["grad_cache=3"])
    torch.testing.assert_close(cached, loss, rtol=1e-5, atol=1e-6)  # other chunk shapes: float32 rounding
    assert cached_grads.keys() == grads.keys()
    for name in grads:
        torch.testing.assert_close(cached_grads[name], grads[name], rtol=1e-4, atol=1e-5, msg=name)
