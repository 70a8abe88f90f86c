"""Padding-free encoding computes what padded batches compute, on the real tokens only.

Every pooling and head, BERT and RoBERTa (tiny, random), in `encode()` and in the training views;
a training step's loss and parameter gradients with dropout 0; other backbones fall back to padded
batches and say so. Tolerances: the packed (1, T, H) matmuls block differently from the padded
(B, L, H) ones, which moves float32 results in the last bits (~1e-7); asked: 1e-5.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch

from sentemb.encoders.build import build_encoder
from sentemb.encoders.models import padding_free as packing
from sentemb.encoders.models.padding_free import PackedRows
from sentemb.training.module import SentembModule
from tests.conftest import compose_train
from tests.parts import CLS, PARTS, TINY_BERT, TINY_ROBERTA

TOLERANCE = {"rtol": 1e-5, "atol": 1e-5}
SENTENCES = [
    "a man is playing a guitar on the corner of a busy street in the rain .",
    "hi",
    "two dogs run through the snow",
    "stocks fell sharply on monday after the central bank raised its rates again .",
    "the cat sits on the mat",
]
BACKBONES = {"bert": TINY_BERT, "roberta": TINY_ROBERTA}


@pytest.fixture(autouse=True)
def always_pack(monkeypatch):
    """Every batch packed, however dense (HiCL's equal-length segments would otherwise stay padded)."""
    monkeypatch.setattr(packing, "PACK_BELOW", 1.01)


def encoder_pair(backbone: str, part: str):
    """The same encoder (same weights) once padding-free and once padded, dropout 0."""
    pooling, head = PARTS[part]
    encoders = []
    for padding_free in (True, False):
        torch.manual_seed(0)
        model = {**BACKBONES[backbone], "dropout": 0.0, "padding_free": padding_free}
        encoders.append(build_encoder(model, pooling, head))
    assert encoders[0].padding_free and not encoders[1].padding_free
    return encoders


@pytest.mark.parametrize("part", PARTS)
@pytest.mark.parametrize("backbone", BACKBONES)
def test_padding_free_encode_and_training_views_equal_padded(backbone, part):
    packed, padded = encoder_pair(backbone, part)
    got, expected = packed.encode(SENTENCES, batch_size=4), padded.encode(SENTENCES, batch_size=4)
    torch.testing.assert_close(torch.from_numpy(got), torch.from_numpy(expected), **TOLERANCE)

    batch = dict(packed.tokenizer(SENTENCES, padding=True, return_tensors="pt"))
    views = [encoder.train().training_views(batch) for encoder in (packed, padded)]
    torch.testing.assert_close(views[0].z1, views[1].z1, **TOLERANCE)
    torch.testing.assert_close(views[0].z2, views[1].z2, **TOLERANCE)
    assert views[0].own_terms.keys() == views[1].own_terms.keys()
    for label, (weight, value) in views[0].own_terms.items():
        assert weight == views[1].own_terms[label][0]
        torch.testing.assert_close(value, views[1].own_terms[label][1], **TOLERANCE, msg=label)


def test_the_backbone_computes_only_real_tokens():
    packed, padded = encoder_pair("bert", "cls")
    batch = dict(packed.tokenizer(SENTENCES, padding=True, return_tensors="pt"))
    rows = []
    hook = packed.backbone.encoder.layer[0].intermediate.dense.register_forward_hook(
        lambda module, args, out: rows.append(args[0].shape[:-1].numel())
    )
    packed.eval()(batch)
    hook.remove()
    real, padded_size = int(batch["attention_mask"].sum()), batch["attention_mask"].numel()
    assert rows == [real] and real < padded_size


def test_a_dense_batch_stays_padded(monkeypatch):
    monkeypatch.setattr(packing, "PACK_BELOW", 0.85)
    packed, _ = encoder_pair("bert", "cls")
    rows = []
    hook = packed.backbone.encoder.layer[0].intermediate.dense.register_forward_hook(
        lambda module, args, out: rows.append(args[0].shape[:-1].numel())
    )
    sparse = dict(packed.tokenizer(SENTENCES, padding=True, return_tensors="pt"))
    dense = dict(packed.tokenizer(["two dogs run", "a cat sat"], padding=True, return_tensors="pt"))
    packed.eval()(sparse)
    packed(dense)
    hook.remove()
    assert rows == [int(sparse["attention_mask"].sum()), dense["attention_mask"].numel()]


def test_a_sentence_attends_only_to_itself():
    # a token's state must not depend on the sentences packed beside it
    packed, _ = encoder_pair("bert", "mean")
    alone = packed.encode(SENTENCES[:1], batch_size=1)
    beside = packed.encode(SENTENCES, batch_size=len(SENTENCES))[:1]
    torch.testing.assert_close(torch.from_numpy(beside), torch.from_numpy(alone), **TOLERANCE)


def test_packed_rows_round_trip_and_survive_an_empty_row():
    mask = torch.tensor([[1, 1, 1, 0], [0, 0, 0, 0], [1, 1, 0, 0]])
    rows = PackedRows.of(mask)
    ids = torch.arange(12).view(3, 4)
    assert rows.pack(ids).tolist() == [[0, 1, 2, 8, 9]]
    states = rows.unpack(rows.pack(ids).unsqueeze(-1).float())
    assert torch.equal(states[..., 0], (ids * mask).float())
    assert rows.key_mask[1].all(), "an empty row attends to its padding, not to nothing (NaN)"


@pytest.mark.parametrize(
    "overrides",
    [["model=tiny"], ["model=tiny-roberta"], ["model=tiny", "pooling=hicl", "pooling.slice_len=6", "head=sarcse"]],
    ids=["bert-cls", "roberta-cls", "bert-hicl-sarcse"],
)
def test_padding_free_step_has_the_padded_loss_and_gradients(overrides, small_corpus, tmp_path: Path):
    lines = small_corpus.read_text(encoding="utf-8").splitlines()[:12]
    results = []
    for padding_free in ("true", "false"):
        cfg = compose_train(
            [*overrides, "model.dropout=0.0", f"model.padding_free={padding_free}", f"data.corpus={small_corpus}"],
            tmp_path,
        )
        torch.manual_seed(0)
        module = SentembModule.from_config(cfg)
        module.on_fit_start()
        batch = dict(module.encoder.tokenizer(lines, padding=True, return_tensors="pt"))
        backward, total, _ = module.step_loss(batch)
        backward.backward()
        results.append((total.detach(), {n: p.grad for n, p in module.named_parameters() if p.grad is not None}))
    (loss, grads), (padded_loss, padded_grads) = results
    torch.testing.assert_close(loss, padded_loss, **TOLERANCE)
    assert grads.keys() == padded_grads.keys()
    for name, grad in grads.items():
        torch.testing.assert_close(grad, padded_grads[name], **TOLERANCE, msg=name)


def tiny_distilbert():
    """A backbone padding-free does not support (DistilBERT's own position and attention conventions)."""
    from transformers import DistilBertConfig, DistilBertModel

    return DistilBertModel(DistilBertConfig(vocab_size=30522, dim=32, n_layers=1, n_heads=2, hidden_dim=64))


def test_an_unsupported_backbone_falls_back_to_padded_batches_and_says_so(caplog, monkeypatch):
    import sys

    from sentemb.common import parts

    monkeypatch.setattr(parts, "REGISTRY", {kind: dict(parts.registered(kind)) for kind in parts.KINDS})
    name = parts.register_part("model.backbone", sys.modules[__name__].tiny_distilbert)
    model = {
        "backbone": {"name": name},
        "tokenizer": BACKBONES["bert"]["tokenizer"],
    }
    with caplog.at_level(logging.INFO, logger="sentemb.encoders.models.padding_free"):
        encoder = build_encoder(model, CLS)
    assert type(encoder.backbone).__name__ == "DistilBertModel" and not encoder.padding_free
    assert "padding-free encoding is off for DistilBertModel" in caplog.text and "batches stay padded" in caplog.text
    assert encoder.encode(SENTENCES).shape == (len(SENTENCES), 32)


def test_padding_free_off_by_config(tmp_path: Path):
    cfg = compose_train(["model=tiny", "model.padding_free=false"], tmp_path)
    assert not SentembModule.from_config(cfg).encoder.padding_free
