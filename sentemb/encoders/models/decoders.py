"""Decoder LLMs (the decoder families of encoders/models/families.py) as sentence encoders.

Bidirectional attention is transformers' own switch: a decoder config's `is_causal=False` makes
the model build a bidirectional mask (transformers >= 5.2), so no model class is re-implemented.
At load a two-token probe checks that the switch took effect (`check_attention_direction`): a
later token must change an earlier token's state when bidirectional, and never when causal. A
model class that ignores the switch is refused with its name.

SimCSE's augmentation is dropout. Decoder configs default to `attention_dropout=0`, and these
families have no other dropout (no hidden or embedding dropout in their configs), so
`model.dropout` sets `attention_dropout` (LLM2Vec's SimCSE stage uses 0.3).
"""

from __future__ import annotations

import logging
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModel, AutoModelForCausalLM, PreTrainedModel, PreTrainedTokenizerBase

from sentemb.common.errors import SentembConfigError
from sentemb.common.parts import DECODERS, part
from sentemb.encoders.models.backbones import (
    NO_REMOTE_CODE,
    _offline_if_unreachable,
    check_model_source,
    pretrained_positions,
    trained_byte_bpe,
)
from sentemb.encoders.models.families import DEFAULT_TINY_FAMILY, decoder_families, family_of, tiny_family
from sentemb.encoders.models.model_files import transformers_refusals

log = logging.getLogger(__name__)

TINY_DECODER_VOCAB = 2000
# Llama's order: <unk> 0, <s> 1, </s> 2; <pad> 3 (Llama has no pad token: real presets pad with EOS)
DECODER_SPECIALS = ["<unk>", "<s>", "</s>", "<pad>"]
TINY_DECODER_POSITIONS = 2048


def decoder_overrides(bidirectional: bool, dropout: float | None) -> dict[str, object]:
    """Config values a decoder is loaded with: transformers' `is_causal` switch and the attention dropout.

    `use_cache=False`: an encoder never generates, so no forward should fill a key/value cache (with it on, every
    forward builds one, and transformers logs a warning at each checkpointed forward when model.gradient_checkpointing).
    """
    overrides: dict[str, object] = {"is_causal": not bidirectional, "use_cache": False}
    if dropout is not None:  # the only dropout these families have (SimCSE's augmentation)
        overrides["attention_dropout"] = float(dropout)
    return overrides


def tiny_decoder_positions(**_: object) -> int:
    """`tiny_decoder`'s position limit (every family alike): its max_position_embeddings."""
    return TINY_DECODER_POSITIONS


@part("model.backbone", "tiny_decoder", serves=DECODERS, positions=tiny_decoder_positions)
def tiny_decoder(
    family: str = DEFAULT_TINY_FAMILY,
    hidden_size: int = 32,
    num_hidden_layers: int = 2,
    num_attention_heads: int = 2,
    num_key_value_heads: int = 1,
    intermediate_size: int = 64,
    bidirectional: bool = False,
    dropout: float | None = None,
    init_seed: int = 0,
    attn_implementation: str | None = "sdpa",
    with_lm_head: bool = False,
    vocab_size: int = TINY_DECODER_VOCAB,
    head_dim: int | None = None,
    tie_word_embeddings: bool = True,
    torch_dtype: str | None = None,
) -> PreTrainedModel:
    """A random decoder of `family`, built in-process from a config (for tests and offline use): tiny by default, or
    a published model's shape (benchmarks/gpu/decoders.py: Qwen3-0.6B's, Mistral-7B's) with its `vocab_size`,
    `head_dim` (null: hidden_size / heads) and `tie_word_embeddings`.

    Its weights come from `init_seed`, not the global seed: the same config always gives the same base
    weights (on one device), so an adapter-only checkpoint rebuilds its base exactly. Built under a
    `torch.device` context it is initialised there (a 7B model on the GPU in seconds). `with_lm_head`: the
    causal-LM model (the MNTP head reads its `lm_head`). `attn_implementation` null: transformers' choice;
    `torch_dtype` e.g. bfloat16 (as pretrained_decoder's).
    """
    config = tiny_family(family).config_class(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        num_hidden_layers=num_hidden_layers,
        num_attention_heads=num_attention_heads,
        num_key_value_heads=num_key_value_heads,
        intermediate_size=intermediate_size,
        head_dim=head_dim or hidden_size // num_attention_heads,
        max_position_embeddings=TINY_DECODER_POSITIONS,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=3,
        tie_word_embeddings=tie_word_embeddings,
        **decoder_overrides(bidirectional, dropout),
    )
    check_attention_options(attn_implementation, torch_dtype)
    options: dict[str, object] = {} if attn_implementation is None else {"attn_implementation": attn_implementation}
    if torch_dtype is not None:
        options["dtype"] = getattr(torch, torch_dtype)
    on_cuda = torch.get_default_device().type == "cuda"  # a torch.device("cuda") context: initialised on the GPU
    with torch.random.fork_rng(devices=[torch.cuda.current_device()] if on_cuda else []):
        torch.manual_seed(init_seed)
        return (AutoModelForCausalLM if with_lm_head else AutoModel).from_config(config, **options)


