"""`python -m sentemb.export checkpoint=<ckpt> out=<dir>` (or `model=<name> pooling=<name> out=<dir>`).

Writes a sentence-transformers model folder through sentence-transformers' own API, loadable with
`SentenceTransformer(dir)`:
- `cls` / `mean` on BERT/RoBERTa: its Transformer and Pooling modules; SimCSE's train-only MLP is left
  out (a Dense + Tanh module keeps it where `pooling.mlp=always`, Dense alone for `mlp_activation=none`;
  Tanh before the Linear, `mlp_activation=before`, has no Dense form and exports as sentemb's module);
- `prompt`, `hicl`, `head=sarcse` and every decoder LLM: one `sentemb.st_modules.SentembEncoder`
  module (sentemb's own pooling and head, config and weights saved in the folder). Decoders take it
  whatever their pooling, mean included: sentemb gives them explicit position ids under left padding
  and appends EOS for last-token pooling, which sentence-transformers' Transformer module does not;
  their config.json keeps `is_causal` as trained, so the folder loads bidirectional where it trained so.
A checkpoint trained with a LoRA adapter (`adapter=lora`) exports with the adapter merged into the
base weights (peft's merge_and_unload); `adapter_only=true` writes peft's adapter folder instead (the
adapter, the tokenizer, sentemb's pooling and the base model it needs: `st_modules.load_adapter_folder`).
A head that only trains (MNTP, around its pooling) is left out: the folder embeds with its pooling.
`whitening=<corpus file>` fits BERT-whitening on the exported encoder's embeddings of the corpus and ends the
folder with sentence-transformers' own Dense module computing (x − μ)W (and format=onnx's graph with the same map),
its fit recorded in `sentemb_whitening.json` and the card (docs/export.md#whitening).
The folder's README.md is a model card: a name unique to the training run, the training config,
the STS table (from `results.json` beside the checkpoint, or `evaluate=true`) and the commands.
The folder is built in a staging folder beside `out=` and renamed into place whole, its card written last
(docs/export.md): an export stopped part-way, even by SIGKILL, leaves `out=` as it was.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import sys
import tempfile
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import hydra
import numpy as np
import torch
import yaml
from omegaconf import DictConfig, OmegaConf
from safetensors.torch import load_file, save_file

from sentemb.common.command_line import checked_command_line
from sentemb.common.errors import SentembConfigError
from sentemb.common.file_values import Shape, read_json, read_yaml
from sentemb.common.folder_lock import LOCK_NAME, FolderLock, enclosing_locks, take_folder_lock
from sentemb.common.hydra_plumbing import resolved_container
from sentemb.common.parts import NATIVE, TRAINS_ONLY, declared_part
from sentemb.common.paths import CONF_DIR, resolve_data_root
from sentemb.common.process import configure_process
from sentemb.common.published_files import exit_on_sigterm, publish_folder, publish_text, staging_folder
from sentemb.encoders.checkpoint import current_part, model_label
from sentemb.encoders.encoder import SentenceEncoder
from sentemb.encoders.models.adapters import is_adapted, merged
from sentemb.encoders.models.backbones import check_model
from sentemb.encoders.part_configs import is_decoder_config
from sentemb.encoders.poolings.encoder_poolings import CLSPooling, mlp_linear
from sentemb.encoders.serving.onnx_embedder import OnnxEncoder
from sentemb.encoders.serving.onnx_graph import check_graph_parts, write_onnx_folder
from sentemb.eval.deployed import ArtefactCheck, artefact_table
from sentemb.eval.report import markdown_report
from sentemb.eval.suite import RESULTS_SHAPE, evaluate, load_encoder, served_checkpoint
from sentemb.eval.whitening import TASK as WHITEN_TASK
from sentemb.eval.whitening import (
    WHITENING_FIX,
    Whitening,
    WhiteningCorpus,
    check_dim_fits,
    check_rank,
    check_whitening_dim,
    embedding_size,
    whitening_corpus,
)
from sentemb.st_modules import EXPORT_CARD, WHITENING, FolderConfig, SentembEncoder, folder_model, save_sentemb_parts


def sentence_transformer(
    encoder: SentenceEncoder, model: dict[str, Any], pooling: dict[str, Any], head: dict[str, Any] | None
):
    """The encoder as a SentenceTransformer built from sentence-transformers' modules where they exist (BERT/RoBERTa
    with cls or mean pooling), else as sentemb's module."""
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.base.modules.dense import Dense
    from sentence_transformers.base.modules.transformer import Transformer
    from sentence_transformers.sentence_transformer.modules.pooling import Pooling

    pooler = encoder.pooling
    declared = declared_part(pooler)
    tanh_first = isinstance(pooler, CLSPooling) and pooler.mlp_use == "always" and pooler.mlp_activation == "before"
    native = declared is not None and declared.export == NATIVE  # the pooling says sentence-transformers has it
    # Dense applies Tanh after its Linear; a decoder needs sentemb's positions (and EOS, for last-token pooling)
    if head or not native or tanh_first or is_decoder_config(model):
        module = SentembEncoder(encoder, pooling, head, folder_model(model, encoder))
        return SentenceTransformer(modules=[module], device="cpu")
    with tempfile.TemporaryDirectory() as folder:  # Transformer loads from a folder: the backbone as trained
        encoder.backbone.save_pretrained(folder)
        encoder.tokenizer.save_pretrained(folder)
        with_unused_pooler(Path(folder), encoder.backbone)
        transformer = Transformer(folder)
        modules = [transformer, Pooling(encoder.hidden_size, declared.name)]  # a native pooling's name is its mode
        if isinstance(pooler, CLSPooling) and pooler.mlp is not None and pooler.mlp_use == "always":
            linear = mlp_linear(pooler.mlp)
            activation = torch.nn.Tanh() if pooler.mlp_activation == "after" else torch.nn.Identity()
            modules.append(Dense(linear.in_features, linear.out_features, True, activation, linear.weight, linear.bias))
        return SentenceTransformer(modules=modules, device="cpu")


