"""head=mntp (LLM2Vec's masked next-token prediction): its loss and masking against references, MNTP alone and beside
a contrastive loss through the real Trainer, GradCache, the two-stage recipe (MNTP, then SimCSE from its merged
adapter) and the experiment=llm2vec/* presets. Tiny random decoders only."""

from __future__ import annotations

import csv
import math
from pathlib import Path

import pytest
import torch
from transformers import DataCollatorForLanguageModeling

from sentemb.common.errors import SentembConfigError
from sentemb.common.metric_names import TEST_SPEARMAN
from sentemb.encoders.encoder import SentenceEncoder
from sentemb.encoders.heads.mntp import IGNORE, LABELS, MNTPHead, mask_token_id, mask_tokens
from sentemb.encoders.models.decoders import tiny_decoder, tiny_decoder_tokenizer
from sentemb.training.checks import check_parts, prepare_run
from sentemb.training.module import SentembModule
from tests.conftest import compose_train
from tests.test_train import run

SENTENCES = ["a man is playing a guitar on the street", "hi", "two dogs run through the long grass of the park"]
TINY_MNTP = ["model=tiny-llama", "pooling=mean", "head=mntp"]


@pytest.fixture(scope="module")
def tokenizer():
    tokenizer = tiny_decoder_tokenizer("llama")
    tokenizer.padding_side = "left"  # the decoder presets' side: the first real token's predictor is padding
    return tokenizer


def module_for(overrides: list[str], tmp_path: Path) -> SentembModule:
    torch.manual_seed(0)  # the same weights (pooling, adapter) for every module of a comparison
    module = SentembModule.from_config(compose_train([*TINY_MNTP, *overrides], tmp_path))
    module.on_fit_start()
    return module


def csv_rows(folder: Path) -> list[dict[str, str]]:
    rows = csv.DictReader((folder / "csv" / "version_0" / "metrics.csv").open())
    return [row for row in rows if row.get("train/loss")]


# ---------------------------------------------------------------------------------------------- the loss
@torch.no_grad()
def naive_mntp_loss(hidden: torch.Tensor, labels: torch.Tensor, lm_head: torch.nn.Module) -> tuple[float, list, list]:
    """llm2vec's shifted causal-LM cross-entropy, one scored token at a time: (batch mean, row sums, row counts)."""
    sums, counts = [], []
    for row in range(labels.shape[0]):
        total, count = 0.0, 0
        for position in range(1, labels.shape[1]):
            target = int(labels[row, position])
            if target == IGNORE:
                continue
            logits = lm_head(hidden[row, position - 1]).double()  # the state before the token predicts it
            total -= float(torch.log_softmax(logits, dim=-1)[target])
            count += 1
        sums.append(total)
        counts.append(count)
    return sum(sums) / sum(counts), sums, counts


def test_loss_equals_a_naive_loop_and_transformers_causal_lm_loss_on_a_fixed_mask(tokenizer, tmp_path):
    module = module_for(["model.dropout=0.0", "model.padding_free=false"], tmp_path)
    head = module.encoder.pooling
    batch = dict(tokenizer(SENTENCES, padding=True, return_tensors="pt"))
    labels = torch.full_like(batch["input_ids"], IGNORE)
    width, start = labels.shape[1], batch["attention_mask"].argmax(dim=1).tolist()  # each row's first real token
    picked = [(0, start[0] + 1), (0, start[0] + 2), (0, width - 1), (1, width - 1), (2, 1), (2, 5), (2, width - 2)]
    for row, position in picked:
        labels[row, position] = batch["input_ids"][row, position]
    prepared = {**batch, LABELS: labels}
    hidden = module.encoder.backbone_states(prepared)
    rows = head.training_rows(hidden, prepared)
    loss = head.training_views(rows, prepared, len(SENTENCES)).own_terms["mntp"][1]

    expected, sums, counts = naive_mntp_loss(hidden.detach(), labels, head.lm_head)
    assert rows["mntp_count"].tolist() == counts == [3, 1, 3]
    # float32 log-softmax over 2000 logits vs float64 here: ~1e-6 relative
    torch.testing.assert_close(
        rows["mntp_loss_sum"].detach().double(), torch.tensor(sums, dtype=torch.float64), rtol=1e-5, atol=1e-5
    )
    assert loss.item() == pytest.approx(expected, rel=1e-5)
    # transformers' own LlamaForCausalLM loss (what llm2vec's *BiForMNTP inherit) on the same token states
    lm = tiny_decoder(bidirectional=True, with_lm_head=True)
    lm.model, lm.lm_head = module.encoder.backbone, head.lm_head  # the module's weights
    # sentemb's explicit positions under left padding (each sentence counts from its first real token)
    positions = (batch["attention_mask"].cumsum(1) - 1).clamp(min=0)
    reference = lm(**batch, position_ids=positions, labels=labels).loss
    assert loss.item() == pytest.approx(reference.item(), rel=1e-5)