@part("model.tokenizer", "tiny_decoder_tokenizer", serves=DECODERS)
def tiny_decoder_tokenizer(family: str = DEFAULT_TINY_FAMILY) -> PreTrainedTokenizerBase:
    """A byte-level BPE tokenizer trained in-process (deterministic, < 1 s), the size of `tiny_decoder`'s vocabulary.

    Like the real families' tokenizers it appends no EOS; it puts <s> first where the family's own tokenizer does
    (families.py: bos_first). No mask token (decoders have none).
    """
    return decoder_tokenizer(family)


def decoder_tokenizer(family: str, words_file: Path | None = None) -> PreTrainedTokenizerBase:
    """`tiny_decoder_tokenizer`, its BPE trained on `words_file` (a MiniLM vocab.txt; None: the packaged model's)."""
    from tokenizers.processors import TemplateProcessing
    from transformers import PreTrainedTokenizerFast

    bpe = trained_byte_bpe(TINY_DECODER_VOCAB, DECODER_SPECIALS, words_file)
    if tiny_family(family).bos_first:  # as the family's own tokenizer: BOS before every sequence
        bpe.post_processor = TemplateProcessing(single="<s> $A", pair="<s> $A $B", special_tokens=[("<s>", 1)])
    return PreTrainedTokenizerFast(
        tokenizer_object=bpe._tokenizer,
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
        pad_token="<pad>",
        model_max_length=TINY_DECODER_POSITIONS,
    )


@part("model.backbone", "pretrained_decoder", serves=DECODERS, positions=pretrained_positions)
def pretrained_decoder(
    name_or_path: str,
    bidirectional: bool = False,
    dropout: float | None = None,
    attn_implementation: str | None = None,
    torch_dtype: str | None = None,
    with_lm_head: bool = False,
) -> PreTrainedModel:
    """A Hugging Face decoder (hub name or folder) through AutoModel, with `is_causal` and the attention dropout set.

    `attn_implementation` (null: transformers' choice; eager_only families need eager); `torch_dtype` e.g. bfloat16
    to load a 7B model in half the memory; `with_lm_head`: the causal-LM model (for the MNTP head).
    """
    check_model_source(name_or_path)
    check_attention_options(attn_implementation, torch_dtype)
    options: dict[str, object] = {**NO_REMOTE_CODE, **_offline_if_unreachable(name_or_path)}
    with transformers_refusals(name_or_path, "model.name_or_path"):
        config = AutoConfig.from_pretrained(name_or_path, **options)
    eager_only = getattr(family_of(config), "eager_only", False)
    if eager_only and attn_implementation not in (None, "eager"):
        raise SentembConfigError(
            f"model.backbone.attn_implementation={attn_implementation}: {config.model_type} soft-caps its attention "
            "logits, which only eager attention computes. Fix: model.backbone.attn_implementation=eager"
        )
    if attn_implementation is not None or eager_only:
        options["attn_implementation"] = attn_implementation or "eager"
    if torch_dtype is not None:
        options["dtype"] = getattr(torch, torch_dtype)
    loader = AutoModelForCausalLM if with_lm_head else AutoModel
    with transformers_refusals(name_or_path, "model.name_or_path"):
        return loader.from_pretrained(name_or_path, **options, **decoder_overrides(bidirectional, dropout))