def with_unused_pooler(folder: Path, backbone: torch.nn.Module) -> None:
    """BERT/RoBERTa load with a pooler (Dense + Tanh) that sentemb drops and sentence-transformers' Pooling never
    reads: zeros are saved for it, so that loading the folder (here and by its users) initialises no weights."""
    weights = folder / "model.safetensors"
    if getattr(backbone, "pooler", "absent") is not None or not weights.is_file():  # no pooler in this family
        return
    tensors = load_file(weights)
    size = backbone.config.hidden_size
    tensors |= {"pooler.dense.weight": torch.zeros(size, size), "pooler.dense.bias": torch.zeros(size)}
    save_file(tensors, weights, metadata={"format": "pt"})


def model_name(source: dict[str, Any]) -> str:
    """sentemb-<backbone>-<pooling>[-<head>][-lora]-<loss>-<training run folder>: unique per training run."""
    parts = ["sentemb", model_label(source["model"]), short("pooling", source["pooling"])]
    if source.get("head"):
        parts.append(short("head", source["head"]))
    if source.get("adapter"):
        parts.append("lora")
    if source.get("loss"):
        parts.append(short("loss", source["loss"]))
    checkpoint = source.get("checkpoint")
    parts.append(Path(checkpoint).parent.parent.name if checkpoint else "untrained")
    return "-".join(parts)


def short(kind: str, node: dict[str, Any]) -> str:
    """A part's registry name (a config written before registry names: its path read by `current_part`)."""
    return str(current_part(kind, node).get("name") or "?").rsplit(".", 1)[-1]


def beside_results(checkpoint: str | None) -> Path | None:
    """`results.json` of a sentemb.evaluate run kept next to the checkpoint (its folder or its run folder)."""
    if not checkpoint:
        return None
    for folder in (Path(checkpoint).parent, Path(checkpoint).parent.parent):
        if (folder / "results.json").is_file():
            return folder / "results.json"
    return None


def model_card(
    name: str,
    source: dict[str, Any],
    results: dict[str, Any] | None,
    commands: list[str],
    usage: list[str],
    library: str = "sentence-transformers",
) -> str:
    """README.md of an exported folder: `usage`, how to load it (`folder_usage` or `adapter_usage`)."""
    parts = ("model", "pooling", "head", "adapter", "loss", "optimizer", "scheduler")
    config = {k: source[k] for k in parts if source.get(k)}
    trained = bool(source.get("checkpoint"))
    pooling = short("pooling", source["pooling"])
    about = (
        "A sentence encoder trained with sentemb (unsupervised contrastive sentence embeddings)."
        if trained
        else f"An untrained encoder: {model_label(source['model'])} with {pooling} pooling as loaded, "
        "exported by sentemb without training (a baseline)."
    )
    lines = [
        "---",
        f"library_name: {library}",
        "tags: [sentence-transformers, sentence-similarity, sentemb]",
        "---",
        f"# {name}",
        "",
        about,
        "",
        *usage,
        "",
        f"Source: `{source.get('checkpoint') or 'no checkpoint (untrained ' + pooling + ')'}`",
        "",
        "## STS (Spearman x100, SentEval protocol)",
        "",
        demoted(markdown_report(results))
        if results
        else "Not evaluated: `python -m sentemb.export ... evaluate=true`.",
        "",
        "## Commands",
        "",
        "```bash",
        *commands,
        "```",
        "",
        "## Training config" if trained else "## Config",
        "",
        "```yaml",
        yaml.safe_dump(portable(config), sort_keys=False).rstrip(),
        "```",
    ]
    return "\n".join(lines) + "\n"


