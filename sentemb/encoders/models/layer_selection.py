"""model.keep_layers: a student built from chosen transformer layers of its own model (layer-reduction distillation).

sentence-transformers' example (examples/sentence_transformer/training/distillation/
model_distillation_layer_reduction.py) keeps `auto_model.encoder.layer` entries by index and sets
`config.num_hidden_layers`; this does the same for encoders (BERT/RoBERTa/MiniLM: `encoder.layer`) and decoders
(Llama/Qwen/Mistral/Gemma: `layers`), and keeps what decoders index by layer consistent: each kept layer's
`layer_idx` (the key/value cache's slot) renumbered, `config.layer_types` (Qwen's and Gemma's per-layer attention
kind, read by index in their forward) cut to the kept layers. The config then describes the reduced model, so
save_pretrained writes a folder that loads with the kept number of layers.

The checks run before any weight loads: the list's form (`check_keep_layers`) with the config, its indices against
the model's layer count (`check_keep_layers_fit`) where the count is known from options or a stored config.json,
else right after the config is read (build_encoder).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from typing import Any

from torch import nn

from sentemb.common.errors import SentembConfigError
from sentemb.common.parts import PartConfig

KEY = "model.keep_layers"
EXAMPLE = "model.keep_layers=[0,2,4] (MiniLM's layers 0, 2 and 4)"


def check_keep_layers(keep: object) -> tuple[int, ...] | None:
    """null, or a non-empty list of distinct whole numbers >= 0 in ascending order; else refused naming the key."""
    if keep is None:
        return None
    if isinstance(keep, str | bytes) or not isinstance(keep, Sequence) or len(keep) == 0:
        raise SentembConfigError(
            f"{KEY}={keep!r} must be a non-empty list of layer indices, or null for every layer. Fix: e.g. {EXAMPLE}"
        )
    keep = list(keep)  # a list from the command line or a file (OmegaConf's ListConfig, JSON's list)
    for index in keep:
        if isinstance(index, bool) or not isinstance(index, int) or index < 0:
            raise SentembConfigError(
                f"{KEY}={keep}: {index!r} is not a layer index (a whole number >= 0, the first layer 0). "
                f"Fix: e.g. {EXAMPLE}"
            )
    if keep != sorted(set(keep)):
        raise SentembConfigError(
            f"{KEY}={keep}: the indices must be distinct and ascending (the layers run in the model's order). "
            f"Fix: {KEY}=[{','.join(str(i) for i in sorted(set(keep)))}]"
        )
    return tuple(keep)


def check_keep_layers_fit(keep: Sequence[int] | None, count: int | None, model: str) -> None:
    """Every index below the model's layer count (None: not known yet, checked once the config is read)."""
    if keep is None or count is None or max(keep) < count:
        return
    raise SentembConfigError(
        f"{KEY}={list(keep)}: model {model} has {count} transformer layers (0 to {count - 1}), so layer {max(keep)} "
        f"does not exist. Fix: indices below {count}, e.g. {KEY}=[{','.join(str(i) for i in range(0, count, 2))}]"
    )


def declared_layer_count(backbone: PartConfig, stored_config: Callable[[str], Any]) -> int | None:
    """The backbone's layer count before it loads: a model built from its options (tiny_*): its num_hidden_layers
    option or the loader's default; a folder or cached hub model: its config.json's (`stored_config`, read alone);
    None where neither says."""
    options = backbone.options
    if "name_or_path" in options:
        return whole(getattr(stored_config(str(options["name_or_path"])), "num_hidden_layers", None))
    if "num_hidden_layers" in options:
        return whole(options["num_hidden_layers"])
    parameter = inspect.signature(backbone.entry.build).parameters.get("num_hidden_layers")
    return whole(parameter.default) if parameter is not None else None


def whole(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def layer_list(backbone: nn.Module) -> tuple[nn.Module, str]:
    """The module holding the transformer layers and its attribute: `encoder.layer` (BERT/RoBERTa) or `layers`
    (decoders), as freeze_all_but_top_layers finds them."""
    encoder = getattr(backbone, "encoder", None)
    if isinstance(getattr(encoder, "layer", None), nn.ModuleList):
        return encoder, "layer"
    if isinstance(getattr(backbone, "layers", None), nn.ModuleList):
        return backbone, "layers"
    raise SentembConfigError(
        f"{KEY}: {type(backbone).__name__} has no encoder.layer or layers list to choose from. Fix: {KEY}=null"
    )


def keep_only_layers(backbone: Any, keep: Sequence[int]) -> None:
    """`backbone` reduced in place to the layers `keep` names, in order (their weights the same tensors), its config
    describing the reduced model (module docstring)."""
    owner, attribute = layer_list(backbone)
    layers = getattr(owner, attribute)
    check_keep_layers_fit(keep, len(layers), type(backbone).__name__)
    kept = nn.ModuleList([layers[index] for index in keep])
    for new_index, layer in enumerate(kept):  # a cache (unused by an encoder, kept right) is indexed by layer_idx
        for module in layer.modules():
            if isinstance(getattr(module, "layer_idx", None), int):
                module.layer_idx = new_index
    setattr(owner, attribute, kept)
    config = backbone.config
    types = getattr(config, "layer_types", None)
    if isinstance(types, list) and len(types) == len(layers):  # Qwen2/3, Gemma-2: the mask each layer gets
        config.layer_types = [types[index] for index in keep]
        if hasattr(backbone, "has_sliding_layers"):  # Qwen builds a sliding-window mask only when a layer needs it
            backbone.has_sliding_layers = "sliding_attention" in config.layer_types
    config.num_hidden_layers = len(keep)
