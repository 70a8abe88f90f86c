"""The one check of every Hugging Face folder sentemb loads a model or tokenizer from, before the corpus is read or any
model built: no code of the folder's own (`auto_map`, a model_type transformers does not implement), weights sentemb
can read without running anything (safetensors, or a pickle naming tensors only), and sizes bounded by what the
weights hold and the machine allows (`check_declared_sizes`). `transformers_refusals` says the same, as sentemb's
refusals, for files transformers fetches from the hub as it loads.
"""

from __future__ import annotations

import contextlib
import pickle
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import torch

from sentemb.common.errors import SentembConfigError
from sentemb.common.file_values import parse_json
from sentemb.common.memory import allowed_bytes, in_gib
from sentemb.common.numbers import Bounds, require_whole

MODEL_CONFIG, TOKENIZER_CONFIG = "config.json", "tokenizer_config.json"
SAFE_WEIGHTS = "model.safetensors"
PICKLED_WEIGHTS = "pytorch_model.bin"
INDEX = ".index.json"  # a sharded model's index beside its shards: `model.safetensors.index.json`
FOLDER_FIX = (
    "Fix: a folder of a model transformers implements itself, as its save_pretrained writes it (weights as "
    "model.safetensors)"
)
CONVERT_FIX = (
    "Fix: convert the weights to safetensors where you trust the file (transformers: "
    "AutoModel.from_pretrained(folder).save_pretrained(folder), which writes model.safetensors), then remove "
    f"{PICKLED_WEIGHTS}"
)
MAX_SAFETENSORS_HEADER = 100 << 20  # the safetensors library's own limit on a header (its tensor table)
# the sizes a config.json (or a tiny model's options) declares, each bounded far above every published model: beyond
# them the model transformers builds allocates until the machine dies before any weight is read
SIZE_LIMITS = {
    "vocab_size": 1 << 22,  # Gemma's 256k x 16
    "hidden_size": 1 << 16,
    "intermediate_size": 1 << 20,
    "num_hidden_layers": 1 << 10,
    "num_attention_heads": 1 << 10,
    "num_key_value_heads": 1 << 10,
    "head_dim": 1 << 14,
    "max_position_embeddings": 1 << 24,
    "type_vocab_size": 1 << 16,
}


def check_model_files(folder: Path, key: str, weights: bool = True) -> None:
    """The one check of every Hugging Face folder sentemb loads a model or tokenizer from (a backbone or tokenizer, a
    DiffCSE generator, a DCLR complementary model, a checkpoint's model.name_or_path, an exported folder's
    transformer), run by the pre-run checks before the corpus is read or any model built, and by each loader again:

    - config.json and tokenizer_config.json, where present, are JSON (depth-bounded) naming no code of the folder's own
      (`auto_map`: Python files sentemb never imports, so transformers would load such a folder only with
      trust_remote_code=True, which sentemb never passes);
    - config.json's `model_type` is one transformers implements itself;
    - its sizes are bounded and within what its weights hold (`check_declared_sizes`);
    - `weights`: the folder holds its weights, as safetensors (each file's header read, never its tensors), or as a
      pickled pytorch_model.bin whose pickle names tensors only (scanned, nothing run: transformers reads it with
      weights_only=True); any other pickle, or a file that is not torch's archive, is refused.

    Each refusal names the file, what it holds and the fix; `key` is the config key that named the folder."""
    config = folder_json(folder / MODEL_CONFIG, key)
    tokenizer_config = folder_json(folder / TOKENIZER_CONFIG, key)
    for path, values in ((folder / MODEL_CONFIG, config), (folder / TOKENIZER_CONFIG, tokenizer_config)):
        if values is not None and "auto_map" in values:
            raise SentembConfigError(
                f"{key}: {path} names code of the folder's own (auto_map: {clipped(values['auto_map'])}), which "
                "sentemb never imports or runs (transformers would load it only with trust_remote_code=True). "
                f"{FOLDER_FIX}"
            )
    if config is not None:
        check_model_type(config, folder / MODEL_CONFIG, key)
    stored = weight_bytes(folder, key) if weights or has_weights(folder) else None
    if weights and stored is None:
        raise SentembConfigError(
            f"{key}: {folder} holds no weights ({SAFE_WEIGHTS}, or its shards and {SAFE_WEIGHTS}{INDEX}). {FOLDER_FIX}"
        )
    if config is not None:
        check_declared_sizes(config, f"{key}: {folder / MODEL_CONFIG}", stored)