def attention_note(model: dict[str, Any], adapter_folder: bool = False) -> list[str]:
    """A decoder's attention as trained: kept in config.json (`is_causal`), or what the base must be loaded with."""
    if not is_decoder_config(model):
        return []
    causal = "false" if model["bidirectional"] else "true"
    way = "bidirectional" if model["bidirectional"] else "causal"
    if adapter_folder:
        return ["", f"Attention: {way} as trained: load the base with `is_causal={causal.title()}` (transformers 5.2+)"]
    return ["", f"Attention: {way}, as trained (`is_causal: {causal}` in config.json; transformers 5.2+ loads it so)."]


def folder_usage(source: dict[str, Any], custom: bool) -> list[str]:
    """How a sentence-transformers folder loads, and what it holds."""
    lines = [
        "```python",
        "from sentence_transformers import SentenceTransformer",
        f"model = SentenceTransformer('<this folder>'{', trust_remote_code=True' if custom else ''})",
        "```",
    ]
    if custom:
        lines += [
            "",
            "This folder holds a `sentemb.st_modules.SentembEncoder` module (sentemb's own pooling or head), so "
            "`sentemb` must be installed, and sentence-transformers >= 6 imports a module class from outside "
            "its own package only with `trust_remote_code=True`, which lets it import any module `modules.json` "
            "names. For a copy of this folder from elsewhere, `sentemb.st_modules.load_exported_folder('<this "
            "folder>')` checks that `modules.json` names only sentence-transformers' modules and sentemb's first.",
        ]
    adapter = source.get("adapter")
    if adapter:
        lines += [
            "",
            f"Trained with a LoRA adapter (r={adapter['r']}, alpha={adapter['alpha']}), merged here into the base "
            f"weights ({model_label(source['model'])}): the folder is a whole model, no peft needed.",
        ]
    return lines + attention_note(source["model"])


def adapter_usage(source: dict[str, Any], base: dict[str, Any]) -> list[str]:
    """How an adapter folder loads: the base model it needs, then the adapter."""
    model = source["model"]
    name = model.get("name_or_path") if not model_label(model).startswith("tiny") else model_label(model)
    lines = [
        f"Only a LoRA adapter (peft; r={source['adapter']['r']}, alpha={source['adapter']['alpha']}), the tokenizer "
        "and sentemb's pooling: it needs its base model,",
        "",
        f"- base model: `{name}` (config fingerprint `{base['config_sha256']}`, sentemb model config below)",
    ]
    if model.get("init_from"):
        lines.append(f"- with the adapter of `{model['init_from']}` merged into it (model.init_from)")
    lines += [
        "",
        "```python",
        "from sentemb.st_modules import load_adapter_folder",
        "encoder = load_adapter_folder('<this folder>')  # name_or_path='<base folder>' if the base is elsewhere",
        "embeddings = encoder.encode(['A sentence.'])",
        "```",
        "",
        "It rebuilds the base from the config saved in `sentemb_config.json`, refuses a base whose config "
        "fingerprint differs, and loads the adapter with peft's `PeftModel.from_pretrained`. The sentence vector "
        f"is sentemb's {short('pooling', source['pooling'])} pooling (`sentemb_config.json`, "
        "`sentemb_pooling.safetensors`). "
        "For a sentence-transformers folder with the adapter merged, export without `adapter_only=true`.",
    ]
    return lines + attention_note(model, adapter_folder=True)


# a model shipped inside a Python package, as conf/model/ names it (not this machine's install path)
PACKAGED_MODEL = re.compile(r"^.*[/\\]site-packages[/\\](\w+)[/\\]model$")


def portable(node: Any) -> Any:
    """`node` with every packaged model's install path written as conf/model/ writes it: `${packaged_model:<pkg>}`."""
    if isinstance(node, dict):
        return {k: portable(v) for k, v in node.items()}
    if isinstance(node, list):
        return [portable(v) for v in node]
    return PACKAGED_MODEL.sub(r"${packaged_model:\1}", node) if isinstance(node, str) else node


def readable_by_all(folder: Path) -> None:
    """Files written through temporary files (model.safetensors: mode 0600) get the modes the umask gives new files."""
    umask = os.umask(0)
    os.umask(umask)
    for path in folder.rglob("*"):
        if path.is_file():
            path.chmod(0o666 & ~umask)


def demoted(markdown: str) -> str:
    """The evaluation report's headings one level under the card's section."""
    return "\n".join("##" + line if line.startswith("#") else line for line in markdown.splitlines())


