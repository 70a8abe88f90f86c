"""One check for every training checkpoint sentemb is handed (train's ckpt_path, evaluate, export, the best
checkpoint a run rescores): readable, whole, a sentemb checkpoint, and matching what it is asked to serve.

A checkpoint is a pickle, and a pickle can name any function to call while it loads. sentemb reads
one only with `torch.load(weights_only=True)`: its unpickler builds tensors, dicts, lists, tuples,
numbers and strings (all that sentemb writes: `SAFE_GLOBALS` adds nothing) and refuses anything else
before it runs. The configs inside are then built from sentemb's own parts only (encoders.build).
"""

from __future__ import annotations

import pickle
import zipfile
from pathlib import Path
from typing import Any

from sentemb.common.errors import SentembConfigError
from sentemb.common.file_values import Shape, checked
from sentemb.common.parts import KINDS, named_by_path, unknown_part

# torch is imported where a checkpoint is loaded: a checkpoint file's checks (`check_checkpoint_file`) run without it

# types beyond torch's weights-only set that sentemb checkpoints hold: none (rng_states keeps numpy's state as tensors)
SAFE_GLOBALS: list[Any] = []
# what Lightning writes for every LightningModule, and the parts SentembModule saves as hyper-parameters
REQUIRED_KEYS = ("state_dict", "hyper_parameters", "pytorch-lightning_version")
REQUIRED_HPARAMS = ("model", "pooling", "loss")

HPARAMS = (
    "model",
    "pooling",
    "loss",
    "optimizer",
    "scheduler",
    "head",
    "grad_cache",
    "compile",
    "adapter",
    "negatives",  # a negatives part (sentemb/training/negatives/)
    "auxiliary",  # an auxiliary term (sentemb/training/auxiliary/)
    "matryoshka",  # Matryoshka sizes around the loss (sentemb/losses/matryoshka.py)
    "teacher",  # the frozen teacher's identity (sentemb/training/teacher.py): its weights are never saved
)
RETIRED_HPARAMS = ("gather_negatives",)  # saved by older checkpoints, read by nothing now
RENAMED_HPARAMS = {"soft_negatives": "auxiliary"}  # older checkpoints' names of today's hyper-parameters
# what SentembModule saves as hyper-parameters: parts by their registry names (sentemb.common.parts), looked up when
# built; `_target_` stands at the optimizer and scheduler (torch's and transformers' own, checked by name before
# Lightning builds them) and, in checkpoints written before registry names, at the parts (`current_part` reads them)
HPARAMS_SHAPE = Shape(
    keys={"": (*HPARAMS, *RETIRED_HPARAMS, *RENAMED_HPARAMS)},
    targets=("model.backbone", "model.tokenizer", "pooling", "head", "loss", "optimizer", "scheduler"),
)
BASE_SHAPE = Shape(keys={"": ("name", "config_sha256")})
CHECKPOINT_FIX = "Fix: pass a checkpoint written by sentemb.train, unchanged"
BACKBONE_WEIGHTS = "encoder.backbone."  # the backbone's keys in a checkpoint's state dict

# keys older checkpoints carry that no constructor takes any more (HiCL's length now lives in data.max_length)
RETIRED_KEYS = {("pooling", "hicl"): ("train_max_length",)}


def renamed_hparams(hparams: dict[str, Any]) -> dict[str, Any]:
    """Hyper-parameters under today's names (`RENAMED_HPARAMS`), the retired ones dropped."""
    return {RENAMED_HPARAMS.get(key, key): value for key, value in hparams.items() if key not in RETIRED_HPARAMS}


def current_part(kind: str, node: Any) -> Any:
    """A `kind` part config as today's registry reads it: the one migration of stored configs. Configs written before
    parts had registry names name them by Python path (`_target_: sentemb.encoders.pooling.CLSPooling`, or older,
    `sentemb.pooling.CLSPooling`): the path becomes the registered part's name (matched against the registry, never
    imported; an unknown path is left for `lookup` to refuse), and keys no constructor takes any more are dropped."""
    if not isinstance(node, dict):
        return node
    if "_target_" in node:  # it, not a `name` beside it, says what the node builds
        target = node["_target_"]
        name = named_by_path(kind, target) if isinstance(target, str) else None
        if name is None:
            raise unknown_part(kind, "_target_", target)
        node = {**{k: v for k, v in node.items() if k not in ("_target_", "name")}, "name": name}
    retired = RETIRED_KEYS.get((kind, node.get("name")), ())
    return {k: v for k, v in node.items() if k not in retired}


