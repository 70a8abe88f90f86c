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

`write_export` is the recipe (checks, the encoder, its folder, the card); the library it calls is in sentemb.eval:
the model card (eval.model_card), `whitening=` (eval.whitening_export) and `format=onnx` (eval.onnx_export). The
folder's sentence-transformers modules and the adapter folder are built here, from sentemb.st_modules (a top-level
module, which the layers below the commands do not import).
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from sentemb.common import hydra_plumbing  # noqa: F401 - conf/'s resolvers (${packaged_model:...}) come with it
from sentemb.common.command_line import checked_command_line
from sentemb.common.config_fields import refuse_empty_paths
from sentemb.common.errors import SentembConfigError
from sentemb.common.folder_lock import LOCK_NAME, FolderLock, enclosing_locks, take_folder_lock
from sentemb.common.hydra_plumbing import resolved_container
from sentemb.common.parts import NATIVE, TRAINS_ONLY, declared_part
from sentemb.common.paths import CONF_DIR
from sentemb.common.process import configure_process
from sentemb.common.published_files import exit_on_sigterm, publish_folder, publish_text, staging_folder
from sentemb.encoders.checkpoint import check_checkpoint_file
from sentemb.encoders.part_configs import is_decoder_config
from sentemb.runs.job_files import command_folder

# torch, transformers and sentence-transformers are imported in the functions that build the export, once Hydra has
# composed the config and the checks that need none of them have passed (tests/test_fast_feedback.py)
if TYPE_CHECKING:
    import torch

    from sentemb.encoders.encoder import SentenceEncoder
    from sentemb.eval.deployed import ArtefactCheck
    from sentemb.eval.whitening import WhiteningCorpus


def sentence_transformer(
    encoder: SentenceEncoder, model: dict[str, Any], pooling: dict[str, Any], head: dict[str, Any] | None
):
    """The encoder as a SentenceTransformer built from sentence-transformers' modules where they exist (BERT/RoBERTa
    with cls or mean pooling), else as sentemb's module."""
    import torch
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.base.modules.dense import Dense
    from sentence_transformers.base.modules.transformer import Transformer
    from sentence_transformers.sentence_transformer.modules.pooling import Pooling

    from sentemb.encoders.poolings.encoder_poolings import CLSPooling, mlp_linear
    from sentemb.st_modules import SentembEncoder, folder_model

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
    import torch
    from safetensors.torch import load_file, save_file

    weights = folder / "model.safetensors"
    if getattr(backbone, "pooler", "absent") is not None or not weights.is_file():  # no pooler in this family
        return
    tensors = load_file(weights)
    size = backbone.config.hidden_size
    tensors |= {"pooler.dense.weight": torch.zeros(size, size), "pooler.dense.bias": torch.zeros(size)}
    save_file(tensors, weights, metadata={"format": "pt"})


def readable_by_all(folder: Path) -> None:
    """Files written through temporary files (model.safetensors: mode 0600) get the modes the umask gives new files."""
    umask = os.umask(0)
    os.umask(umask)
    for path in folder.rglob("*"):
        if path.is_file():
            path.chmod(0o666 & ~umask)


# results.json (sentemb.evaluate): scores and the record of what was evaluated (its parts by registry name; older
# files by `_target_` path, shown only)