def training_command(checkpoint: str | None) -> list[str]:
    """The `python -m sentemb.train ...` line of the checkpoint's run, from its .hydra/overrides.yaml."""
    if not checkpoint:
        return []
    overrides = Path(checkpoint).parent.parent / ".hydra" / "overrides.yaml"
    if not overrides.is_file():
        return []
    # the one rule for files: strings shown in the card, never applied (an interpolation there is the user's own)
    words = read_yaml(overrides, Shape(text=("",)), HYDRA_FILES_FIX) or []
    if not isinstance(words, list) or not all(isinstance(word, str) for word in words):
        raise SentembConfigError(f"{overrides}: expected a list of key=value strings. {HYDRA_FILES_FIX}")
    return [" ".join(["python -m sentemb.train", *map(shlex.quote, words)])]


HYDRA_FILES_FIX = "Fix: restore the run's .hydra/ files, or move them away (the card then has no training command)"


# results.json (sentemb.evaluate): scores and the record of what was evaluated (its parts by registry name; older
# files by `_target_` path, shown only)


def export(cfg: DictConfig) -> Path:
    if not cfg.get("out"):
        raise SentembConfigError("out is not set. Fix: python -m sentemb.export checkpoint=<ckpt> out=<folder>")
    out = Path(cfg.out).expanduser()
    if out.is_symlink():  # a link named as out=: the folder it names is out= (the export is renamed to that path)
        if not out.exists():
            raise SentembConfigError(f"out={out} is a link to nothing ({os.readlink(out)}). Fix: pass a new folder")
        out = Path(os.path.realpath(out))
    if out.exists() and not out.is_dir():
        raise SentembConfigError(f"out={out} is a file, not a folder: nothing is overwritten. Fix: pass a new folder")
    # out= inside a folder another live command holds (a training run's): refused like a second writer there, before
    # anything is made in it; held until the export ends
    made: Path | None = None
    lock: FolderLock | None = None
    with enclosing_locks(out, f"out={out}", "wait for it to finish, or pass an out= outside it"):
        try:  # one export per folder: a second one into the same out= is refused before its emptiness check
            made = make_out_folder(out)  # the lock file lives in it
            lock = take_folder_lock(out, f"out={out}", "wait for that export to finish, or pass another out=")
            with exit_on_sigterm():  # a SIGTERM removes the staging folder as any failure does
                name, written = locked_export(cfg, out, lock)
        except BaseException:  # a refused or failed export leaves no lock file and no folder of its own making
            if lock is not None:
                lock.release(remove=lock.claimed)
            remove_made_folders(out, made)
            raise
    lock.release()  # its lock file went when the export was renamed into place: the folder holds its artefacts only
    print(f"{name}: {written} written to {out}")
    return out


def make_out_folder(out: Path) -> Path | None:
    """`out` made with its missing parents; the topmost folder this made (None: `out` was there)."""
    missing = [folder for folder in (out, *out.parents) if not folder.exists()]
    out.mkdir(parents=True, exist_ok=True)
    return missing[-1] if missing else None


def remove_made_folders(out: Path, top: Path | None) -> None:
    """The folders `make_out_folder` made, from `out` up to `top`, each only while empty (one another export holds
    has its lock file in it: it stays)."""
    if top is None:
        return
    for folder in (out, *out.parents):
        try:
            folder.rmdir()
        except OSError:
            return
        if folder == top:
            return


def locked_export(cfg: DictConfig, out: Path, lock: FolderLock) -> tuple[str, str]:
    """The export once `out`'s lock is held: `out` checked empty, claimed; the export written into a staging folder
    beside `out` and renamed into place whole (`publish_export`); (the model's name, what was written)."""
    if any(path.name != LOCK_NAME for path in out.iterdir()):
        raise SentembConfigError(f"out={out} is not empty: nothing is overwritten. Fix: pass a new folder")
    lock.claim()  # a second export into out= is refused naming this process
    corpus = check_whitening(cfg)  # whitening=<file>: read, counted and hashed before any model is built
    checkpoint = served_checkpoint(cfg)  # read and checked once, before any model is built
    if cfg.get("adapter_only"):
        check_adapter_only(cfg, checkpoint)
    artefact_check = check_format(cfg, checkpoint)  # format=onnx: its options, pooling and STS-B files
    # built beside out= and renamed into place once whole: an export stopped part-way (an error, SIGTERM, SIGKILL)
    # leaves out= as it was; its staging folder goes with it, or (SIGKILL) with the next export into out=
    with staging_folder(out) as staging:
        name, written = write_export(cfg, staging, checkpoint, artefact_check, corpus)
        publish_export(staging, out, lock)
    return name, written