def checkpoint_problem(path: Path) -> str:
    """Why `path` is not a whole torch checkpoint ('' if it is): torch.save writes a zip whose CRCs cover it all."""
    try:
        with zipfile.ZipFile(path) as archive:
            bad = archive.testzip()
    except (zipfile.BadZipFile, OSError, EOFError) as err:
        return f"{type(err).__name__}: {err}"
    return f"member {bad} fails its CRC check" if bad else ""


ZIP_MAGIC = b"PK\x03\x04"  # how every zip archive, and so every file torch.save writes, begins


def what_else_it_is(path: Path) -> str:
    """What a file that does not begin as a zip archive is ('' when it does, or is empty: a truncated write, for
    `checkpoint_problem`): a text file (its first line shown) or another binary file (its first bytes)."""
    try:
        with path.open("rb") as handle:
            head = handle.read(4096)
    except OSError:
        return ""  # unreadable: `checkpoint_problem` names the system's reason
    if not head or head.startswith(ZIP_MAGIC):
        return ""
    try:
        text = head.decode("utf-8")
    except UnicodeDecodeError as err:
        if err.start < len(head) - 3:  # not a character cut at the 4096th byte
            return f"a binary file beginning {head[:8]!r}"
        text = head[: err.start].decode("utf-8")
    first = next((line.strip() for line in text.splitlines() if line.strip()), "")
    return f"a text file (its first line: {first[:60]!r})"


def previous_good_checkpoint(path: Path) -> Path | None:
    """The newest other whole checkpoint next to `path` (e.g. the best-step one), or None."""
    others = sorted((p for p in path.parent.glob("*.ckpt") if p != path), key=lambda p: -p.stat().st_mtime)
    return next((p for p in others if not checkpoint_problem(p)), None)


def check_checkpoint_file(path: str | Path, key: str = "checkpoint") -> Path:
    """`path` (expanded) when it is a file that begins as torch's zip archive, else a SentembConfigError naming it as
    `key=path` with the fix: what `read_checkpoint` checks first, torch-free (the commands check `checkpoint=` before
    torch is imported)."""
    path = Path(path).expanduser()
    named = f"{key}={path}" if key else str(path)
    if not path.is_file():
        raise SentembConfigError(
            f"{named}: no such checkpoint file. Fix: point it at a .ckpt written by sentemb.train "
            "(a run's checkpoints/best-step<N>.ckpt or last.ckpt)"
        )
    other = what_else_it_is(path)
    if other:  # not torch's archive at all: no truncation, and no earlier checkpoint of the same run to point at
        raise SentembConfigError(
            f"{named} is not a checkpoint: it is {other}, and a checkpoint is the zip archive torch.save writes. "
            f"Fix: point {key or 'ckpt_path'} at a .ckpt written by sentemb.train (a run's "
            "checkpoints/best-step<N>.ckpt or last.ckpt)"
        )
    return path


