"""A sentence-transformers module for the sentemb encoders that have no sentence-transformers counterpart.

Prompt ([MASK] state of a template), HiCL (segment aggregation), SARCSE (TextCNN head) and every
decoder LLM (last-token, weighted-mean, latent and PromptEOL poolings; mean pooling too, since
sentemb gives a decoder explicit position ids under left padding and sentence-transformers'
Transformer module does not) keep sentemb's own `SentenceEncoder`: `SentenceTransformer(dir)`
imports this class (from the installed `sentemb` package), rebuilds the backbone, pooling and head
from the saved config and loads the saved weights. The config (`sentemb_config.json`) names no
code: its `model.loader` is a key of `FOLDER_LOADERS` (a BERT/RoBERTa encoder, or a decoder loaded
causal or bidirectional as trained), and a pooling's or head's name is looked up in the
registry (`sentemb.common.parts`), never imported. The forward is sentemb's `encode()`
computation, so the embeddings agree with it. Loading a folder builds the encoder through
`sentemb.encoders.build`, which imports no training code (no Lightning).

`load_adapter_folder` reads the other kind of folder `sentemb.export` writes (`adapter_only=true`):
peft's LoRA adapter with the tokenizer and sentemb's pooling; the base model is rebuilt from the
config saved beside it and checked against the fingerprint of the base the adapter was trained on.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save
from sentence_transformers.base.modules.input_module import InputModule

from sentemb.common.errors import SentembConfigError
from sentemb.common.file_values import Shape, checked, read_json
from sentemb.common.published_files import publish_bytes, publish_text
from sentemb.encoders.build import build_encoder
from sentemb.encoders.encoder import SentenceEncoder
from sentemb.encoders.models.adapters import base_fingerprint, is_adapted
from sentemb.encoders.models.model_files import check_model_files
from sentemb.encoders.part_configs import is_decoder_config
from sentemb.eval.whitening_export import WHITENING

CONFIG = "sentemb_config.json"
POOLING_WEIGHTS = "sentemb_pooling.safetensors"
ADAPTER_WEIGHTS = "adapter_model.safetensors"  # peft's adapter file (safetensors: tensors only, nothing to run)
# sentemb_config.json's `model.loader` → the backbone and tokenizer loaders (registry names) of the folder
FOLDER_LOADERS = {
    "encoder": ("pretrained_backbone", "pretrained_tokenizer"),
    "decoder": ("pretrained_decoder", "pretrained_decoder_tokenizer"),
}
MODEL_KEYS = ("loader", "bidirectional", "padding_side", "padding_free")
ADAPTER_CONFIG = "adapter_config.json"
# sentemb_config.json: a part's name is looked up in the registry when built, never imported (folders written before
# registry names hold a `_target_` path there instead, read by encoders.checkpoint.current_part)
CONFIG_SHAPE = Shape(
    keys={"": ("pooling", "head", "model", "base"), "model": MODEL_KEYS, "base": ("name", "config_sha256", "model")},
    targets=("pooling", "head", "base.model.backbone", "base.model.tokenizer"),
)
REEXPORT = "Fix: export the folder again (python -m sentemb.export)"


@dataclass(frozen=True)
class FolderConfig:
    """sentemb_config.json: the pooling and head configs, how the backbone loads (`model`) and, in an adapter folder,
    the base model the adapter needs (`base`: its name, config fingerprint and sentemb model config)."""

    pooling: dict[str, Any]
    head: dict[str, Any] | None
    model: dict[str, Any]
    base: dict[str, Any] | None = None

    def as_json(self) -> str:
        config = {"pooling": self.pooling, "head": self.head, "model": self.model}
        return json.dumps(config | ({"base": self.base} if self.base else {}), indent=2) + "\n"


def folder_model(model: dict[str, Any], encoder: SentenceEncoder) -> dict[str, Any]:
    """The `model` entry of an exported folder's config: which loader its backbone needs and the settings it was
    trained with (a decoder's attention direction, the padding side, padding-free batches)."""
    entry: dict[str, Any] = {"loader": "decoder" if is_decoder_config(model) else "encoder"}
    if entry["loader"] == "decoder":
        entry["bidirectional"] = bool(model["bidirectional"])
    return entry | {
        "padding_side": encoder.tokenizer.padding_side,
        "padding_free": bool(model.get("padding_free", True)),
    }


def folder_model_config(folder: Path, entry: dict[str, Any]) -> dict[str, Any]:
    """The sentemb model config that loads `folder`'s backbone and tokenizer as `entry` says."""
    backbone, tokenizer = FOLDER_LOADERS[entry["loader"]]
    model = {
        "backbone": {"name": backbone, "name_or_path": str(folder)},
        "tokenizer": {"name": tokenizer, "name_or_path": str(folder)},
        "padding_side": entry.get("padding_side"),
        "padding_free": entry.get("padding_free", True),
    }
    if entry["loader"] == "decoder":  # dropout: the folder's own (config.json); the encoder runs in eval mode
        model |= {"bidirectional": entry["bidirectional"], "dropout": None}
    return model


def save_sentemb_parts(folder: Path, encoder: SentenceEncoder, config: FolderConfig) -> None:
    """The tokenizer, sentemb's pooling (and head) weights and sentemb_config.json, into `folder`."""
    encoder.tokenizer.save_pretrained(folder)
    pooling = {k: v.contiguous() for k, v in encoder.pooling.state_dict().items()}
    publish_bytes(folder / POOLING_WEIGHTS, save(pooling))  # whole, and never through a link (published_files)
    publish_text(folder / CONFIG, config.as_json())


def build_folder_encoder(path: Path, model: dict[str, Any], config: FolderConfig) -> SentenceEncoder:
    """`build_encoder` on a folder's configs, its errors prefixed with the config file's path."""
    try:  # registered parts only, built from plain options (sentemb.common.parts): the JSON names no code
        return build_encoder(model, config.pooling, config.head)
    except SentembConfigError as err:
        raise SentembConfigError(f"{path}: {err}") from None


class SentembEncoder(InputModule):
    """Tokenizer + backbone + sentemb pooling (and head), saved in the model folder's root."""

    save_in_root = True

    def __init__(
        self,
        encoder: SentenceEncoder,
        pooling: dict[str, Any],
        head: dict[str, Any] | None,
        model: dict[str, Any] | None = None,
    ) -> None:
        super().__init__()
        self.encoder = encoder
        self.tokenizer = encoder.tokenizer
        self.config = FolderConfig(pooling, head, model or {"loader": "encoder"})

    @property
    def max_seq_length(self) -> int:
        return self.tokenizer.model_max_length

    def get_embedding_dimension(self) -> int:
        return int(self.encoder.encode(["a"]).shape[1])

    def preprocess(self, inputs: Sequence[str], prompt: str | None = None, **kwargs: Any) -> dict[str, torch.Tensor]:
        texts = [prompt + text for text in inputs] if prompt else list(inputs)
        return dict(self.tokenizer(texts, padding=True, return_tensors="pt"))

    def forward(self, features: dict[str, torch.Tensor], **kwargs: Any) -> dict[str, torch.Tensor]:
        batch = {k: v for k, v in features.items() if k in ("input_ids", "attention_mask", "token_type_ids")}
        features["sentence_embedding"] = self.encoder(batch).float()  # float32, as sentemb's encode()
        return features

    def save(self, output_path: str, *args: Any, safe_serialization: bool = True, **kwargs: Any) -> None:
        folder = Path(output_path)
        if is_adapted(self.encoder.backbone):  # peft would save the adapter alone: a folder without its base
            raise SentembConfigError(
                "SentembEncoder.save: the backbone carries a LoRA adapter. Fix: merge it first "
                "(sentemb.encoders.models.adapters.merged), as python -m sentemb.export does"
            )
        # a decoder's config.json keeps is_causal as trained: transformers' AutoModel loads the folder the same way
        self.encoder.backbone.save_pretrained(folder)
        save_sentemb_parts(folder, self.encoder, self.config)

    @classmethod
    def load(cls, model_name_or_path: str, subfolder: str = "", **kwargs: Any) -> SentembEncoder:
        folder = Path(model_name_or_path) / subfolder
        config = read_config(folder / CONFIG)
        if config.base is not None:
            raise SentembConfigError(
                f"{folder / CONFIG}: this folder holds a LoRA adapter without its base model (export "
                "adapter_only=true). Fix: sentemb.st_modules.load_adapter_folder(folder), or export the checkpoint "
                "without adapter_only for a sentence-transformers folder"
            )
        encoder = build_folder_encoder(folder / CONFIG, folder_model_config(folder, config.model), config)
        encoder.pooling.load_state_dict(load_file(folder / POOLING_WEIGHTS))
        return cls(encoder.eval(), config.pooling, config.head, config.model)


def load_adapter_folder(folder: str | Path, name_or_path: str | None = None) -> SentenceEncoder:
    """The encoder of a folder `python -m sentemb.export ... adapter_only=true` wrote: the base model rebuilt from the
    sentemb model config saved in it (`name_or_path`: the base from another folder or hub name), refused unless its
    config fingerprint is that of the base the adapter was trained on, then peft's adapter loaded onto it
    (`PeftModel.from_pretrained`, from safetensors), with the folder's tokenizer and sentemb pooling; in eval mode."""
    from peft import PeftModel

    folder = Path(folder).expanduser()
    path = folder / CONFIG
    config = read_config(path)
    if config.base is None:
        raise SentembConfigError(
            f"{path}: no base entry, so this is not an adapter folder. Fix: load it with "
            "SentenceTransformer(folder, trust_remote_code=True)"
        )
    if not (folder / ADAPTER_WEIGHTS).is_file():
        raise SentembConfigError(
            f"{folder}: no {ADAPTER_WEIGHTS} (sentemb reads peft adapters from safetensors only). {REEXPORT} "
            "with adapter_only=true"
        )
    model = dict(config.base["model"])
    if name_or_path is not None:  # the same base, elsewhere: the fingerprint below still has to match
        model["name_or_path"] = name_or_path
        model["backbone"] = {**model["backbone"], "name_or_path": name_or_path}
    # the folder's tokenizer, as trained; the base as the run built it (with model.init_from: that stage merged in)
    model["tokenizer"] = {"name": FOLDER_LOADERS[config.model["loader"]][1], "name_or_path": str(folder)}
    model["gradient_checkpointing"] = False
    encoder = build_folder_encoder(path, model, config)
    fingerprint = base_fingerprint(encoder.backbone)
    if fingerprint != config.base["config_sha256"]:
        raise SentembConfigError(
            f"{path}: the adapter was trained on a base model whose config differs from "
            f"{model.get('name_or_path') or config.base['name']} as loaded now (config fingerprint "
            f"{config.base['config_sha256'][:12]} vs {fingerprint[:12]}). Fix: load the base the run was trained on "
            f"({config.base['name']}; name_or_path= if it is in another folder)"
        )
    lora = adapter_config(folder / ADAPTER_CONFIG)
    encoder.backbone = PeftModel.from_pretrained(encoder.backbone, str(folder), config=lora)
    encoder.pooling.load_state_dict(load_file(folder / POOLING_WEIGHTS))
    return encoder.eval()


# adapter_config.json: what sentemb's LoRA sets (adapters.with_adapter), and what peft writes only to inform
LORA_KEYS = ("r", "lora_alpha", "lora_dropout", "target_modules")
LORA_INFO_KEYS = (
    "peft_type", "peft_version", "base_model_name_or_path", "inference_mode", "revision", "auto_mapping",
)  # fmt: skip


def adapter_config(path: Path) -> Any:
    """peft's adapter_config.json read by sentemb, not by peft: a LoRA config (peft_type LORA) built from the keys
    sentemb trains with; every other peft option must hold its default (some name code, e.g. megatron_core)."""
    from peft import LoraConfig

    config = read_json(path, fix=REEXPORT + " with adapter_only=true")
    if not isinstance(config, dict) or config.get("peft_type") != "LORA":
        kind = config.get("peft_type") if isinstance(config, dict) else type(config).__name__
        raise SentembConfigError(f"{path}: peft_type={kind!r}: sentemb reads LoRA adapters only. {REEXPORT}")
    defaults = LoraConfig().to_dict()
    for key, value in config.items():
        if key not in defaults:
            raise SentembConfigError(f"{path}: {key} is not a LoRA option of this peft. {REEXPORT}")
        if key not in (*LORA_KEYS, *LORA_INFO_KEYS, "task_type") and value != defaults[key]:
            raise SentembConfigError(
                f"{path}: {key}={value!r}: sentemb's adapters leave it at peft's default ({defaults[key]!r}). "
                f"{REEXPORT}"
            )
    if config.get("task_type") is not None:
        raise SentembConfigError(f"{path}: task_type={config['task_type']!r}: sentemb's adapters have none. {REEXPORT}")
    return LoraConfig(**{key: config[key] for key in LORA_KEYS if key in config}, inference_mode=True)


MODULES = "modules.json"
OWN_MODULE = f"{__name__}.SentembEncoder"  # the one module outside sentence-transformers an exported folder names
MODULES_SHAPE = Shape(keys={"": ("idx", "name", "path", "type", "kwargs")})
# an exported folder's BERT-whitening (export whitening=<corpus>): the record of its fit (WHITENING, written by
# sentemb.eval.whitening_export) and the path of its module, a sentence-transformers Dense (weight Wᵀ, bias −μW,
# identity activation) after the pooling
WHITENING_KEYS = (
    "method", "module", "input_dim", "dim", "whitening_dim", "corpus", "corpus_sha256", "sentences",
    "distinct_sentences", "fitted", "embeddings",
)  # fmt: skip
WHITENING_SHAPE = Shape(keys={"": WHITENING_KEYS})
# a Dense module's config.json (sentence-transformers' config_keys) and what sentemb's Dense modules apply after
# their Linear: Tanh (SimCSE's MLP), nothing (the MLP with mlp_activation=none, the whitening)
DENSE_SHAPE = Shape(
    keys={"": ("in_features", "out_features", "bias", "activation_function", "module_input_name",
               "module_output_name", "use_residual")}
)  # fmt: skip
IDENTITY = "torch.nn.modules.linear.Identity"
DENSE_ACTIVATIONS = (IDENTITY, "torch.nn.modules.activation.Tanh")
DENSE_WEIGHTS = "model.safetensors"


def checked_modules(folder: Path, entries: list[dict[str, Any]] | None = None) -> bool:
    """An exported folder's modules.json names sentence-transformers' own modules and sentemb's `SentembEncoder`
    only, each in a path inside the folder; refused otherwise (sentence-transformers with `trust_remote_code=True`
    would import any module it names). Each Dense module's config and safetensors weights are checked (shapes,
    finite values), each model folder (a Transformer module's, sentemb's module's root) as every model folder sentemb
    loads (`check_model_files`: no code of its own, safe weights, bounded sizes), and a whitening's record
    (`sentemb_whitening.json`) against its module. True when it names
    sentemb's module (which needs `trust_remote_code`); `entries`, if given, receives modules.json's checked list."""
    path = folder / MODULES
    modules = read_json(path, fix=REEXPORT)
    if not isinstance(modules, list) or not all(isinstance(m, dict) for m in modules):
        raise SentembConfigError(f"{path}: expected a list of modules ({{idx, name, path, type}}). {REEXPORT}")
    dense: dict[str, dict[str, Any]] = {}  # a Dense module's path → its checked config
    for module in modules:
        checked(module, path, MODULES_SHAPE, REEXPORT)
        kind, where = module.get("type"), str(module.get("path", ""))
        if not isinstance(kind, str) or not (kind.startswith("sentence_transformers.") or kind == OWN_MODULE):
            raise SentembConfigError(
                f"{path}: module type {kind!r} is neither sentence-transformers' nor sentemb's ({OWN_MODULE}): "
                f"refused, nothing was imported. {REEXPORT}"
            )
        if Path(where).is_absolute() or not (folder / where).resolve().is_relative_to(folder.resolve()):
            raise SentembConfigError(f"{path}: module path {where!r} lies outside the folder. {REEXPORT}")
        if kind.rsplit(".", 1)[-1] == "Dense":
            config_path = folder / where / "config.json"
            dense[where] = check_dense(folder / where, config_path, read_json(config_path, DENSE_SHAPE, REEXPORT))
    record_path = folder / WHITENING
    whitening = read_json(record_path, WHITENING_SHAPE, REEXPORT) if record_path.is_file() else None
    if whitening is not None:
        check_whitening(record_path, whitening, modules, dense)
    listed = [(m["type"], m.get("path", "")) for m in modules]
    if any(kind == OWN_MODULE for kind, _ in listed):
        # sentemb's module first, alone in the root; after it only the whitening's Dense that its record names
        after = [where for _, where in listed[1:]]
        if listed[0] != (OWN_MODULE, "") or len(after) > 1 or (after and after[0] != (whitening or {}).get("module")):
            raise SentembConfigError(
                f"{path}: sentemb writes {OWN_MODULE} as a folder's only module, in its root (followed only by the "
                f"whitening module its {WHITENING} names); this one lists {[m['type'] for m in modules]}. {REEXPORT}"
            )
    for kind, where in listed:  # each model folder it holds, checked as every model folder sentemb loads
        is_model = kind == OWN_MODULE or kind.rsplit(".", 1)[-1] == "Transformer"
        if is_model and (folder / where / "config.json").is_file():  # without one, its loader names what it lacks
            check_model_files(folder / where, f"the exported folder {folder}")
    if entries is not None:
        entries[:] = modules
    return any(kind == OWN_MODULE for kind, _ in listed)


def check_dense(module: Path, config_path: Path, config: Any) -> dict[str, Any]:
    """A Dense module's config (read from `config_path`) and its weights (`model.safetensors`, tensors only): the
    Linear's shapes as the config says, finite values, an activation sentemb writes, no residual; the config."""
    if not isinstance(config, dict):
        raise SentembConfigError(f"{config_path}: expected a Dense config ({{in_features, ...}}). {REEXPORT}")
    sizes = config.get("in_features"), config.get("out_features")
    if not all(isinstance(n, int) and not isinstance(n, bool) and n >= 1 for n in sizes):
        raise SentembConfigError(f"{config_path}: in_features and out_features must be positive integers. {REEXPORT}")
    if not isinstance(config.get("bias", True), bool) or config.get("use_residual", False) is not False:
        raise SentembConfigError(f"{config_path}: bias must be true or false and use_residual false. {REEXPORT}")
    if config.get("activation_function", IDENTITY) not in DENSE_ACTIVATIONS:
        raise SentembConfigError(
            f"{config_path}: activation_function={config.get('activation_function')!r}: sentemb's Dense modules "
            f"apply one of {', '.join(DENSE_ACTIVATIONS)}. {REEXPORT}"
        )
    for key in ("module_input_name", "module_output_name"):
        if config.get(key, "sentence_embedding") != "sentence_embedding":
            raise SentembConfigError(f"{config_path}: {key} must be sentence_embedding. {REEXPORT}")
    weights = module / DENSE_WEIGHTS
    if (module / "pytorch_model.bin").exists() or not weights.is_file():
        raise SentembConfigError(
            f"{weights}: missing, or beside a pickled pytorch_model.bin: sentemb writes a Dense module's weights as "
            f"safetensors only. {REEXPORT}"
        )
    try:
        tensors = load_file(weights)
    except Exception as err:  # safetensors' own refusal of a malformed header or a truncated file
        raise SentembConfigError(f"{weights}: not a readable safetensors file ({err}). {REEXPORT}") from None
    out, into = sizes[1], sizes[0]
    expected = {"linear.weight": (out, into)} | ({"linear.bias": (out,)} if config.get("bias", True) else {})
    got = {name: tuple(tensor.shape) for name, tensor in tensors.items()}
    if got != expected:
        raise SentembConfigError(f"{weights}: tensors {got}, expected {expected} ({config_path}). {REEXPORT}")
    for name, tensor in tensors.items():
        if not tensor.is_floating_point() or not bool(torch.isfinite(tensor).all()):
            raise SentembConfigError(f"{weights}: {name} holds non-finite or non-float values. {REEXPORT}")
    return config


def check_whitening(path: Path, record: Any, modules: list[dict[str, Any]], dense: dict[str, dict[str, Any]]) -> None:
    """`sentemb_whitening.json` (read from `path`) names a Dense module of modules.json that comes last (a Normalize
    may follow it) and maps its `input_dim` to `dim` affinely (bias, no activation)."""
    if not isinstance(record, dict):
        raise SentembConfigError(f"{path}: expected the whitening's record ({{module, dim, ...}}). {REEXPORT}")
    where, into, out = record.get("module"), record.get("input_dim"), record.get("dim")
    if not all(isinstance(n, int) and not isinstance(n, bool) and n >= 1 for n in (into, out)) or out > into:
        raise SentembConfigError(f"{path}: input_dim and dim must be integers with 1 <= dim <= input_dim. {REEXPORT}")
    paths = [str(m.get("path", "")) for m in modules]
    if not isinstance(where, str) or where not in dense or paths.count(where) != 1:
        raise SentembConfigError(f"{path}: module={where!r} is not one Dense module of {MODULES}. {REEXPORT}")
    following = [m["type"].rsplit(".", 1)[-1] for m in modules[paths.index(where) + 1 :]]
    if any(kind != "Normalize" for kind in following):
        raise SentembConfigError(
            f"{path}: the whitening module {where} must come after the pooling (only a Normalize may follow it); "
            f"{MODULES} has {following} after it. {REEXPORT}"
        )
    config = dense[where]
    if (config["in_features"], config["out_features"]) != (into, out) or config.get("bias", True) is not True:
        raise SentembConfigError(
            f"{path}: the whitening maps {into} to {dim_words(out)} with a bias; {where}/config.json says "
            f"{config['in_features']} to {config['out_features']}, bias={config.get('bias', True)}. {REEXPORT}"
        )
    if config.get("activation_function", IDENTITY) != IDENTITY:
        raise SentembConfigError(f"{path}: the whitening module {where} applies no activation ({IDENTITY}). {REEXPORT}")


def dim_words(dim: int) -> str:
    return f"{dim} dimension{'s' if dim != 1 else ''}"


# the model card, which sentemb.export writes last (its front matter tagged `sentemb`): the mark of a whole export
EXPORT_CARD = "README.md"
CARD_TAG = "sentemb"


def check_whole_export(folder: Path) -> None:
    """`folder` holds the model card sentemb.export writes last (sentence-transformers' own card, written with the
    modules, lacks the `sentemb` tag): an export stopped part-way (before exports were renamed into place whole)
    is refused, naming what it lacks."""
    card = folder / EXPORT_CARD
    if not card_tags(card) & {CARD_TAG}:
        raise SentembConfigError(
            f"{folder}: no model card of sentemb's ({EXPORT_CARD} tagged {CARD_TAG!r}), which sentemb.export writes "
            "last: an export that stopped part-way, or a folder sentemb did not export; it is not loaded. Fix: export "
            "the model again into a new folder (python -m sentemb.export checkpoint=<ckpt> out=<new folder>)"
        )


def card_tags(card: Path) -> set[str]:
    """The tags of a model card's YAML front matter (empty: no card, no front matter, or not YAML)."""
    import yaml

    try:
        with card.open(encoding="utf-8") as handle:
            text = handle.read(1 << 16)  # the front matter comes first; a card is read no further
    except (OSError, UnicodeDecodeError):
        return set()
    head, _, rest = text.partition("\n")
    if head.strip() != "---" or "\n---" not in rest:
        return set()
    try:
        matter = yaml.safe_load(rest.split("\n---", 1)[0])
    except (yaml.YAMLError, RecursionError, ValueError):  # ValueError: an integer past Python's 4,300 digits
        return set()
    tags = matter.get("tags") if isinstance(matter, dict) else None
    return {tag for tag in tags if isinstance(tag, str)} if isinstance(tags, list) else set()


def load_exported_folder(folder: str | Path, device: str | None = None) -> Any:
    """A SentenceTransformer of a whole folder `sentemb.export` wrote (`check_whole_export`), after `checked_modules`,
    never with
    `trust_remote_code` (sentence-transformers would pass it on to every module it loads): sentence-transformers'
    own modules load as they do anywhere; sentemb's module is built here (`SentembEncoder.load`) and handed over,
    with the whitening's Dense after it where the folder has one."""
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.base.modules.dense import Dense

    folder = Path(folder).expanduser()
    check_whole_export(folder)
    entries: list[dict[str, Any]] = []
    if checked_modules(folder, entries):
        after = [Dense.load(str(folder), subfolder=str(m["path"])) for m in entries[1:]]  # the checked whitening
        return SentenceTransformer(modules=[SentembEncoder.load(str(folder)), *after], device=device)
    return SentenceTransformer(str(folder), device=device, trust_remote_code=False)


def check_before_loading(kind: str, path: Path) -> None:
    """What loading a `kind` model ("exported", "checkpoint", "onnx") from `path` checks before anything is built,
    run ahead of the work that comes before its load (sentemb.compare: before any contender is encoded): an exported
    folder whole and its modules and model folders checked (`check_whole_export`, `checked_modules`); a checkpoint
    read without running anything, its parts and its model's folders checked (`check_checkpoint_parts`); an ONNX
    folder's checks are its loader's."""
    from sentemb.encoders.build import check_checkpoint_parts
    from sentemb.encoders.checkpoint import read_checkpoint

    if kind == "exported":
        check_whole_export(path)
        checked_modules(path)
    elif kind == "checkpoint":
        hparams = read_checkpoint(path, key="checkpoint", mmap=True)["hyper_parameters"]
        check_checkpoint_parts(hparams, {}, path, "checkpoint", "a checkpoint written by sentemb.train")


def read_config(path: Path) -> FolderConfig:
    """An exported folder's sentemb_config.json, checked for its shape (folders exported before the `model` entry
    existed hold a BERT/RoBERTa encoder)."""
    config = read_json(path, CONFIG_SHAPE, REEXPORT)  # plain values; `_target_`s only at the parts
    pooling, head = (config.get("pooling"), config.get("head")) if isinstance(config, dict) else (None, None)
    if not isinstance(pooling, dict) or not isinstance(head, dict | None):
        raise SentembConfigError(f"{path}: expected {{'pooling': {{...}}, 'head': {{...}} or null, ...}}. {REEXPORT}")
    model = config.get("model", {"loader": "encoder"})
    check_folder_model(path, model)
    base = config.get("base")
    if base is not None and not (
        isinstance(base, dict)
        and isinstance(base.get("name"), str)
        and isinstance(base.get("config_sha256"), str)
        and isinstance(base.get("model"), dict)
    ):
        raise SentembConfigError(f"{path}: base must be {{'name', 'config_sha256', 'model': {{...}}}}. {REEXPORT}")
    return FolderConfig(pooling, head, model, base)


def check_folder_model(path: Path, model: Any) -> None:
    """The `model` entry names a loader of FOLDER_LOADERS (never code) and settings of the right types."""
    if not isinstance(model, dict):
        raise SentembConfigError(f"{path}: model must be {{'loader': ..., ...}}. {REEXPORT}")
    unknown = sorted(set(model) - set(MODEL_KEYS))
    if unknown:
        raise SentembConfigError(
            f"{path}: model.{unknown[0]} is not a key sentemb reads ({', '.join(MODEL_KEYS)}). {REEXPORT}"
        )
    if model.get("loader") not in FOLDER_LOADERS:
        raise SentembConfigError(
            f"{path}: model.loader={model.get('loader')!r} is not one of {', '.join(FOLDER_LOADERS)} (the loaders an "
            f"exported folder may name). {REEXPORT}"
        )
    if model["loader"] == "decoder" and not isinstance(model.get("bidirectional"), bool):
        raise SentembConfigError(f"{path}: model.bidirectional must be true or false for a decoder. {REEXPORT}")
    if model.get("padding_side") not in (None, "left", "right"):
        raise SentembConfigError(f"{path}: model.padding_side={model.get('padding_side')!r}: left or right. {REEXPORT}")
    if not isinstance(model.get("padding_free", True), bool):
        raise SentembConfigError(f"{path}: model.padding_free must be true or false. {REEXPORT}")
