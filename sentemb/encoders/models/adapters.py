"""LoRA adapters through peft (`adapter=lora`): only the adapter (and the pooling and head) train.

peft freezes every base weight, so they stay bit-identical through training. A checkpoint of an
adapter run holds the trained parameters only (adapter, pooling, head) plus the base model's
name and a fingerprint of its config (`base_fingerprint`): a 7B run's checkpoint is megabytes, and
loading one rebuilds the base from its name, checks the fingerprint, then loads the adapter.
Export merges the adapter into the base weights (`merged`), or writes peft's adapter folder.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

from torch import nn
from transformers import PreTrainedModel

from sentemb.common.errors import SentembConfigError
from sentemb.common.numbers import POSITIVE, Bounds, require_number, require_whole

ADAPTER_KEYS = ("r", "alpha", "dropout", "target_modules")
MAX_RANK = 16384  # the widest published models' hidden size (a LoRA of rank r adds r x width per matrix)
# config entries that change how a model runs, not which weights it has: left out of the fingerprint
RUN_SETTINGS = ("attention_dropout", "is_causal", "dtype", "torch_dtype", "transformers_version", "use_cache")


def check_adapter(adapter: Mapping[str, Any] | None) -> None:
    """`adapter`: null, or {r >= 1, alpha > 0, dropout in [0, 1), target_modules: all-linear or a list of names}."""
    if not adapter:
        return
    unknown = sorted(set(adapter) - set(ADAPTER_KEYS))
    if unknown:
        raise SentembConfigError(f"adapter.{unknown[0]}: unknown key. Fix: one of {', '.join(ADAPTER_KEYS)}")
    r, alpha, dropout = adapter.get("r"), adapter.get("alpha"), adapter.get("dropout", 0.0)
    # a rank beyond any hidden width only allocates r x width matrices that cannot add anything
    require_whole("adapter.r", r, Bounds(1, MAX_RANK), "adapter.r=16 (LLM2Vec)")
    require_number("adapter.alpha", alpha, POSITIVE, "adapter.alpha=32 (LLM2Vec)")
    require_number("adapter.dropout", dropout, Bounds(0.0, 1.0, high_open=True), "adapter.dropout=0.05 (LLM2Vec)")
    targets = adapter.get("target_modules", "all-linear")
    if targets != "all-linear" and not (
        isinstance(targets, list | tuple) and targets and all(isinstance(name, str) for name in targets)
    ):
        raise SentembConfigError(
            f"adapter.target_modules={targets!r}: use all-linear (every linear projection, LLM2Vec's choice) or a "
            "list of module names, e.g. [q_proj, v_proj]"
        )


def with_adapter(backbone: PreTrainedModel, adapter: Mapping[str, Any]) -> nn.Module:
    """`backbone` wrapped in a fresh LoRA adapter (peft): its base weights frozen, the adapter trainable."""
    from peft import LoraConfig, get_peft_model

    check_adapter(adapter)
    targets = adapter.get("target_modules", "all-linear")
    config = LoraConfig(
        r=adapter["r"],
        lora_alpha=adapter["alpha"],
        lora_dropout=adapter.get("dropout", 0.0),
        target_modules=targets if isinstance(targets, str) else list(targets),
    )
    return get_peft_model(backbone, config)


def is_adapted(backbone: nn.Module) -> bool:
    from peft import PeftModel

    return isinstance(backbone, PeftModel)


def base_model(backbone: nn.Module) -> PreTrainedModel:
    """The transformers model inside a peft wrapper (the backbone itself without one)."""
    return backbone.get_base_model() if is_adapted(backbone) else backbone


def merged(backbone: nn.Module) -> PreTrainedModel:
    """The adapter added into the base weights (peft's merge_and_unload): a plain transformers model."""
    return backbone.merge_and_unload() if is_adapted(backbone) else backbone


def base_fingerprint(backbone: nn.Module) -> str:
    """sha256 of the base model's config (its architecture and sizes; run settings such as dropout left out)."""
    config = base_model(backbone).config.to_dict()
    kept = {k: v for k, v in config.items() if k not in RUN_SETTINGS and not k.startswith("_")}
    return hashlib.sha256(json.dumps(kept, sort_keys=True, default=str).encode()).hexdigest()