def publish_export(staging: Path, out: Path, lock: FolderLock) -> None:
    """The whole export (`staging`) renamed to `out`, which holds only this process's lock file: the lock file goes
    first (while still locked), then the rename replaces the empty folder in one step."""
    lock.path.unlink()
    try:
        publish_folder(staging, out, replace_empty=True)
    except OSError as err:
        lock.release()  # its file is gone already: a lock file another command made since is never removed here
        if isinstance(err, FileExistsError):
            raise SentembConfigError(
                f"out={out}: another command wrote into it while this export ran; it was left as it is and nothing "
                "was exported. Fix: pass a new folder"
            ) from None
        raise SentembConfigError(
            f"out={out}: the finished export could not be renamed into place ({err.strerror}); nothing was "
            "exported. Fix: an out= folder that is not a mount point, on a file system that renames folders"
        ) from None


def write_export(
    cfg: DictConfig,
    out: Path,
    checkpoint: dict[str, Any] | None,
    artefact_check: ArtefactCheck | None,
    corpus: WhiteningCorpus | None = None,
) -> tuple[str, str]:
    """The checked export written into `out`; (the model's name, what was written)."""
    encoder, source, hparams = load_encoder(cfg, torch.device("cpu"), checkpoint)
    # the run's, for the card
    source.update({k: hparams[k] for k in ("adapter", "loss", "optimizer", "scheduler") if hparams.get(k)})
    name = model_name(source)
    commands = [*training_command(source.get("checkpoint")), "python -m sentemb.export " + " ".join(sys.argv[1:])]
    results_path = beside_results(source.get("checkpoint"))
    results = read_json(results_path, RESULTS_SHAPE) if results_path else None  # shown in the card: data only
    encoder, head = inference_parts(encoder.eval(), source.get("head"))
    if is_adapted(encoder.backbone) and not cfg.get("adapter_only"):  # the adapter's update added into the base
        encoder.backbone = merged(encoder.backbone)  # weights: a plain model
    # fitted on the encoder as exported, before evaluate=true's minutes (its dimension checks come first)
    whitening = fitted_whitening(encoder, corpus) if corpus else None
    if cfg.evaluate:  # whitening= and whitening_dim= pass on: the table scores the whitened embeddings
        defaults = OmegaConf.load(CONF_DIR / "eval.yaml")  # the evaluation's own settings
        eval_cfg = OmegaConf.merge({k: v for k, v in defaults.items() if k not in ("defaults", "hydra")}, cfg)
        results = evaluate(eval_cfg, out / "eval")
        target = f"checkpoint={source['checkpoint']}" if source.get("checkpoint") else "model=... pooling=..."
        commands.append(f"python -m sentemb.evaluate {target} tasks=sts" + evaluate_whitening(cfg))
    if cfg.get("adapter_only"):
        write_adapter_folder(encoder, source, head, checkpoint["base_model"], out)
        usage, library, written = adapter_usage(source, checkpoint["base_model"]), "peft", "LoRA adapter folder"
    else:
        model = sentence_transformer(encoder, source["model"], source["pooling"], head)
        dense = whitening_module(whitening) if whitening else None
        if dense is not None:
            model, record = with_whitening(model, dense, corpus, whitening)
        model.save(str(out), model_name=name)
        custom = any(type(module).__module__ == "sentemb.st_modules" for module in model)
        usage, library, written = folder_usage(source, custom), "sentence-transformers", "sentence-transformers folder"
        if dense is not None:
            write_whitening_record(out, record)
            usage += whitening_section(record, scored=bool(cfg.evaluate), table=results is not None)
            written += f" whitened ({record['input_dim']} -> {record['dim']} dimensions)"
        if cfg.get("format") == "onnx":
            linear = dense.linear if dense is not None else None
            usage += onnx_section(
                encoder, out, cfg.export.quantize, custom, artefact_check, short("pooling", source["pooling"]), linear
            )
            written += " with its ONNX graph"
    # the model card last: a folder holding it is a whole export (st_modules.check_whole_export)
    publish_text(out / EXPORT_CARD, model_card(name, source, results, commands, usage, library))
    readable_by_all(out)
    return name, written


def check_whitening(cfg: DictConfig) -> WhiteningCorpus | None:
    """whitening= and whitening_dim=, and the corpus file (read, counted, hashed), before any model loads; None: no
    whitening. The fit needs 2 sentences at least (a covariance) and, to keep k directions each with a variance,
    k + 1 distinct ones (n embeddings span n - 1 directions about their mean): with whitening_dim=k that is checked
    here, with all D directions once the encoder gives D (`fitted_whitening`)."""
    setting, dim = cfg.get("whitening"), cfg.get("whitening_dim")
    check_whitening_dim(setting, dim)  # evaluate's check too (sentemb.eval.whitening)
    if not setting:
        return None
    if setting == WHITEN_TASK:
        raise SentembConfigError(
            "whitening=task fits one map per STS task on that task's own sentences, an evaluation protocol "
            "(python -m sentemb.evaluate ... whitening=task); an exported model embeds any sentence with one map, "
            f"fitted before it ships. {WHITENING_FIX}"
        )
    if cfg.get("adapter_only"):
        raise SentembConfigError(
            "whitening= with adapter_only=true: peft's adapter folder has no sentence-transformers modules to end with "
            "the whitening. Fix: drop adapter_only=true (the merged model takes it), or drop whitening="
        )
    corpus = whitening_corpus(setting, dim)  # read, counted, hashed; fewer than 2 distinct sentences refused there
    if dim is not None:
        check_rank(corpus, dim, f"whitening_dim={dim}")
    return corpus


