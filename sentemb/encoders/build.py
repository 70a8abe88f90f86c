"""Config dicts → `SentenceEncoder`, and a training checkpoint → its encoder; no Lightning involved.

Training (`SentembModule`), evaluation, export and exported folders (`sentemb.st_modules`) all
build their encoder here, so each gets the same backbone, pooling and head from the same config.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import torch

from sentemb.common.hydra_plumbing import instantiate_checked
from sentemb.encoders.backbones import check_backbone_options, freeze_all_but_top_layers
from sentemb.encoders.encoder import SentenceEncoder

# checkpoints written before the encoder parts moved into sentemb/encoders/ name them by their old modules
MOVED_TARGET = re.compile(r"^sentemb\.(backbones|encoder|pooling|prompt|hicl|sarcse)\.")
# keys older checkpoints carry that no constructor takes any more (HiCL's length now lives in data.max_length)
RETIRED_KEYS = {"sentemb.encoders.hicl.HiCLPooling": ("train_max_length",)}


def current_targets(node: Any) -> Any:
    """`node` as today's constructors take it: every `_target_` of a moved module renamed
    (sentemb.pooling.X → sentemb.encoders.pooling.X), retired keys dropped."""
    if not isinstance(node, dict):
        return node
    target = MOVED_TARGET.sub(r"sentemb.encoders.\1.", node["_target_"]) if "_target_" in node else None
    retired = RETIRED_KEYS.get(target, ())
    return {k: target if k == "_target_" else current_targets(v) for k, v in node.items() if k not in retired}


def build_encoder(model: dict, pooling: dict, head: dict | None = None) -> SentenceEncoder:
    """Backbone + tokenizer from `model`, pooling from `pooling` (sized to the backbone), optional `head`.

    A head that makes the sentence vector itself (SARCSE) takes the pooling's place, or with HiCL
    the place of the per-segment pooling; the pooling refuses a head it cannot take.
    """
    model, pooling, head = current_targets(model), current_targets(pooling), current_targets(head)
    dropout, layers = model.get("dropout"), model.get("trainable_layers")
    check_backbone_options(dropout, layers)
    # dropout is SimCSE's augmentation: model.dropout sets the hidden and attention dropout of any BERT/RoBERTa
    overrides = {} if dropout is None else {"hidden_dropout_prob": dropout, "attention_probs_dropout_prob": dropout}
    backbone = instantiate_checked(model["backbone"], **overrides)
    if layers is not None:
        freeze_all_but_top_layers(backbone, layers)
    tokenizer = instantiate_checked(model["tokenizer"])
    size = backbone.config.hidden_size
    pooler = instantiate_checked(pooling, hidden_size=size)
    if head:
        pooler = pooler.with_head(instantiate_checked(head, hidden_size=size, special_ids=tokenizer.all_special_ids))
    return SentenceEncoder(backbone, tokenizer, pooler, padding_free=model.get("padding_free", True))


def load_checkpoint_encoder(path: str | Path, device: torch.device | str = "cpu") -> tuple[SentenceEncoder, dict]:
    """The encoder a training checkpoint holds (its saved model, pooling and head configs and weights), and the
    checkpoint's hyper-parameters (model, pooling, head, loss, optimizer, scheduler)."""
    checkpoint = torch.load(path, map_location=device, weights_only=False)
    hparams = checkpoint["hyper_parameters"]
    encoder = build_encoder(hparams["model"], hparams["pooling"], hparams.get("head"))
    prefix = "encoder."
    weights = {k.removeprefix(prefix): v for k, v in checkpoint["state_dict"].items() if k.startswith(prefix)}
    encoder.load_state_dict(weights)
    return encoder.to(device), hparams
