"""Config dicts → `SentenceEncoder`, and a training checkpoint → its encoder; no Lightning involved.

Training (`SentembModule`), evaluation, export and exported folders (`sentemb.st_modules`) all
build their encoder here, so each gets the same backbone, pooling and head from the same config.
The configs may come from a file (a checkpoint's hyper-parameters, an exported folder's JSON), so
a part is built only from a closed registry of sentemb's own classes and loaders (`PARTS`): the
`_target_` a file names is looked up there, never imported or handed to Hydra's `instantiate`.
"""

from __future__ import annotations

from pathlib import Path
from types import ModuleType
from typing import Any

import torch

from sentemb.common.errors import SentembConfigError
from sentemb.encoders import backbones, hicl, sarcse
from sentemb.encoders import pooling as poolings
from sentemb.encoders.backbones import check_backbone_options, freeze_all_but_top_layers
from sentemb.encoders.checkpoint import check_checkpoint_serves, current_targets, read_checkpoint
from sentemb.encoders.encoder import SentenceEncoder

# the only things a config may build: config key → its `_target_`s, each a (module, name) of sentemb's own,
# looked up when built (so a test's monkeypatch of a loader is seen)
PARTS: dict[str, dict[str, tuple[ModuleType, str]]] = {
    key: {f"{module.__name__}.{name}": (module, name) for module, name in parts}
    for key, parts in {
        "model.backbone": [(backbones, "pretrained_backbone"), (backbones, "tiny_bert"), (backbones, "tiny_roberta")],
        "model.tokenizer": [(backbones, "pretrained_tokenizer"), (backbones, "tiny_roberta_tokenizer")],
        "pooling": [
            (poolings, "CLSPooling"),
            (poolings, "MeanPooling"),
            (poolings, "PromptPooling"),
            (hicl, "HiCLPooling"),
        ],
        "head": [(sarcse, "SARCSEHead")],
    }.items()
}


def register_part(key: str, module: ModuleType, name: str) -> str:
    """Lets configs name `module.name` as a `key` part (a backbone, tokenizer, pooling or head of your own): call it
    from your own code before building. Files can name only registered parts. Returns the `_target_` to use."""
    if key not in PARTS:
        raise SentembConfigError(f"register_part: {key!r} is not a part key. Fix: one of {', '.join(PARTS)}")
    target = f"{module.__name__}.{name}"
    PARTS[key][target] = (module, name)
    return target


def plain_value(value: Any) -> bool:
    """A JSON-like value with no `_target_` anywhere inside (nothing in it names code to build)."""
    if isinstance(value, dict):
        return "_target_" not in value and all(isinstance(k, str) and plain_value(v) for k, v in value.items())
    if isinstance(value, list | tuple):
        return all(plain_value(v) for v in value)
    return value is None or isinstance(value, str | int | float | bool)


def checked_part(key: str, node: Any) -> tuple[str, dict[str, Any]]:
    """(`_target_`, options) of a part config: a `PARTS[key]` name with plain options, else refused naming `key` and
    the parts it may be. Nothing is built or imported."""
    node = current_targets(node)
    allowed = PARTS[key]
    target = node.get("_target_") if isinstance(node, dict) else None
    if target not in allowed:
        names = ", ".join(sorted(name.rsplit(".", 1)[-1] for name in allowed))
        raise SentembConfigError(
            f"{key}._target_={target!r} is not one of sentemb's {key} parts ({names}): refused, nothing was "
            f"imported or run. Fix: a {key} config naming one of them (conf/{key.split('.')[0]}/ has one for each)"
        )
    options = {name: value for name, value in node.items() if name != "_target_"}
    odd = [name for name, value in options.items() if name.startswith("_") or not plain_value(value)]
    if odd:
        raise SentembConfigError(
            f"{key}.{odd[0]}: sentemb builds {key} parts from plain options only (no `_` keys, no nested "
            f"`_target_`): refused, nothing was run. Fix: remove {key}.{odd[0]}"
        )
    return target, options