def read_checkpoint(path: str | Path, key: str = "checkpoint", mmap: bool = False) -> dict[str, Any]:
    """The sentemb training checkpoint at `path`, loaded on the CPU without running anything it holds; a
    SentembConfigError naming the file (as `key=path`; `key=""`: the path alone) and the fix if it is missing,
    truncated, corrupt, holds other objects, or is not a sentemb checkpoint. `mmap`: tensors stay on disk (a check)."""
    import torch

    path = check_checkpoint_file(path, key)
    named = f"{key}={path}" if key else str(path)
    problem = checkpoint_problem(path)
    if problem:
        earlier = previous_good_checkpoint(path)
        target = key or "ckpt_path"
        fallback = (
            f"the previous good checkpoint is {earlier}: use {target}={earlier}"
            if earlier
            else f"point {target} at a whole .ckpt written by sentemb.train (none other is in {path.parent})"
        )
        # starting afresh fixes a resume only: a checkpoint read as a model to score, serve or learn from needs another
        afresh = ", or train afresh in a new run directory" if target == "ckpt_path" else ""
        raise SentembConfigError(
            f"{named} is truncated or corrupt ({problem}). Fix: {fallback}{afresh}. Nothing was deleted."
        )
    try:
        with torch.serialization.safe_globals(SAFE_GLOBALS):
            checkpoint = torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
    except (pickle.UnpicklingError, RuntimeError, AttributeError, ValueError) as err:
        raise SentembConfigError(
            f"{named} was refused: it holds objects a sentemb checkpoint never holds ({what_it_names(path, err)}). "
            "Nothing in it was run. Fix: pass a checkpoint written by sentemb.train; a file from elsewhere is loaded "
            "only if it holds tensors and plain values"
        ) from None
    check_sentemb_checkpoint(checkpoint, named)
    # its configs are data: plain values, `_target_`s only where a part or a record of training stands
    checked(checkpoint["hyper_parameters"], f"{named} (hyper_parameters)", HPARAMS_SHAPE, CHECKPOINT_FIX)
    checked(checkpoint.get("base_model"), f"{named} (base_model)", BASE_SHAPE, CHECKPOINT_FIX)
    try:  # its parts by today's registry names (a checkpoint written before them names Python paths)
        checkpoint["hyper_parameters"] = current_hparams(checkpoint["hyper_parameters"])
    except SentembConfigError as err:
        raise SentembConfigError(f"{named}: {err}") from None
    return checkpoint


def check_stored_sizes(checkpoint: dict[str, Any], named: str = "checkpoint") -> None:
    """The sizes a checkpoint's model config declares (a model built from its options: a tiny model's vocab_size,
    hidden_size, ...) within what its backbone weights hold, checked before a model of those sizes is built from it
    (`encoders.build.encoder_from_checkpoint`); an adapter checkpoint holds no base weights to compare (its base is
    rebuilt, its sizes bounded as any model's)."""
    import torch

    from sentemb.encoders.models.model_files import check_declared_sizes  # the model loaders' package: transformers

    model = checkpoint["hyper_parameters"]["model"]
    backbone = current_part("model.backbone", model.get("backbone") or {})
    if "base_model" in checkpoint or not isinstance(backbone, dict):
        return
    stored = sum(
        tensor.numel() * tensor.element_size()
        for key, tensor in checkpoint["state_dict"].items()
        if key.startswith(BACKBONE_WEIGHTS) and isinstance(tensor, torch.Tensor)
    )
    if model.get("keep_layers") is not None:  # its weights hold the kept layers alone (model.keep_layers)
        backbone = {**backbone, "num_hidden_layers": len(model["keep_layers"])}
    check_declared_sizes(backbone, f"{named}: hyper_parameters.model.backbone", stored, fix=CHECKPOINT_FIX)


def current_hparams(hparams: dict[str, Any]) -> dict[str, Any]:
    """A checkpoint's hyper-parameters with every part config read by `current_part` (model loaders, pooling, head,
    loss), under today's names (`renamed_hparams`); the optimizer and scheduler are torch's and transformers' and keep
    their `_target_`."""
    hparams = renamed_hparams(hparams)
    model = hparams.get("model")
    if isinstance(model, dict):
        hparams["model"] = {
            **model,
            **{part: current_part(f"model.{part}", model[part]) for part in ("backbone", "tokenizer") if part in model},
        }
    for kind in ("pooling", "head", "loss"):
        if hparams.get(kind):
            hparams[kind] = current_part(kind, hparams[kind])
    return hparams


def what_it_names(path: Path, err: Exception) -> str:
    """The functions and classes a refused checkpoint's pickle names (read from its opcodes, nothing run)."""
    import torch

    try:
        names = torch.serialization.get_unsafe_globals_in_checkpoint(path)
    except Exception:  # noqa: BLE001 (a file torch cannot scan: the load's own error says why)
        names = []
    if names:
        return "it names " + ", ".join(names)
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    return lines[-1] if lines else type(err).__name__