def export(cfg: DictConfig) -> Path:
    refuse_empty_paths(cfg)
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
    from sentemb.eval.onnx_export import check_format
    from sentemb.eval.suite import served_checkpoint
    from sentemb.eval.whitening_export import check_whitening

    if any(path.name != LOCK_NAME for path in out.iterdir()):
        raise SentembConfigError(f"out={out} is not empty: nothing is overwritten. Fix: pass a new folder")
    lock.claim()  # a second export into out= is refused naming this process
    corpus = check_whitening(cfg)  # whitening=<file>: read, counted and hashed before any model is built
    checkpoint = served_checkpoint(cfg)  # read and checked once, before any model is built
    if cfg.get("adapter_only"):
        check_adapter_only(cfg, checkpoint)
    artefact_check = check_format(cfg, checkpoint)  # format=onnx: its options, pooling and STS-B files
    check_export_size(cfg, checkpoint)  # truncate_dim: within the declared width, with what it can go with
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
    import torch

    from sentemb.encoders.models.adapters import is_adapted, merged
    from sentemb.eval.model_card import (
        adapter_usage,
        folder_usage,
        model_card,
        model_name,
        own_results,
        run_data,
        short,
        training_command,
    )
    from sentemb.eval.onnx_export import onnx_section
    from sentemb.eval.suite import RESULTS_SHAPE, evaluate, load_encoder
    from sentemb.eval.whitening_export import (
        evaluate_whitening,
        fitted_whitening,
        whitening_module,
        whitening_section,
        with_whitening,
        write_whitening_record,
    )
    from sentemb.st_modules import EXPORT_CARD

    encoder, source, hparams = load_encoder(cfg, torch.device("cpu"), checkpoint)
    # the run's, for the card
    source.update({k: hparams[k] for k in ("adapter", "loss", "optimizer", "scheduler") if hparams.get(k)})
    source["data"] = run_data(source.get("checkpoint"))  # the run's own data config: the card says how it trained
    name = model_name(source)
    commands = [*training_command(source.get("checkpoint")), "python -m sentemb.export " + " ".join(sys.argv[1:])]
    # shown in the card (data only) where they scored this very checkpoint file; else a line says why not
    results, left_out = own_results(source.get("checkpoint"), RESULTS_SHAPE)
    if results is not None and results.get("truncate_dim") != cfg.get("truncate_dim"):  # scored at another size
        scored_size = results.get("truncate_dim") or "all"
        exported = cfg.get("truncate_dim") or "all"
        left_out = f"results.json beside the checkpoint scored {scored_size} dimensions; this folder embeds {exported}."
        results = None
    encoder, head = inference_parts(encoder.eval(), source.get("head"))
    if is_adapted(encoder.backbone) and not cfg.get("adapter_only"):  # the adapter's update added into the base
        encoder.backbone = merged(encoder.backbone)  # weights: a plain model
    # fitted on the encoder as exported, before evaluate=true's minutes (its dimension checks come first)
    whitening = fitted_whitening(encoder, corpus) if corpus else None
    if cfg.evaluate:  # whitening= and whitening_dim= pass on: the table scores the whitened embeddings
        defaults = OmegaConf.load(CONF_DIR / "eval.yaml")  # the evaluation's own settings
        eval_cfg = OmegaConf.merge({k: v for k, v in defaults.items() if k not in ("defaults", "hydra")}, cfg)
        eval_cfg.eval.truncate_dim = cfg.get("truncate_dim")  # the table scores the exported size
        results, left_out = evaluate(eval_cfg, out / "eval"), ""
        target = f"checkpoint={source['checkpoint']}" if source.get("checkpoint") else "model=... pooling=..."
        commands.append(f"python -m sentemb.evaluate {target} tasks=sts" + evaluate_whitening(cfg))
    if cfg.get("adapter_only"):
        write_adapter_folder(encoder, source, head, checkpoint["base_model"], out)
        usage, library, written = adapter_usage(source, checkpoint["base_model"]), "peft", "LoRA adapter folder"
    else:
        model = sentence_transformer(encoder, source["model"], source["pooling"], head)
        if cfg.get("truncate_dim"):  # config_sentence_transformers.json's truncate_dim: encode() keeps [..., :d]
            model.truncate_dim = int(cfg.truncate_dim)
        dense = whitening_module(whitening) if whitening else None
        if dense is not None:
            model, record = with_whitening(model, dense, corpus, whitening)
        model.save(str(out), model_name=name)
        custom = any(type(module).__module__ == "sentemb.st_modules" for module in model)
        usage, library, written = folder_usage(source, custom), "sentence-transformers", "sentence-transformers folder"
        if cfg.get("truncate_dim"):
            usage += ["", truncation_note(int(cfg.truncate_dim))]
            written += f" at {cfg.truncate_dim} dimensions"
        if dense is not None:
            write_whitening_record(out, record)
            usage += whitening_section(record, scored=bool(cfg.evaluate), table=results is not None)
            written += f" whitened ({record['input_dim']} -> {record['dim']} dimensions)"
        if cfg.get("format") == "onnx":
            linear = dense.linear if dense is not None else None
            usage += onnx_section(
                encoder,
                out,
                cfg.export.quantize,
                custom,
                artefact_check,
                short("pooling", source["pooling"]),
                linear,
                cfg.get("truncate_dim"),
            )
            written += " with its ONNX graph"
    # the model card last: a folder holding it is a whole export (st_modules.check_whole_export)
    publish_text(out / EXPORT_CARD, model_card(name, source, results, commands, usage, library, left_out))
    readable_by_all(out)
    return name, written


def check_export_size(cfg: DictConfig, checkpoint: dict[str, Any] | None) -> int | None:
    """truncate_dim (null: the whole vector): a size of at least 1 within the sentence vector's declared width, before
    any model loads. A size the checkpoint's matryoshka.dims did not train is warned about, not refused (any prefix
    is an embedding; the user may have measured it: evaluate's eval.truncate_dim). Refused with whitening= (its map
    is fitted on, and keeps, whole vectors: whitening_dim= keeps k directions) and adapter_only=true (peft's folder
    has no size)."""
    from sentemb.eval.truncation import check_truncate_dim, declared_width, trained_sizes

    size = cfg.get("truncate_dim")
    if size is None:
        return None
    for key, fix in (("whitening", "whitening_dim=<k> keeps k whitened directions"), ("adapter_only", "")):
        if cfg.get(key):
            raise SentembConfigError(
                f"truncate_dim={size} with {key}={cfg.get(key)}: a size is exported on the whole model's folder, "
                f"without {key}. Fix: drop truncate_dim= or {key}=" + (f" ({fix})" if fix else "")
            )
    hparams = checkpoint["hyper_parameters"] if checkpoint else None
    parts = hparams or {key: resolved_container(cfg.get(key)) for key in ("model", "head")}
    return check_truncate_dim(size, "truncate_dim", declared_width(parts["model"], parts.get("head")),
                              trained_sizes(hparams))  # fmt: skip


def truncation_note(size: int) -> str:
    """The model card's line about the exported size."""
    return (
        f"The folder embeds with the first {size} dimensions of the sentence vector (a Matryoshka size): "
        f"`truncate_dim: {size}` in config_sentence_transformers.json, which `SentenceTransformer(folder)` applies "
        "(`truncate_dim=` when loading overrides it)."
    )


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
    from sentemb.st_modules import FolderConfig, folder_model, save_sentemb_parts

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
        refuse_empty_paths(cfg)  # checkpoint= given empty: refused, never the untrained default exported instead
        if cfg.get("checkpoint"):  # a missing or non-checkpoint file named before torch is imported
            check_checkpoint_file(cfg.checkpoint, "checkpoint")
        else:  # model= with pooling=: a mistyped folder is named before anything loads
            from sentemb.encoders.models.backbones import check_model  # transformers: once the config composed

            check_model(cfg.model)
        with command_folder(cfg, HydraConfig.get(), "export"):  # its run folder's lock, .hydra/export/, export.log
            export(cfg)
    except SentembConfigError as err:
        sys.exit(f"sentemb: {err}")


if __name__ == "__main__":
    main()
