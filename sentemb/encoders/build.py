"""Config dicts → `SentenceEncoder`, and a training checkpoint → its encoder; no Lightning involved.

Training (`SentembModule`), evaluation, export and exported folders (`sentemb.st_modules`) all
build their encoder here, so each gets the same backbone, pooling and head from the same config.
The configs may come from a file (a checkpoint's hyper-parameters, an exported folder's JSON), so
a part is built only from the registry of parts (sentemb.common.parts, where each part declares
itself): the name a file gives is looked up there, never imported or handed to Hydra's `instantiate`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from sentemb.common.errors import SentembConfigError
from sentemb.common.parts import register_part  # noqa: F401 (its public home before)
from sentemb.encoders.checkpoint import (
    check_checkpoint_serves,
    check_stored_sizes,
    model_identity,
    model_label,
    read_checkpoint,
)
from sentemb.encoders.encoder import SentenceEncoder
from sentemb.encoders.models.adapters import (
    base_fingerprint,
    base_model,
    is_adapted,
    merged,
    with_adapter,
)
from sentemb.encoders.models.backbones import (
    check_model,
    freeze_all_but_top_layers,
    read_layer_count,
    usable_positions,
)
from sentemb.encoders.models.decoders import check_attention_direction
from sentemb.encoders.models.layer_selection import check_keep_layers_fit, keep_only_layers
from sentemb.encoders.part_configs import EncoderConfig, ModelConfig, checked_part


def attach_head(pooler: Any, head: Any) -> Any:
    """A head around the pooling (one that keeps the pooling's vector, `wraps_pooling`) or in its place (the pooling
    may refuse: `with_head`)."""
    return head.around(pooler) if head.wraps_pooling else pooler.with_head(head)


def check_encoder_parts(
    model: dict, pooling: dict, head: dict | None = None, adapter: dict | None = None
) -> EncoderConfig:
    """Every part of an encoder config is a registered one with plain options, the pooling and head fit the backbone,
    the adapter's options are valid (`EncoderConfig.checked`); nothing is built."""
    return EncoderConfig.checked(model, pooling, head, adapter)


def check_length_fits(model: dict, max_length: int | None, key: str = "data.max_length") -> None:
    """`max_length` tokens fit the backbone's position embeddings; beyond them a long sentence stops training with an
    IndexError at whichever step first draws one. Checked from the loader's options (a hub model's or folder's
    config.json where stored), before anything loads; a limit not known yet is checked on the loaded model
    (`check_positions`)."""
    backbone = checked_part("model.backbone", model.get("backbone"))
    limit = backbone.entry.positions(**backbone.options) if backbone.entry.positions is not None else None
    check_positions(limit, max_length, model_label(model), key)


def check_loaded_length(backbone: Any, model: dict, max_length: int | None, key: str = "data.max_length") -> None:
    """`check_length_fits` on the loaded backbone: a hub model not yet stored when the pre-run checks ran."""
    check_positions(usable_positions(base_model(backbone).config), max_length, model_label(model), key)


def check_positions(limit: int | None, max_length: int | None, label: str, key: str = "data.max_length") -> None:
    """`key`=max_length within a backbone's position limit (None: unknown, nothing to check)."""
    if limit is None or max_length is None or max_length <= limit:
        return
    raise SentembConfigError(
        f"{key}={max_length}: model {label} takes at most {limit} tokens (its position embeddings), so a sentence "
        f"longer than that would stop training with an IndexError. Fix: {key}={limit} or less (SimCSE's: 32)"
    )


def check_checkpoint_parts(hparams: dict, asked: dict, path: str | Path, key: str, fix: str) -> None:
    """A checkpoint's saved parts are sentemb's own (`check_encoder_parts`), those the command asks for
    (`check_checkpoint_serves`), and its model's folders pass the checks of any model's (`check_model`: no code of
    their own, safe weights, bounded sizes): what train's ckpt_path and evaluate/export's checkpoint= check before
    anything loads."""
    check_encoder_parts(hparams["model"], hparams["pooling"], hparams.get("head"), hparams.get("adapter"))
    check_checkpoint_serves(hparams, asked, Path(path), key, fix)
    try:
        check_model(hparams["model"])
    except SentembConfigError as err:
        raise SentembConfigError(f"{key}={path} (its hyper_parameters.model): {err}") from None