def test_masked_rows_score_only_tokens_that_have_a_predictor(tokenizer, tmp_path):
    head = module_for([], tmp_path).encoder.pooling
    batch = dict(tokenizer(["hi", "a much longer sentence than that"], padding=True, return_tensors="pt"))
    batch["input_ids"][0, -2] = tokenizer.unk_token_id  # a special token inside a sentence: never picked either
    for seed in range(20):
        torch.manual_seed(seed)
        masked = head.masked_rows(batch, tokenizer)
        first_real = batch["attention_mask"].argmax(dim=1)  # left padding: its predictor is a padding position
        assert (masked[LABELS][torch.arange(2), first_real] == IGNORE).all()
        special = torch.isin(batch["input_ids"], torch.tensor(tokenizer.all_special_ids))
        assert (masked[LABELS][special] == IGNORE).all()
        assert torch.equal(masked["input_ids"][special], batch["input_ids"][special])


# ---------------------------------------------------------------------------------------------- the masking
@pytest.mark.parametrize(("mask_replace", "random_replace"), [(0.8, 0.1), (1.0, 0.0)])
def test_masking_draws_what_transformers_collator_draws(mask_replace, random_replace, tokenizer):
    # llm2vec's collators: DataCollatorForLanguageModeling (80/10/10) and, for Mistral, "all_mask" (1.0/0.0)
    batch = tokenizer(SENTENCES * 4, padding=True, return_tensors="pt", return_special_tokens_mask=True)
    llm2vec_tokenizer = tiny_decoder_tokenizer("llama")
    llm2vec_tokenizer.mask_token = "_"  # run_mntp.py's mask_token_type blank
    collator = DataCollatorForLanguageModeling(
        llm2vec_tokenizer, mlm_probability=0.2, mask_replace_prob=mask_replace, random_replace_prob=random_replace
    )
    torch.manual_seed(3)
    expected = collator.torch_mask_tokens(batch["input_ids"].clone(), batch["special_tokens_mask"])
    torch.manual_seed(3)
    got = mask_tokens(
        batch["input_ids"],
        ~batch["special_tokens_mask"].bool(),
        mask_token_id(tokenizer, "_"),
        len(tokenizer),
        0.2,
        mask_replace,
        random_replace,
    )
    assert torch.equal(got[0], expected[0]) and torch.equal(got[1], expected[1])


