"""The one table of model families (transformers' `model_type`): what sentemb must know of each.

Loaders, padding-free packing, the position limits and the tests all read this table; a family not
in it still loads (through AutoModel), with padding-free encoding off. Adding a decoder family is one
`register_family(Family(...))` row (its tiny random model then builds from `config_class`).
"""

from __future__ import annotations

from dataclasses import dataclass

from transformers import GemmaConfig, LlamaConfig, MistralConfig, PretrainedConfig, Qwen2Config, Qwen3Config

from sentemb.common.errors import SentembConfigError


@dataclass(frozen=True)
class Family:
    """One `model_type`'s facts."""

    model_type: str
    decoder: bool  # a decoder LLM (causal by default; `is_causal=False` makes it bidirectional)
    config_class: type[PretrainedConfig] | None = None  # builds its tiny random model (tests, offline presets)
    padding_free: bool = True  # packs real tokens with the position ids padding_free.py writes
    position_offset: bool = False  # numbers positions from pad_token_id + 1 (RoBERTa), not from 0
    bos_first: bool = False  # its tokenizer puts BOS before every sequence (the tiny tokenizer does the same)
    eager_only: bool = False  # its attention has terms SDPA does not compute (logit soft-capping): eager only


FAMILIES: dict[str, Family] = {}
DEFAULT_TINY_FAMILY = "llama"  # a tiny decoder's family when its config names none


def register_family(family: Family) -> Family:
    """Adds (or replaces) `family.model_type`'s row."""
    FAMILIES[family.model_type] = family
    return family


for row in (
    Family("bert", decoder=False),
    Family("roberta", decoder=False, position_offset=True),
    Family("xlm-roberta", decoder=False, position_offset=True, padding_free=False),
    Family("camembert", decoder=False, position_offset=True, padding_free=False),
    Family("llama", decoder=True, config_class=LlamaConfig, bos_first=True),
    Family("mistral", decoder=True, config_class=MistralConfig, bos_first=True),
    Family("qwen2", decoder=True, config_class=Qwen2Config),
    Family("qwen3", decoder=True, config_class=Qwen3Config),
    Family("gemma", decoder=True, config_class=GemmaConfig, bos_first=True),
    Family("gemma2", decoder=True, eager_only=True, padding_free=False, bos_first=True),
    Family("gemma3_text", decoder=True, eager_only=True, padding_free=False, bos_first=True),
):
    register_family(row)


def family_of(config: PretrainedConfig) -> Family | None:
    """The row of a loaded model's config (None: a family this table does not know)."""
    return FAMILIES.get(getattr(config, "model_type", None))


def tiny_family(name: str) -> Family:
    """A family whose tiny random decoder can be built (`config_class` set), else refused naming those that can."""
    row = FAMILIES.get(name)
    if row is None or not row.decoder or row.config_class is None:
        known = ", ".join(tiny_decoder_families())
        raise SentembConfigError(f"model.backbone.family={name!r} is not one of {known}. Fix: e.g. family: llama")
    return row


def decoder_families() -> list[str]:
    """Every decoder family of the table (for messages)."""
    return [name for name, row in FAMILIES.items() if row.decoder]


def tiny_decoder_families() -> list[str]:
    """The decoder families with a tiny random model (what the tests run over)."""
    return [name for name, row in FAMILIES.items() if row.decoder and row.config_class is not None]