def backbone_options(model: ModelConfig, output_layer: bool) -> dict[str, Any]:
    """What the backbone loader is called with besides its own options: dropout (SimCSE's augmentation) as each family
    names it, a decoder's attention direction and, for a head that asks for it (`loads_output_layer`), the causal-LM
    model with its lm_head."""
    if model.decoder:
        options: dict[str, Any] = {"bidirectional": model.bidirectional, "dropout": model.dropout}
        return options | ({"with_lm_head": True} if output_layer else {})
    # BERT/RoBERTa: model.dropout sets the hidden and attention dropout
    dropout = model.dropout
    return {} if dropout is None else {"hidden_dropout_prob": dropout, "attention_probs_dropout_prob": dropout}


def build_encoder(
    model: dict | EncoderConfig, pooling: dict | None = None, head: dict | None = None, adapter: dict | None = None
) -> SentenceEncoder:
    """Backbone + tokenizer from `model`, pooling from `pooling` (sized to the backbone), optional `head` and LoRA
    `adapter` (peft); or all of them as one `EncoderConfig` already checked.

    A head takes the pooling's place or goes around it (`attach_head`); what it needs from the loaded backbone
    it declares on its class (`loads_output_layer`, `built_with`).
    """
    # all checked before anything is built: a bad pooling costs no backbone load
    config = model if isinstance(model, EncoderConfig) else EncoderConfig.checked(model, pooling, head, adapter)
    settings = config.model
    head_class = config.head.entry.build if config.head is not None else None
    output_layer = bool(head_class is not None and head_class.loads_output_layer)
    if settings.keep_layers is not None:  # the indices against the config's layer count, before any weight loads
        check_keep_layers_fit(settings.keep_layers, read_layer_count(settings.backbone), settings.label)
    backbone = settings.backbone.build(**backbone_options(settings, output_layer))
    lm_head = None
    if output_layer:  # the causal-LM model: its decoder is the backbone, its lm_head the head's output layer
        lm_head, backbone = backbone.get_output_embeddings(), backbone.get_decoder()
    if settings.keep_layers is not None:  # the student of chosen layers, before anything reads the backbone
        keep_only_layers(backbone, settings.keep_layers)
    if settings.decoder:
        check_attention_direction(backbone, settings.bidirectional)
    if settings.init_from:
        load_initial_weights(backbone, settings.raw)
    # what the head takes from the backbone as loaded, before any layer is frozen or an adapter added
    extra = head_class.built_with(backbone, lm_head) if head_class is not None else {}
    if settings.trainable_layers is not None:
        freeze_all_but_top_layers(backbone, settings.trainable_layers)
    if settings.gradient_checkpointing:  # transformers' own; torch's checkpoint replays the dropout masks
        if hasattr(backbone, "activation_checkpointing_enable"):  # its name since 5.x (the old one warns there)
            backbone.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
        else:
            backbone.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if config.adapter:
        backbone = with_adapter(backbone, config.adapter)
        if lm_head is not None:  # with an adapter only the adapter, pooling and head train, not the output layer
            lm_head.requires_grad_(False)
    tokenizer = settings.tokenizer.build()
    if settings.padding_side:
        tokenizer.padding_side = settings.padding_side
    size = base_model(backbone).config.hidden_size
    pooler = config.pooling.build(hidden_size=size)
    if config.head is not None:
        pooler = attach_head(
            pooler, config.head.build(hidden_size=size, special_ids=tokenizer.all_special_ids, **extra)
        )
    return SentenceEncoder(backbone, tokenizer, pooler, padding_free=settings.padding_free)