# transformers' own attention code paths; a hub kernel name ("org/repo") would download and run code
ATTENTION = ("eager", "sdpa", "flash_attention_2", "flash_attention_3", "flex_attention")
DTYPES = ("float32", "bfloat16", "float16")


def check_attention_options(attn_implementation: str | None, torch_dtype: str | None = None) -> None:
    """model.backbone.attn_implementation and torch_dtype from closed sets (they may come from a checkpoint)."""
    if attn_implementation is not None and attn_implementation not in ATTENTION:
        raise SentembConfigError(
            f"model.backbone.attn_implementation={attn_implementation!r} is not one of {', '.join(ATTENTION)}. "
            "Fix: one of those, or null for transformers' choice"
        )
    if torch_dtype is not None and torch_dtype not in DTYPES:
        raise SentembConfigError(
            f"model.backbone.torch_dtype={torch_dtype!r} is not one of {', '.join(DTYPES)}. Fix: e.g. bfloat16"
        )


@part("model.tokenizer", "pretrained_decoder_tokenizer", serves=DECODERS)
def pretrained_decoder_tokenizer(name_or_path: str) -> PreTrainedTokenizerBase:
    """The decoder's own tokenizer; a missing pad token becomes EOS (several families ship none)."""
    from sentemb.encoders.models.backbones import pretrained_tokenizer

    tokenizer = pretrained_tokenizer(name_or_path)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


@torch.no_grad()
def attends_forward(backbone: PreTrainedModel) -> bool:
    """Whether a later token changes an earlier token's state: two 2-token inputs that differ in their second token."""
    device = next(backbone.parameters()).device
    vocab = backbone.config.vocab_size
    first, second = torch.tensor([[4, 5]], device=device), torch.tensor([[4, vocab - 1]], device=device)
    was_training = backbone.training
    backbone.eval()  # dropout would change the first token's state by itself
    try:
        a, b = (backbone(input_ids=ids).last_hidden_state[0, 0].float() for ids in (first, second))
    finally:
        backbone.train(was_training)
    # a causal model computes the first token from the first token alone: equal up to kernel rounding
    return not torch.allclose(a, b, rtol=1e-4, atol=1e-5)


def check_attention_direction(backbone: PreTrainedModel, bidirectional: bool) -> None:
    """Refuse a decoder whose attention does not go the way `model.bidirectional` asks (the two-token probe)."""
    if attends_forward(backbone) == bidirectional:
        return
    name = type(backbone).__name__
    if bidirectional:
        raise SentembConfigError(
            f"model.bidirectional=true: {name} ignores transformers' is_causal=False (a later token did not change "
            f"an earlier token's state), so it would train causally. Fix: model.bidirectional=false, or a model "
            f"class that builds its mask with transformers' create_causal_mask (e.g. {', '.join(decoder_families())})"
        )
    raise SentembConfigError(
        f"model.bidirectional=false: {name} attends to later tokens (it is not a causal decoder). "
        "Fix: model.bidirectional=true, or an encoder preset (model=minilm, bert-base, ...)"
    )


def is_decoder(backbone: PreTrainedModel) -> bool:
    """A decoder LLM: its family's row says so (a family the table does not know: its config has the `is_causal`
    switch these loaders set)."""
    row = family_of(backbone.config)
    return row.decoder if row is not None else hasattr(backbone.config, "is_causal")


def check_decoder_options(model: dict) -> None:
    """model.bidirectional is a boolean, model.padding_side left or right."""
    bidirectional = model.get("bidirectional")
    if not isinstance(bidirectional, bool):
        raise SentembConfigError(
            f"model.bidirectional={bidirectional!r} must be true (LLM2Vec) or false (causal, e.g. last-token pooling)"
        )
    if model.get("padding_side") not in (None, "left", "right"):
        raise SentembConfigError(f"model.padding_side={model.get('padding_side')!r} must be left or right")


def warn_without_dropout(model: dict) -> None:
    """A decoder trained without dropout gets one warning: SimCSE's two views would be identical."""
    if not model.get("dropout"):
        log.warning(
            "model.dropout=%s on a decoder: attention_dropout 0 makes SimCSE's two views identical (no augmentation); "
            "LLM2Vec trains with model.dropout=0.3",
            model.get("dropout"),
        )