def test_masking_statistics_on_a_large_draw():
    torch.manual_seed(0)
    vocab, mask_id = 2000, 66
    ids = torch.randint(10, vocab, (200, 500))
    special = torch.rand(ids.shape) < 0.1
    ids[special] = 1
    inputs, labels = mask_tokens(ids, ~special, mask_id, vocab, rate=0.2)
    picked = labels != IGNORE
    assert not picked[special].any() and torch.equal(inputs[special], ids[special]), "special tokens never picked"
    assert torch.equal(labels[picked], ids[picked]) and torch.equal(inputs[~picked], ids[~picked])
    share = picked.sum() / (~special).sum()
    masked = (inputs[picked] == mask_id) & (ids[picked] != mask_id)
    kept = inputs[picked] == ids[picked]
    randomised = ~masked & ~kept
    # ~18,000 picked of ~90,000: one standard deviation of each share is ≤ 0.003, so 0.01 is over 3 of them
    assert share.item() == pytest.approx(0.2, abs=0.01)
    assert masked.float().mean().item() == pytest.approx(0.8, abs=0.01)
    assert randomised.float().mean().item() == pytest.approx(0.1, abs=0.01)  # a random token equal to the old: 1/2000
    assert kept.float().mean().item() == pytest.approx(0.1, abs=0.01)


def test_mask_tokens_by_name(tokenizer):
    assert mask_token_id(tokenizer, "_") == mask_token_id(tokenizer, "blank") == tokenizer.convert_tokens_to_ids("_")
    assert mask_token_id(tokenizer, "eos") == mask_token_id(tokenizer, "</s>") == tokenizer.eos_token_id
    with pytest.raises(SentembConfigError, match=r"head.mask_token='zzqqzz'.*not a token.*Fix: head.mask_token=eos"):
        mask_token_id(tokenizer, "zzqqzz")


# ---------------------------------------------------------------------------------------------- config checks
@pytest.mark.parametrize(
    ("override", "key"),
    [
        ("head.rate=0", "head.rate"),
        ("head.rate=1.0", "head.rate"),
        ("head.rate=-0.2", "head.rate"),
        ("head.weight=-1", "head.weight"),
        ("head.mask_token=mask", "head.mask_token"),
        ("head.mask_replace_prob=0.95", "head.random_replace_prob"),
        ("head.contrastive=yes", "head.contrastive"),
    ],
)
def test_bad_options_are_refused_at_config_time(override, key, small_corpus, tmp_path, forbid_model_loading):
    cfg = compose_train([*TINY_MNTP, override, f"data.corpus={small_corpus}"], tmp_path)
    with pytest.raises(SentembConfigError, match=rf"^{key}=.*Fix: "):
        prepare_run(cfg)


def test_mntp_alone_with_weight_0_is_refused(tmp_path):
    with pytest.raises(SentembConfigError, match=r"head.weight=0 with head.contrastive=false.*Fix: "):
        check_parts(compose_train([*TINY_MNTP, "head.weight=0", "head.contrastive=false"], tmp_path))


def test_mntp_alone_with_a_trained_pooling_is_refused(tmp_path):
    with pytest.raises(SentembConfigError, match=r"head.contrastive=false with LatentAttention.*Fix: pooling=mean"):
        check_parts(compose_train([*TINY_MNTP, "pooling=latent", "head.contrastive=false"], tmp_path))


def test_mntp_on_an_encoder_is_refused_before_any_model_loads(tmp_path, forbid_model_loading):
    expected = r"head=mntp .*needs a decoder LLM\. Fix: .*a decoder LLM \(e\.g\. model=tiny-llama\)"
    with pytest.raises(SentembConfigError, match=expected):
        SentembModule.from_config(compose_train(["model=tiny", "pooling=mean", "head=mntp"], tmp_path))


# ---------------------------------------------------------------------------------------------- embeddings
def test_embeddings_are_the_inner_poolings(tokenizer, tmp_path):
    encoder = module_for([], tmp_path).encoder
    inner = SentenceEncoder(encoder.backbone, encoder.tokenizer, encoder.pooling.inner)
    assert isinstance(encoder.pooling, MNTPHead)
    assert (encoder.encode(SENTENCES) == inner.encode(SENTENCES)).all()  # the same computation: exact