def load_initial_weights(backbone: Any, model: dict) -> None:
    """model.init_from=<ckpt>: the backbone weights a previous stage trained (LLM2Vec's SimCSE stage after MNTP), its
    adapter merged into them; the checkpoint's base model must be this one."""
    path = model["init_from"]
    checkpoint = read_checkpoint(path, key="model.init_from")
    hparams = checkpoint["hyper_parameters"]
    saved, asked = model_identity(hparams["model"]), model_identity(model)
    if saved != asked:
        raise SentembConfigError(
            f"model.init_from={path} was trained on another base model ({saved['name']}, not {asked['name']}). "
            "Fix: the same model= as the stage that wrote it"
        )
    check_base_fingerprint(checkpoint, backbone, f"model.init_from={path}")
    prefix = "encoder.backbone."
    weights = {k.removeprefix(prefix): v for k, v in checkpoint["state_dict"].items() if k.startswith(prefix)}
    trainable = {name: p.requires_grad for name, p in backbone.named_parameters()}
    stage = with_adapter(backbone, hparams["adapter"]) if hparams.get("adapter") else backbone
    check_loaded(stage.load_state_dict(weights, strict=False), stage, f"model.init_from={path}")
    if hparams.get("adapter"):
        merged(stage)  # in place: the adapter's update is now part of `backbone`'s weights
        for name, p in backbone.named_parameters():  # peft froze the base: this run trains it as it would have
            p.requires_grad_(trainable[name])


def check_base_fingerprint(checkpoint: dict, backbone: Any, named: str) -> None:
    """An adapter checkpoint's base fingerprint equals the freshly built base's (else the adapter fits other ones)."""
    saved = checkpoint.get("base_model", {}).get("config_sha256")
    if saved is not None and saved != base_fingerprint(backbone):
        raise SentembConfigError(
            f"{named}: its adapter was trained on a base model whose config differs from "
            f"{checkpoint['base_model'].get('name')} as loaded now (config fingerprint {saved[:12]} vs "
            f"{base_fingerprint(backbone)[:12]}). Fix: load the base model the run was trained on"
        )


def check_loaded(result: Any, module: Any, named: str) -> None:
    """A non-strict load left out only frozen base weights (an adapter checkpoint's) and loaded nothing unknown."""
    # every name of a shared weight (MNTP's lm_head tied to the embeddings is also pooling.lm_head.weight)
    frozen = {name for name, p in module.named_parameters(remove_duplicate=False) if not p.requires_grad}
    frozen |= {name for name, _ in module.named_buffers(remove_duplicate=False)}
    missing = [k for k in result.missing_keys if k not in frozen]
    if missing or result.unexpected_keys:
        raise SentembConfigError(
            f"{named}: its weights do not fit this encoder (missing {missing[:3]}, unexpected "
            f"{list(result.unexpected_keys)[:3]}). Fix: use it with the model, pooling, head and adapter it was "
            "trained with"
        )


def load_checkpoint_encoder(path: str | Path, device: torch.device | str = "cpu") -> tuple[SentenceEncoder, dict]:
    """The encoder a training checkpoint holds (its saved model, pooling and head configs and weights), and the
    checkpoint's hyper-parameters (model, pooling, head, loss, optimizer, scheduler). The file is checked and read
    without running anything it holds (`read_checkpoint`)."""
    return encoder_from_checkpoint(read_checkpoint(path), device)


def encoder_from_checkpoint(
    checkpoint: dict[str, Any], device: torch.device | str = "cpu"
) -> tuple[SentenceEncoder, dict]:
    """The encoder of a checkpoint already read by `read_checkpoint`, and its hyper-parameters. An adapter checkpoint
    holds the trained weights only: the base is rebuilt from its name and its config fingerprint checked."""
    hparams = checkpoint["hyper_parameters"]
    check_stored_sizes(checkpoint)  # sizes within what its weights hold, before a model of those sizes is built
    encoder = build_encoder(hparams["model"], hparams["pooling"], hparams.get("head"), hparams.get("adapter"))
    prefix = "encoder."
    weights = {k.removeprefix(prefix): v for k, v in checkpoint["state_dict"].items() if k.startswith(prefix)}
    if is_adapted(encoder.backbone):
        check_base_fingerprint(checkpoint, encoder.backbone, "checkpoint")
        check_loaded(encoder.load_state_dict(weights, strict=False), encoder, "checkpoint")
    else:
        encoder.load_state_dict(weights)
    return encoder.to(device), hparams