def check_sentemb_checkpoint(checkpoint: Any, named: str) -> None:
    """A Lightning checkpoint of SentembModule: its weights, version and the model/pooling/loss it was trained with."""
    missing = [k for k in REQUIRED_KEYS if not isinstance(checkpoint, dict) or k not in checkpoint]
    hparams = checkpoint.get("hyper_parameters") if isinstance(checkpoint, dict) else None
    if not missing and isinstance(hparams, dict):
        missing = [f"hyper_parameters.{k}" for k in REQUIRED_HPARAMS if not isinstance(hparams.get(k), dict)]
    if not missing and not any(str(k).startswith("encoder.") for k in checkpoint["state_dict"]):
        missing = ["the encoder's weights (state_dict encoder.*)"]
    if missing:
        kind = type(checkpoint).__name__
        raise SentembConfigError(
            f"{named} is not a sentemb training checkpoint (a {kind} without {', '.join(missing)}). Fix: pass a "
            ".ckpt written by sentemb.train; for a plain Hugging Face model use model.name_or_path=<folder> instead"
        )


def model_label(model: dict[str, Any]) -> str:
    """A model config's short name: a tiny test model's loader (`tiny-bert`), else its folder's or hub name's last part
    (a packaged model's folder is `<package>/model`: the package's name)."""
    loader = str(current_part("model.backbone", model.get("backbone") or {}).get("name", ""))
    if loader.startswith("tiny"):
        return loader.replace("_", "-")
    path = Path(str(model.get("name_or_path") or "model"))
    return path.parent.name if path.name == "model" else path.name


def model_identity(model: dict[str, Any]) -> dict[str, Any]:
    """What fixes a model's weights: its loaders and their options, and the model's name (`model_label`: the same
    model installed elsewhere is the same model)."""
    short = model_label(model)
    parts = {part: current_part(f"model.{part}", model.get(part) or {}) for part in ("backbone", "tokenizer")}
    kept = model.get("keep_layers")  # which layers' weights there are (model.keep_layers; None: all, as before it)
    return {
        "name": short,
        **{f"{part}.{k}": v for part, node in parts.items() for k, v in node.items() if k != "name_or_path"},
        "keep_layers": None if kept is None else list(kept),
    }


# options that say where a part reads its data from, not what it computes: a resumed or served part may differ there
RUN_ONLY_OPTIONS = ("corpus", "cache_dir")


def config_differences(saved: dict[str, Any] | None, asked: dict[str, Any] | None, kind: str = "") -> list[str]:
    """The options of one part (a `kind` part: its stored config read by `current_part`) where `asked` differs from
    `saved` (`key: saved -> asked`); an option only one side has (one added since) counts only if it is the part's
    name or one side has no part at all."""
    if kind in KINDS:
        saved, asked = current_part(kind, saved), current_part(kind, asked)
    saved, asked = saved or {}, asked or {}
    if bool(saved) != bool(asked):
        return [f"{saved.get('name') or None} -> {asked.get('name') or None}"]
    keys = [k for k in dict.fromkeys([*saved, *asked]) if k == "name" or (k in saved and k in asked)]
    keys = [k for k in keys if k not in RUN_ONLY_OPTIONS]
    return [f"{k}: {saved.get(k)!r} -> {asked.get(k)!r}" for k in keys if saved.get(k) != asked.get(k)]


def check_checkpoint_serves(hparams: dict[str, Any], asked: dict[str, Any], path: Path, key: str, fix: str) -> None:
    """The checkpoint's model/pooling/head against the parts a command asks for (`asked`: only the parts given);
    a difference is refused, naming the file, the part, its options on both sides and `fix`."""
    for part, wanted in asked.items():
        if part == "model":
            differences = config_differences(model_identity(hparams.get("model") or {}), model_identity(wanted or {}))
        else:
            differences = config_differences(hparams.get(part), wanted, part)
        if differences:
            raise SentembConfigError(
                f"{key}={path} was trained with another {part} than the one asked for ({'; '.join(differences)}). "
                f"Fix: {fix}"
            )