def test_training_batches_carry_their_own_masks(tokenizer, tmp_path):
    # no per-batch state in the head: two batches prepared before either is used give what each gives alone
    encoder = module_for(["model.dropout=0.0"], tmp_path).encoder
    batches = [dict(tokenizer(s, padding=True, return_tensors="pt")) for s in (SENTENCES, SENTENCES[::-1][:2])]

    def loss(prepared, n):
        views = encoder.pooling.training_views(encoder.training_rows(prepared), prepared, n)
        return views.own_terms["mntp"][1]

    alone = []
    for seed, batch in enumerate(batches):
        torch.manual_seed(seed)
        alone.append(loss(encoder.training_batch(batch), len(batch["input_ids"])))
    prepared = []
    for seed, batch in enumerate(batches):
        torch.manual_seed(seed)
        prepared.append(encoder.training_batch(batch))
    assert prepared[0]["input_ids"].shape[0] == 3 * len(SENTENCES), "both views, then one masked row a sentence"
    for rows, batch, expected in zip(prepared, batches, alone, strict=True):
        assert torch.equal(loss(rows, len(batch["input_ids"])), expected)


# ---------------------------------------------------------------------------------------------- training runs
def test_mntp_alone_trains_without_the_contrastive_loss(tiny_overrides, small_stsb, tmp_path, monkeypatch):
    import sentemb.losses.infonce

    def never(*args, **kwargs):
        raise AssertionError("MNTP alone computed the contrastive loss")

    monkeypatch.setattr(sentemb.losses.infonce.InfoNCE, "forward", never)
    overrides = [*tiny_overrides, *TINY_MNTP, "head.contrastive=false", f"eval.stsb_dir={small_stsb}"]
    metrics = run(overrides, tmp_path)
    rows = csv_rows(tmp_path)
    assert len(rows) == 4
    for row in rows:
        assert float(row["train/loss"]) == float(row["train/loss/mntp"]) and math.isfinite(float(row["train/loss"]))
        assert not row.get("train/loss/global") and not row.get("paradigm/cos_pos"), "no contrastive loss at all"
    assert math.isfinite(metrics[TEST_SPEARMAN])
    reloaded = SentembModule.load_from_checkpoint(metrics["best_checkpoint"], map_location="cpu", weights_only=True)
    assert isinstance(reloaded.encoder.pooling, MNTPHead) and reloaded.encoder.encode(["a test"]).shape == (1, 32)


def test_mntp_beside_infonce_adds_its_weighted_term(tiny_overrides, small_stsb, tmp_path):
    overrides = [*tiny_overrides, *TINY_MNTP, "loss=infonce", "head.weight=0.5", f"eval.stsb_dir={small_stsb}"]
    metrics = run(overrides, tmp_path)
    rows = csv_rows(tmp_path)
    assert len(rows) == 4
    for row in rows:
        # float32 terms summed by the module vs float64 here
        parts = float(row["train/loss/global"]) + 0.5 * float(row["train/loss/mntp"])
        assert float(row["train/loss"]) == pytest.approx(parts, rel=1e-5)
        assert float(row["train/loss/mntp"]) > 0 and row.get("paradigm/cos_pos")
    assert math.isfinite(metrics[TEST_SPEARMAN])