# a kept direction's variance below this fraction of the largest is refused at export: its standard deviation is under
# 1e-4 of the largest one's, so float32 embeddings (~7 significant digits) hold it only to a few digits, and whitening
# scales that rounding noise up to unit variance, differently in torch and ONNX Runtime (measured: tiny BERT's zero-
# variance LayerNorm direction comes out at ~1e-10, MiniLM's genuine directions at >= 1e-4)
NOISE_FLOOR = 1e-8


def fitted_whitening(encoder: SentenceEncoder, corpus: WhiteningCorpus) -> Whitening:
    """BERT-whitening fitted on the encoder's float32 embeddings of the corpus; refused (before the corpus is
    embedded) where whitening_dim exceeds the embedding's size D or, keeping all D, the corpus has fewer than D + 1
    distinct sentences, and (after) where the embeddings have no variance in a kept direction."""
    size = embedding_size(encoder, corpus.sentences[0])
    check_dim_fits(corpus.dim, size)
    keep = corpus.dim or size
    if corpus.dim is None:
        check_rank(corpus, size, f"whitening_dim=null (all of the embedding's {size})")
    whitening = Whitening.fit(encoder.encode(corpus.sentences), corpus.dim, f"whitening={corpus.path}")
    variances = whitening.variances()
    flat = int((variances < NOISE_FLOOR * variances[0]).sum()) if np.isfinite(variances).all() else keep
    if flat or not (np.isfinite(whitening.matrix).all() and np.isfinite(whitening.mean).all()):
        raise SentembConfigError(
            f"whitening={corpus.path}: the encoder's embeddings of its {corpus.distinct} distinct sentences have "
            f"(almost) no variance in {flat} of the {keep} directions kept (under {NOISE_FLOOR:g} x the largest: "
            "float32 rounding noise, which whitening would scale up to unit variance; a final LayerNorm, as in "
            "BERT, leaves one such direction). Fix: "
            f"whitening_dim=<at most {max(keep - flat, 1)}>, or a corpus of more varied sentences"
        )
    return whitening


def whitening_module(whitening: Whitening) -> Any:
    """sentence-transformers' own Dense module computing y = (x − μ)W as x Wᵀ + (−μW) (float32, no activation):
    loadable with `SentenceTransformer(folder)` alone, no sentemb, no trust_remote_code."""
    from sentence_transformers.base.modules.dense import Dense

    weight, bias = whitening.affine(np.float32)
    into, out = weight.shape[1], weight.shape[0]
    return Dense(into, out, True, torch.nn.Identity(), torch.from_numpy(weight), torch.from_numpy(bias))


def with_whitening(model: Any, dense: Any, corpus: WhiteningCorpus, whitening: Whitening) -> tuple[Any, dict]:
    """The SentenceTransformer with the whitening module after the pooling (before a Normalize module, were there
    one: whitening acts on the raw pooled vector), and the record of its fit (`sentemb_whitening.json`)."""
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.base.modules.normalize import Normalize

    modules = list(model)
    at = len(modules)
    while at > 0 and isinstance(modules[at - 1], Normalize):
        at -= 1
    modules.insert(at, dense)
    record = {
        "method": "BERT-whitening (Su et al. 2021): y = (x - mean) W, as the Dense module's y = x weight^T + bias "
        "with weight = W^T and bias = -mean W",
        "module": f"{at}_{type(dense).__name__}",  # sentence-transformers' folder name for module `at`
        "input_dim": int(whitening.matrix.shape[0]),
        "dim": int(whitening.matrix.shape[1]),
        "whitening_dim": corpus.dim,
        "corpus": corpus.path.name,
        "corpus_sha256": corpus.sha256,
        "sentences": len(corpus.sentences),
        "distinct_sentences": corpus.distinct,
        "fitted": datetime.now(UTC).isoformat(timespec="seconds"),
        "embeddings": "the exported encoder's, float32; mean and W fitted in float64, stored in float32",
    }
    return SentenceTransformer(modules=modules, device="cpu"), record


def write_whitening_record(out: Path, record: dict[str, Any]) -> None:
    """sentemb_whitening.json, once the folder is saved (its module's folder must be the one the record names)."""
    if not (out / record["module"] / "config.json").is_file():
        raise RuntimeError(f"{out}: sentence-transformers saved the whitening module elsewhere than {record['module']}")
    publish_text(out / WHITENING, json.dumps(record, indent=2) + "\n")


