"""Poolings and heads keep no per-batch state: what a later call needs travels in the prepared batch.

Two batches prepared one after the other and then used (A's prepare, B's prepare, A's forward, B's
forward) must give exactly what each gives alone; a pooling that remembered its last `prepare`
(segment owners, mask positions) would hand batch B's to batch A.
"""

from __future__ import annotations

import pytest
import torch

from sentemb.encoders.build import build_encoder
from sentemb.losses import build
from tests.parts import PARTS, TINY_BERT

FIRST = ["a man is playing a guitar on the corner of a busy street in the rain .", "hi", "two dogs run"]
SECOND = ["the cat sits on the mat", "stocks fell sharply on monday after the bank raised its rates again ."]
MODEL = {**TINY_BERT, "dropout": 0.0}  # the same rows whenever they are computed


@pytest.mark.parametrize("name", PARTS)
def test_interleaved_prepare_calls_give_what_each_batch_gives_alone(name):
    pooling, head = PARTS[name]
    torch.manual_seed(0)
    encoder = build_encoder(MODEL, pooling, head).train()  # training mode: the train-only MLP is on
    tokenizer, loss = encoder.tokenizer, build("infonce")
    first, second = (tokenizer(batch, padding=True, return_tensors="pt") for batch in (FIRST, SECOND))

    def total(views) -> torch.Tensor:
        value = views.global_weight * loss(views.z1, views.z2).loss
        return value + sum(weight * term for weight, term in views.own_terms.values())

    alone = [(encoder(batch), total(encoder.training_views(batch))) for batch in (first, second)]

    # both batches prepared before either is used: inference rows, then the doubled training rows
    prepared = [encoder.pooling.prepare(dict(batch), tokenizer) for batch in (first, second)]
    doubled = [encoder.training_batch(dict(batch)) for batch in (first, second)]
    embeddings = [encoder.pooling(encoder.backbone_states(rows), rows) for rows in prepared]
    losses = [
        total(encoder.pooling.training_views(encoder.training_rows(rows), rows, len(batch["input_ids"])))
        for rows, batch in zip(doubled, (first, second), strict=True)
    ]
    for (embedding, value), got, got_loss in zip(alone, embeddings, losses, strict=True):
        # exact: the same computation on the same rows, only the order of the calls differs
        assert torch.equal(got, embedding), name
        assert torch.equal(got_loss, value), name
    assert embeddings[0].shape[0] == len(FIRST) and embeddings[1].shape[0] == len(SECOND)