def build_part(key: str, node: Any, **extra: Any) -> Any:
    """The part `node` describes (`{"_target_": <a PARTS[key] name>, option: value, ...}`), called with its options
    and `extra` (`checked_part` first)."""
    target, options = checked_part(key, node)
    module, name = PARTS[key][target]
    try:
        return getattr(module, name)(**options, **extra)
    except TypeError as err:  # an option the class does not take: named, as Hydra's instantiate would not
        raise SentembConfigError(f"{key}: {err}. Fix: remove the option or correct its name") from None


def check_encoder_parts(model: dict, pooling: dict, head: dict | None = None) -> None:
    """Every part of an encoder config is one of sentemb's own with plain options (`checked_part`); nothing is built."""
    for key, node in (("model.backbone", model.get("backbone")), ("model.tokenizer", model.get("tokenizer"))):
        checked_part(key, node)
    checked_part("pooling", pooling)
    if head:
        checked_part("head", head)


def check_checkpoint_parts(hparams: dict, asked: dict, path: str | Path, key: str, fix: str) -> None:
    """A checkpoint's saved parts are sentemb's own (`check_encoder_parts`) and those the command asks for
    (`check_checkpoint_serves`): what train's ckpt_path and evaluate/export's checkpoint= both check."""
    check_encoder_parts(hparams["model"], hparams["pooling"], hparams.get("head"))
    check_checkpoint_serves(hparams, asked, Path(path), key, fix)


def build_encoder(model: dict, pooling: dict, head: dict | None = None) -> SentenceEncoder:
    """Backbone + tokenizer from `model`, pooling from `pooling` (sized to the backbone), optional `head`.

    A head that makes the sentence vector itself (SARCSE) takes the pooling's place, or with HiCL
    the place of the per-segment pooling; the pooling refuses a head it cannot take.
    """
    check_encoder_parts(model, pooling, head)  # all before any is built: a bad pooling costs no backbone load
    dropout, layers = model.get("dropout"), model.get("trainable_layers")
    check_backbone_options(dropout, layers)
    # dropout is SimCSE's augmentation: model.dropout sets the hidden and attention dropout of any BERT/RoBERTa
    overrides = {} if dropout is None else {"hidden_dropout_prob": dropout, "attention_probs_dropout_prob": dropout}
    backbone = build_part("model.backbone", model["backbone"], **overrides)
    if layers is not None:
        freeze_all_but_top_layers(backbone, layers)
    tokenizer = build_part("model.tokenizer", model["tokenizer"])
    size = backbone.config.hidden_size
    pooler = build_part("pooling", pooling, hidden_size=size)
    if head:
        pooler = pooler.with_head(build_part("head", head, hidden_size=size, special_ids=tokenizer.all_special_ids))
    return SentenceEncoder(backbone, tokenizer, pooler, padding_free=model.get("padding_free", True))


def load_checkpoint_encoder(path: str | Path, device: torch.device | str = "cpu") -> tuple[SentenceEncoder, dict]:
    """The encoder a training checkpoint holds (its saved model, pooling and head configs and weights), and the
    checkpoint's hyper-parameters (model, pooling, head, loss, optimizer, scheduler). The file is checked and read
    without running anything it holds (`read_checkpoint`)."""
    return encoder_from_checkpoint(read_checkpoint(path), device)


def encoder_from_checkpoint(
    checkpoint: dict[str, Any], device: torch.device | str = "cpu"
) -> tuple[SentenceEncoder, dict]:
    """The encoder of a checkpoint already read by `read_checkpoint`, and its hyper-parameters."""
    hparams = checkpoint["hyper_parameters"]
    encoder = build_encoder(hparams["model"], hparams["pooling"], hparams.get("head"))
    prefix = "encoder."
    weights = {k.removeprefix(prefix): v for k, v in checkpoint["state_dict"].items() if k.startswith(prefix)}
    encoder.load_state_dict(weights)
    return encoder.to(device), hparams