def whitening_section(record: dict[str, Any], scored: bool, table: bool) -> list[str]:
    """The model card's lines about the whitening module."""
    whose = (
        "The STS table scores the whitened embeddings (evaluate=true, with the same whitening= and whitening_dim=)."
        if scored
        else "The STS table above scored the encoder before whitening; `evaluate=true` scores the whitened one."
    )
    return [
        "",
        "## Whitening",
        "",
        f"The last module, `{record['module']}` (sentence-transformers' `Dense`: weight Wᵀ, bias −μW, no "
        f"activation), whitens the pooled embedding: y = (x − μ)W, {record['input_dim']} → {record['dim']} "
        "dimensions (BERT-whitening, Su et al. 2021). It was fitted by `sentemb.export` on this encoder's float32 "
        f"embeddings of `{record['corpus']}` ({record['sentences']} sentences, {record['distinct_sentences']} "
        f"distinct; sha256 `{record['corpus_sha256']}`) on {record['fitted']}; `{WHITENING}` records the fit. "
        "Embeddings are not normalised (the cosine is the similarity); a Normalize module after it changes no "
        "cosine.",
        *(["", whose] if table or scored else []),
    ]


def evaluate_whitening(cfg: DictConfig) -> str:
    """The whitening overrides of the card's evaluate command."""
    if not cfg.get("whitening"):
        return ""
    dim = cfg.get("whitening_dim")
    return f" whitening={cfg.whitening}" + (f" whitening_dim={dim}" if dim is not None else "")


class WhitenedEncoder:
    """`encoder.encode` followed by the whitening module's Linear: the torch reference of a whitened ONNX graph."""

    def __init__(self, encoder: SentenceEncoder, linear: torch.nn.Linear) -> None:
        self.encoder, self.linear = encoder, linear

    def encode(self, sentences: list[str], batch_size: int = 128, **kwargs: Any) -> np.ndarray:
        embeddings = torch.from_numpy(self.encoder.encode(sentences, batch_size=batch_size, **kwargs))
        with torch.no_grad():
            return self.linear(embeddings).numpy()


FORMATS = ("sentence-transformers", "onnx")


def check_format(cfg: DictConfig, checkpoint: dict[str, Any] | None) -> ArtefactCheck | None:
    """format= and export.quantize, and for format=onnx its pooling and the STS-B files export.measure reads, all
    checked before any model loads; the STS-B check to run (None: not measured, or not format=onnx)."""
    fmt, quantize = cfg.get("format", FORMATS[0]), OmegaConf.select(cfg, "export.quantize")
    if fmt not in FORMATS:
        raise SentembConfigError(f"format={fmt!r}: use sentence-transformers (the default) or onnx")
    if fmt != "onnx":
        if quantize:
            raise SentembConfigError(f"export.quantize={quantize} quantises an ONNX graph. Fix: add format=onnx")
        return None
    if cfg.get("adapter_only"):
        raise SentembConfigError(
            "format=onnx with adapter_only=true: an ONNX graph holds the whole model (the adapter merged), not an "
            "adapter. Fix: drop adapter_only=true"
        )
    parts = (
        checkpoint["hyper_parameters"]
        if checkpoint
        else {k: resolved_container(cfg.get(k)) for k in ("pooling", "head")}
    )
    check_graph_parts(parts["pooling"], parts.get("head"), quantize)
    if not OmegaConf.select(cfg, "export.measure", default=True):
        return None
    return ArtefactCheck(resolve_data_root(cfg.paths.data_dir) / "senteval" / "downstream" / "STS" / "STSBenchmark")


