"""Typed part configs: an encoder's model, pooling, head and adapter options, checked once, then read as fields.

`EncoderConfig.checked(model, pooling, head, adapter)` takes the config dicts (a command's, a checkpoint's, an
exported folder's) and runs every check that needs no file and no model: each part is a registered one with plain
options (`checked_part`, through the one migration of stored configs), the pooling and head serve the backbone
(`check_part_fits`), the backbone, decoder and adapter options are valid. What it returns is what
`build_encoder` builds from, so nothing downstream parses the dicts again.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from omegaconf import DictConfig, OmegaConf

from sentemb.common.errors import SentembConfigError
from sentemb.common.parts import DECODERS, Part, PartConfig, names, part_config

# the model loaders' modules (transformers) are imported where a model config is checked: a loss is checked with torch
# alone (sentemb.training.checks: loss.tau=0 answered before transformers and lightning load)


def plain(node: Any) -> Any:
    """A config node as plain containers (an OmegaConf node resolved; anything else as it is)."""
    return OmegaConf.to_container(node, resolve=True) if isinstance(node, DictConfig) else node


def checked_part(kind: str, node: Any) -> PartConfig:
    """A `kind` part config (`{name: <registered name>, option: value, ...}`; an old `_target_` path is read by
    `current_part`) as a `PartConfig`, else refused naming the key and the names it may be. Nothing is built or
    imported."""
    from sentemb.encoders.checkpoint import current_part

    return part_config(kind, current_part(kind, plain(node)))


def build_part(kind: str, node: Any, **extra: Any) -> Any:
    """The part `node` describes, called with its options and `extra` (`checked_part` first)."""
    return checked_part(kind, node).build(**extra)


def part_entry(kind: str, node: dict | None) -> Part | None:
    """The registry entry a `kind` part config names (checked, nothing built), or None for no config."""
    return checked_part(kind, node).entry if node else None


def is_decoder_config(model: dict) -> bool:
    """A `model=` config whose backbone loader declares that it loads decoder LLMs."""
    backbone = model.get("backbone")
    return bool(backbone) and checked_part("model.backbone", backbone).entry.serves == DECODERS


@dataclass(frozen=True)
class ModelConfig:
    """The `model=` options, checked: its loaders, and the fields build_encoder reads."""

    raw: dict[str, Any]  # as given: what checkpoints store, and what labels and identities are read from
    backbone: PartConfig
    tokenizer: PartConfig
    dropout: float | None
    trainable_layers: int | None
    keep_layers: tuple[int, ...] | None  # model.keep_layers: the transformer layers the model is built from
    padding_free: bool
    padding_side: str | None
    gradient_checkpointing: bool
    init_from: str | None
    bidirectional: bool | None  # decoders only

    @property
    def decoder(self) -> bool:
        """Its backbone loader loads a decoder LLM (the loader's own declaration)."""
        return self.backbone.entry.serves == DECODERS

    @property
    def label(self) -> str:
        """The model's name in messages: its name_or_path, unless only its tokenizer reads that (a backbone built
        in-process from its options, model=tiny: MiniLM's tokenizer path would name a model that is not trained)."""
        from sentemb.encoders.checkpoint import model_label

        if "name_or_path" not in self.backbone.options and self.tokenizer.options.get("name_or_path"):
            return f"{model_label(self.raw)} (model.backbone.name={self.backbone.name}, built in-process)"
        return str(self.raw.get("name_or_path") or model_label(self.raw))

    @classmethod
    def checked(cls, model: dict[str, Any]) -> ModelConfig:
        from sentemb.encoders.models.layer_selection import check_keep_layers

        model = plain(model)
        config = cls(
            raw=model,
            backbone=checked_part("model.backbone", model.get("backbone")),
            tokenizer=checked_part("model.tokenizer", model.get("tokenizer")),
            dropout=model.get("dropout"),
            trainable_layers=model.get("trainable_layers"),
            keep_layers=check_keep_layers(model.get("keep_layers")),
            padding_free=bool(model.get("padding_free", True)),
            padding_side=model.get("padding_side"),
            gradient_checkpointing=bool(model.get("gradient_checkpointing")),
            init_from=model.get("init_from"),
            bidirectional=model.get("bidirectional"),
        )
        return config

    def check_options(self) -> None:
        """A decoder's attention and padding options, the dropout and trainable layers, and the sizes a model built from
        its options declares (a tiny model's, which a checkpoint stores too), before anything is allocated."""
        from sentemb.encoders.models.backbones import check_backbone_options
        from sentemb.encoders.models.decoders import check_decoder_options
        from sentemb.encoders.models.model_files import check_declared_sizes

        if self.decoder:
            check_decoder_options(self.raw)
        check_backbone_options(self.dropout, self.trainable_layers)
        check_declared_sizes(self.backbone.options, "model.backbone", built_from_options=True)


def check_part_fits(part: PartConfig | None, model: ModelConfig) -> None:
    """The pooling or head serves the model's backbones (an encoder's or a decoder LLM's), else refused with the reason
    the part declares and the ones that fit; nothing loads."""
    if part is None or part.entry.fits(model.decoder):
        return
    kind = part.entry.kind
    fitting = [*names(kind, lambda other: other.fits(model.decoder)), *(["null"] if kind == "head" else [])]
    other = "an encoder (e.g. model=minilm)" if model.decoder else "a decoder LLM (e.g. model=tiny-llama)"
    raise SentembConfigError(
        f"{kind}={part.name} with model={model.label}, {'a decoder LLM' if model.decoder else 'an encoder'}: "
        f"{part.entry.why_not}. Fix: {kind}={', '.join(fitting)}, or {other}"
    )


@dataclass(frozen=True)
class EncoderConfig:
    """An encoder's parts, checked once (module docstring)."""

    model: ModelConfig
    pooling: PartConfig
    head: PartConfig | None
    adapter: dict[str, Any] | None

    @classmethod
    def checked(
        cls, model: dict, pooling: dict, head: dict | None = None, adapter: dict | None = None
    ) -> EncoderConfig:
        config = cls(
            model=ModelConfig.checked(model),
            pooling=checked_part("pooling", pooling),
            head=checked_part("head", head) if head else None,
            adapter=plain(adapter) or None,
        )
        check_part_fits(config.pooling, config.model)
        check_part_fits(config.head, config.model)
        from sentemb.encoders.models.adapters import check_adapter

        check_adapter(config.adapter)
        config.model.check_options()
        return config