# ---------------------------------------------------------------------------------------------- GradCache
def gradients(module: SentembModule, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    torch.manual_seed(1)  # the same masks in both steps
    backward, total, _ = module.step_loss(batch)
    module.backward(backward)
    return total.detach(), {name: p.grad.clone() for name, p in module.named_parameters() if p.grad is not None}


@pytest.mark.parametrize(
    "variant",
    [
        ["grad_cache=2"],
        ["grad_cache.tokens=100"],
        ["grad_cache=2", "head.contrastive=false"],
        ["grad_cache=2", "adapter=lora", "adapter.r=4", "adapter.dropout=0.0", "model.gradient_checkpointing=true"],
    ],
    ids=["sentences", "tokens", "mntp-alone", "lora-checkpointing"],
)
def test_grad_cache_equals_the_plain_step(variant, data_root, tmp_path):
    lines = (data_root / "wiki" / "wiki1m_head.txt").read_text(encoding="utf-8").splitlines()
    sentences = [line for line in lines if line.strip()][:16]
    chunked = [o for o in variant if o.startswith("grad_cache")]
    plain = module_for(["model.dropout=0.0", *(o for o in variant if o not in chunked)], tmp_path)
    cached = module_for(["model.dropout=0.0", *variant], tmp_path)
    batch = dict(plain.encoder.tokenizer(sentences, padding=True, return_tensors="pt", truncation=True, max_length=32))
    expected, got = gradients(plain, batch), gradients(cached, batch)
    assert len(cached.grad_cache.chunk_indices(cached.encoder.training_batch(batch))) >= 3, "really chunked"
    # rows computed in chunks instead of one batch (padding trimmed per chunk): float32 last bits, ~1e-7 relative
    torch.testing.assert_close(got[0], expected[0], rtol=1e-5, atol=1e-6)
    assert got[1].keys() == expected[1].keys() and got[1]
    for name, grad in got[1].items():
        torch.testing.assert_close(grad, expected[1][name], rtol=1e-4, atol=1e-6, msg=lambda m, n=name: f"{n}: {m}")


# ---------------------------------------------------------------------------------------------- the two stages
def lora_delta(state: dict[str, torch.Tensor], module: str, scaling: float) -> torch.Tensor:
    """B·A·(alpha / r) of one LoRA-wrapped linear layer of an adapter checkpoint."""
    prefix = f"encoder.backbone.base_model.model.{module}"
    return state[f"{prefix}.lora_B.default.weight"] @ state[f"{prefix}.lora_A.default.weight"] * scaling


def test_two_stage_recipe_starts_stage_2_from_the_merged_stage_1_adapter(small_corpus, small_stsb, tmp_path):
    budget = [
        "logger=csv",
        f"data.corpus={small_corpus}",
        f"eval.stsb_dir={small_stsb}",
        "trainer.max_steps=3",
        "trainer.log_every_n_steps=1",
        "eval.every_n_steps=3",
        "eval.at_start=false",
    ]
    run(["experiment=llm2vec/tiny_mntp", *budget], tmp_path / "mntp")
    last = tmp_path / "mntp" / "checkpoints" / "last.ckpt"
    stage1 = torch.load(last, weights_only=True)
    assert stage1["global_step"] == 3 and stage1["hyper_parameters"]["head"]["contrastive"] is False
    assert not list(last.parent.glob("best-*.ckpt")), "the MNTP presets keep no best-by-STS-B checkpoint"
    assert stage1["state_dict"] and all(".lora_" in key for key in stage1["state_dict"]), "adapter weights only"

    cfg = compose_train(["experiment=llm2vec/tiny_simcse", *budget, f"model.init_from={last}"], tmp_path / "simcse")
    stage2 = SentembModule.from_config(cfg).encoder.backbone
    base = tiny_decoder(bidirectional=True).state_dict()
    adapter = stage1["hyper_parameters"]["adapter"]
    scaling = adapter["alpha"] / adapter["r"]
    changed = 0
    for name, weight in stage2.named_parameters():
        if ".lora_" in name:
            continue
        plain = name.removeprefix("base_model.model.").replace(".base_layer", "")
        expected = base[plain]
        if ".base_layer" in name:  # a LoRA-wrapped linear: base + stage 1's B·A·alpha/r
            expected = expected + lora_delta(stage1["state_dict"], plain.removesuffix(".weight"), scaling)
            changed += int(not torch.equal(weight, base[plain]))
        # peft's merge adds the same product: equal up to float32 rounding of the sum
        torch.testing.assert_close(weight.detach(), expected, rtol=1e-6, atol=1e-7, msg=name)
    assert changed > 0, "stage 1 trained its adapter, and stage 2 starts from it"
    assert all(p.requires_grad == (".lora_" in n) for n, p in stage2.named_parameters()), "a fresh adapter trains"

    metrics = run(["experiment=llm2vec/tiny_simcse", *budget, f"model.init_from={last}"], tmp_path / "simcse")
    assert math.isfinite(metrics[TEST_SPEARMAN])
    rows = csv_rows(tmp_path / "simcse")
    assert rows and all(row.get("paradigm/cos_pos") and not row.get("train/loss/mntp") for row in rows)


def test_an_adapter_checkpoint_of_mntp_on_a_tied_decoder_loads(small_corpus, small_stsb, tmp_path):
    # the frozen lm_head is the embedding matrix (tied): the checkpoint holds neither, both come from the base
    from sentemb.encoders.build import load_checkpoint_encoder

    budget = [f"data.corpus={small_corpus}", f"eval.stsb_dir={small_stsb}", "trainer.max_steps=1", "logger=csv"]
    run(["experiment=llm2vec/tiny_mntp", *budget, "eval.every_n_steps=1"], tmp_path)
    encoder, _ = load_checkpoint_encoder(tmp_path / "checkpoints" / "last.ckpt")
    assert encoder.pooling.lm_head.weight is encoder.backbone.get_input_embeddings().weight
    assert encoder.encode(["a test"]).shape == (1, 32)


# ---------------------------------------------------------------------------------------------- the presets
LLM2VEC = {  # llm2vec's train_configs (McGill-NLP/llm2vec at 312adcf) and the HF defaults they leave in place
    "mntp": {
        "data.batch_size": 32,
        "data.max_length": 512,
        "optimizer.lr": 5e-5,
        "model.dropout": 0.0,
        "head.mask_token": "_",
        "head.contrastive": False,
    },
    "simcse": {
        "data.batch_size": 128,
        "data.max_length": 128,
        "optimizer.lr": 3e-5,
        "model.dropout": 0.3,
        "loss.tau": 0.05,
        "loss.name": "infonce",
        "model.init_from": None,
    },
    "both": {
        "adapter.r": 16,
        "adapter.alpha": 32,
        "adapter.dropout": 0.05,
        "model.bidirectional": True,
        "model.gradient_checkpointing": True,
        "model.backbone.torch_dtype": "bfloat16",
        "pooling.name": "mean",
        "trainer.max_steps": 1000,
        "trainer.precision": "bf16-mixed",
        "scheduler": None,
    },
}
MASKING = {"mistral_7b": (0.8, 1.0, 0.0), "llama_3_8b": (0.2, 0.8, 0.1)}  # Mistral.json: all_mask at 0.8


@pytest.mark.parametrize("model", ["mistral_7b", "llama_3_8b", "tiny"])
@pytest.mark.parametrize("stage", ["mntp", "simcse"])
def test_presets_compose_and_pass_the_config_checks(model, stage, tmp_path, forbid_model_loading):
    from omegaconf import OmegaConf

    cfg = compose_train([f"experiment=llm2vec/{model}_{stage}"], tmp_path)
    check_parts(cfg)  # nothing is loaded (forbid_model_loading), no hub is asked
    assert cfg.task_name == f"llm2vec_{model}_{stage}" and cfg.adapter and cfg.model.bidirectional
    assert (cfg.get("head") is not None) == (stage == "mntp")
    if model == "tiny":
        assert cfg.model.name_or_path == "tiny-llama"
        return
    for key, value in {**LLM2VEC[stage], **LLM2VEC["both"]}.items():
        assert OmegaConf.select(cfg, key) == value, key
    if stage == "mntp":
        assert (cfg.head.rate, cfg.head.mask_replace_prob, cfg.head.random_replace_prob) == MASKING[model]
    assert cfg.model.name_or_path == {"mistral_7b": "mistralai/Mistral-7B-Instruct-v0.2"}.get(
        model, "meta-llama/Meta-Llama-3-8B-Instruct"
    )