def onnx_section(
    encoder: SentenceEncoder,
    out: Path,
    quantize: str | None,
    custom: bool,
    check: ArtefactCheck | None,
    pooling: str,
    whitening: torch.nn.Linear | None = None,
) -> list[str]:
    """Write the ONNX graph(s), the loader and its recipe into `out`; the model card's lines about them. The encoder
    is made float32 (the graph's precision, and the reference the artefacts are measured against); `whitening`, the
    whitening Dense module's Linear, is the graph's last op and part of the reference."""
    recipe = write_onnx_folder(encoder, out, quantize, whitening)
    graphs, rows = recipe["graphs"], RECIPE_WORDS[recipe["rows"]["kind"]]
    lines = [
        "",
        "## ONNX: the pooling inside the graph",
        "",
        f"`{graphs['fp32']}` maps token ids to the sentence embedding (output `sentence_embedding`) with the "
        f"{pooling} pooling inside the graph"
        + (f"; `{graphs['int8']}` is its int8 form (ONNX Runtime's dynamic quantisation)." if quantize else ".")
        + (
            " The whitening is the graph's last op (the folder's Dense weights; float32 in every graph)."
            if whitening is not None
            else ""
        )
        + " `sentemb_onnx.py` embeds with it and needs only numpy, onnxruntime and tokenizers (no torch, no sentemb):",
        "",
        "```python",
        "from sentemb_onnx import load  # the folder's sentemb_onnx.py, beside your code or on sys.path",
        "model = load('<this folder>')"
        + ("  # load('<this folder>', file='onnx/model_qint8.onnx'): int8" if quantize else ""),
        "vectors = model.embed(['A sentence.', 'Another one.'])  # float32, one row per sentence",
        "```",
        "",
        f"Before the graph, {rows} (`sentemb_onnx.json`: `rows`). Scored as deployed, on SentEval: "
        "`python -m sentemb.evaluate onnx=<this folder> tasks=sts` (`onnx=<this folder>/onnx/model_qint8.onnx`: int8).",
    ]
    if not custom:
        lines += [
            "",
            "The folder is also sentence-transformers' ONNX layout: `SentenceTransformer('<this folder>', "
            "backend='onnx')` reads the graph's `last_hidden_state` output and pools it with its own Pooling module "
            "(`model_kwargs={'file_name': 'onnx/model_qint8.onnx'}` for int8); it needs `sentence-transformers[onnx]`.",
        ]
    if check is not None:
        files = {"torch": "model.safetensors", **{f"onnx {k}": v for k, v in graphs.items()}}
        artefacts = {f"onnx {k}": OnnxEncoder(out, file=v) for k, v in graphs.items()}
        reference = encoder if whitening is None else WhitenedEncoder(encoder, whitening)
        lines += ["", "### Measured", "", *artefact_table(check.measure(reference, artefacts), files, out)]
    return lines


RECIPE_WORDS = {
    "plain": "each sentence is tokenised as the tokenizer does it",
    "append": "each sentence is tokenised and EOS appended where the tokenizer did not end it with EOS",
    "template": "each sentence's tokens are placed in the pooling's prompt template (cut to fit its max_length)",
}


def check_adapter_only(cfg: DictConfig, checkpoint: dict[str, Any] | None) -> None:
    """adapter_only=true needs the checkpoint of a run trained with an adapter (which holds the base's fingerprint)."""
    if checkpoint is None:
        raise SentembConfigError(
            "adapter_only=true writes the LoRA adapter a run trained: it needs checkpoint=<ckpt of an adapter=lora "
            "run>. Fix: pass checkpoint=, or drop adapter_only=true"
        )
    if not checkpoint["hyper_parameters"].get("adapter") or "base_model" not in checkpoint:
        raise SentembConfigError(
            f"adapter_only=true: checkpoint={cfg.checkpoint} was trained without an adapter (adapter: null), so it "
            "holds no adapter to write. Fix: drop adapter_only=true (the whole model is exported)"
        )


def inference_parts(encoder: SentenceEncoder, head: dict[str, Any] | None) -> tuple[SentenceEncoder, dict | None]:
    """The encoder as it embeds: a head that declares it only trains (`export=TRAINS_ONLY`: MNTP, around its pooling,
    whose embeddings are its inner pooling's) is left out, with the head config; other heads (SARCSE) stay."""
    declared = declared_part(encoder.pooling)
    if declared is not None and declared.export == TRAINS_ONLY:  # the head says it only trains (MNTP)
        encoder.pooling = encoder.pooling.inner
        return encoder, None
    return encoder, head


def write_adapter_folder(
    encoder: SentenceEncoder, source: dict[str, Any], head: dict[str, Any] | None, base: dict[str, Any], out: Path
) -> None:
    """peft's adapter folder (adapter_config.json, adapter_model.safetensors: the adapter only), the tokenizer, and
    sentemb's pooling with the base model it needs (sentemb_config.json's `base`: name, fingerprint, model config)."""
    out.mkdir(parents=True, exist_ok=True)
    # sentemb never resizes the vocabulary: no embedding layer to save beside the adapter (and no hub look-up)
    encoder.backbone.save_pretrained(str(out), save_embedding_layers=False)
    config = FolderConfig(
        source["pooling"], head, folder_model(source["model"], encoder), {**base, "model": source["model"]}
    )
    save_sentemb_parts(out, encoder, config)


@checked_command_line  # an unquoted non-ASCII override: named with its fix, before Hydra's lexer
@hydra.main(version_base="1.3", config_path=str(CONF_DIR), config_name="export")
def main(cfg: DictConfig) -> None:
    configure_process()
    try:
        if not cfg.get("checkpoint"):  # model= with pooling=: a mistyped folder is named before anything loads
            check_model(cfg.model)
        export(cfg)
    except SentembConfigError as err:
        sys.exit(f"sentemb: {err}")


if __name__ == "__main__":
    main()