def folder_json(path: Path, key: str) -> dict[str, Any] | None:
    """A folder's JSON config as a dict (None: the file is absent), refused naming the file if unreadable."""
    if not path.is_file():
        return None
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise SentembConfigError(f"{key}: {path} is unreadable ({err}). {FOLDER_FIX}") from None
    value = parse_json(text, path, FOLDER_FIX)
    if not isinstance(value, dict):
        raise SentembConfigError(f"{key}: {path} holds a {type(value).__name__}, not a JSON object. {FOLDER_FIX}")
    return value


def clipped(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 120 else text[:117] + "..."


def check_model_type(config: Mapping[str, Any], path: Path, key: str) -> None:
    """config.json's `model_type` is one transformers implements itself (its own classes, no code from the folder)."""
    from transformers import CONFIG_MAPPING

    model_type = config.get("model_type")
    if not isinstance(model_type, str) or model_type not in CONFIG_MAPPING:
        raise SentembConfigError(
            f"{key}: {path} has model_type={model_type!r}, which this transformers ({transformers_version()}) does "
            f"not implement, so only code of the folder's own could load it, which sentemb never runs. {FOLDER_FIX} "
            "(e.g. bert, roberta, llama, qwen3)"
        )


def transformers_version() -> str:
    import transformers

    return transformers.__version__


def has_weights(folder: Path) -> bool:
    return any((folder / name).is_file() for name in weight_files_names())


def weight_files_names() -> tuple[str, ...]:
    return (SAFE_WEIGHTS, SAFE_WEIGHTS + INDEX, PICKLED_WEIGHTS, PICKLED_WEIGHTS + INDEX)


def weight_bytes(folder: Path, key: str) -> int | None:
    """The bytes of tensors `folder`'s weights hold (None: no weights file), each file checked: safetensors first (as
    transformers prefers them), else the pickled form."""
    for name, check in ((SAFE_WEIGHTS, safetensors_bytes), (PICKLED_WEIGHTS, pickled_bytes)):
        files = weight_shards(folder, name, key)
        if files:
            return sum(check(path, key) for path in files)
    return None


def weight_shards(folder: Path, name: str, key: str) -> list[Path]:
    """`folder/name`, or the shards its index (`name.index.json`) lists, each a file of `folder` itself."""
    if (folder / name).is_file():
        return [folder / name]
    index_path = folder / (name + INDEX)
    index = folder_json(index_path, key)
    if index is None:
        return []
    weight_map = index.get("weight_map")
    if not isinstance(weight_map, dict) or not weight_map:
        raise SentembConfigError(f"{key}: {index_path} has no weight_map of tensors to shard files. {FOLDER_FIX}")
    shards = sorted({str(shard) for shard in weight_map.values()})
    for shard in shards:
        if Path(shard).name != shard or not (folder / shard).is_file():
            raise SentembConfigError(
                f"{key}: {index_path} names the shard {shard!r}, which is not a file of {folder}. {FOLDER_FIX}"
            )
    return [folder / shard for shard in shards]


def safetensors_bytes(path: Path, key: str) -> int:
    """The bytes of tensors a safetensors file holds, read from its header alone: a length, then a JSON table of
    tensors and their byte ranges, which must lie within the file."""
    size = path.stat().st_size
    try:
        with path.open("rb") as handle:
            length = int.from_bytes(handle.read(8), "little")
            if size < 8 or not 0 < length <= min(MAX_SAFETENSORS_HEADER, size - 8):
                raise ValueError(f"a header of {length} bytes in a file of {size}")
            header = parse_json(handle.read(length).decode("utf-8"), path, FOLDER_FIX)
    except (OSError, UnicodeDecodeError, ValueError) as err:
        raise SentembConfigError(f"{key}: {path} is not a whole safetensors file ({err}). {FOLDER_FIX}") from None
    tensors = {name: entry for name, entry in header.items() if name != "__metadata__"}
    ends = [entry.get("data_offsets", [0, 0])[1] for entry in tensors.values() if isinstance(entry, dict)]
    if len(ends) != len(tensors) or not all(isinstance(end, int) and 0 <= end for end in ends):
        raise SentembConfigError(f"{key}: {path}: its header's tensor table is malformed. {FOLDER_FIX}")
    if 8 + length + max(ends, default=0) > size:
        raise SentembConfigError(
            f"{key}: {path} is truncated: its header places tensors up to byte {8 + length + max(ends)}, the file "
            f"has {size}. {FOLDER_FIX}"
        )
    return max(ends, default=0)


def pickled_bytes(path: Path, key: str) -> int:
    """The size of a pickled weights file whose pickle names nothing but what torch's weights-only loader builds
    (read by opcode, nothing run); refused otherwise, naming what it names."""
    try:
        unsafe = torch.serialization.get_unsafe_globals_in_checkpoint(path)
    except (ValueError, RuntimeError, OSError, EOFError) as err:
        raise SentembConfigError(
            f"{key}: {path} is a pickle, not the archive torch.save writes ({err}); sentemb never unpickles other "
            f"files. {CONVERT_FIX}"
        ) from None
    if unsafe:
        raise SentembConfigError(
            f"{key}: {path} is a pickle that names code to call when loaded ({', '.join(unsafe[:5])}), not weights "
            f"alone: refused, nothing in it was run. {CONVERT_FIX}"
        )
    return path.stat().st_size


def check_declared_sizes(
    config: Mapping[str, Any],
    named: str,
    stored: int | None = None,
    built_from_options: bool = False,
    fix: str = FOLDER_FIX,
) -> None:
    """The sizes a model config declares (`SIZE_LIMITS`: a folder's config.json, or a tiny model's options), each a
    whole number within its limit, checked before anything is allocated (`named`: where the sizes come from); and
    the parameters they imply at least (`least_parameters`) within what the weights hold (`stored` bytes, at half a
    byte a parameter or more), or, for a model built from its options alone (`built_from_options`), within the
    machine's memory at its dtype's bytes. `fix`: the fix of a file's sizes."""
    sizes = {}
    for name, limit in SIZE_LIMITS.items():
        value = config.get(name)
        if value is not None:  # options are keys of their own (model.backbone.vocab_size); a file's are in it
            key = f"{named}.{name}" if built_from_options else f"{named}: {name}"
            wanted = "a size within that range" if built_from_options else fix.removeprefix("Fix: ")
            sizes[name] = require_whole(key, value, Bounds(1, limit), wanted)
    least = least_parameters(sizes)
    if stored is not None and least / 2 > stored:
        raise SentembConfigError(
            f"{named} declares at least {least:,} parameters ({declared(sizes)}), but its weights hold {stored:,} "
            f"bytes: the config does not describe these weights, and building it would allocate "
            f"~{in_gib(4 * least)} before reading them. {fix}"
        )
    needed = least * dtype_bytes(config.get("torch_dtype"))
    memory = memory_short_of(needed) if built_from_options else None
    if memory is not None:
        raise SentembConfigError(
            f"{named} declares at least {least:,} parameters ({declared(sizes)}): ~{in_gib(needed)}, more than this "
            f"machine allows ({in_gib(memory)}). Fix: smaller sizes"
        )


def least_parameters(sizes: Mapping[str, int]) -> int:
    """The parameters a transformer of `sizes` has at least: its token embeddings and two hidden x intermediate
    matrices per layer (BERT's MLP; gated decoders have three)."""
    hidden = sizes.get("hidden_size", 0)
    layers, intermediate = sizes.get("num_hidden_layers", 0), sizes.get("intermediate_size", 0)
    return sizes.get("vocab_size", 0) * hidden + 2 * layers * hidden * intermediate


def declared(sizes: Mapping[str, int]) -> str:
    return ", ".join(f"{name} {value}" for name, value in sizes.items())


def dtype_bytes(dtype: object) -> int:
    """Bytes per parameter of a model built at `dtype` (a torch_dtype option; null: float32)."""
    return 2 if dtype in ("bfloat16", "float16") else 4


def memory_short_of(needed: int) -> int | None:
    """None when `needed` bytes fit what one allocation sized from a config may take here (sentemb.common.memory's
    bound, or a visible GPU's memory if larger: a model built under a torch.device("cuda") context is allocated
    there), else that bound."""
    memory = allowed_bytes()
    if needed > memory and torch.cuda.is_available():  # asked only when the memory would not do
        memory = max(memory, torch.cuda.get_device_properties(0).total_memory)
    return None if needed <= memory else memory


@contextlib.contextmanager
def transformers_refusals(name_or_path: str, key: str) -> Iterator[None]:
    """Around a from_pretrained call: what transformers refuses in files it downloads as it loads (a hub model not yet
    in the cache when the pre-run checks ran `check_model_files`), said as sentemb's refusal naming `key`, not as
    transformers' advice to pass trust_remote_code=True: code of the model's own (`auto_map`), and a pickled
    weights file its weights-only loader refuses."""
    try:
        yield
    except ValueError as err:
        if "trust_remote_code" not in str(err):
            raise
        raise SentembConfigError(
            f"{key}={name_or_path}: its config names code of the model's own (auto_map) or a model_type this "
            f"transformers does not implement; sentemb never runs a model's own code. {FOLDER_FIX}"
        ) from None
    except pickle.UnpicklingError as err:
        raise SentembConfigError(
            f"{key}={name_or_path}: its pickled weights name code to call when loaded ({str(err).splitlines()[0]}): "
            f"refused, nothing in it was run. {CONVERT_FIX}"
        ) from None
