"""`python -m sentemb.export checkpoint=<ckpt> out=<dir>` (or `model=<name> pooling=<name> out=<dir>`).

Writes a sentence-transformers model folder through sentence-transformers' own API, loadable with
`SentenceTransformer(dir)`:
- `cls` / `mean`: its Transformer and Pooling modules; SimCSE's train-only MLP is left out (a
  Dense + Tanh module keeps it where `pooling.mlp=always`, Dense alone for `mlp_activation=none`;
  Tanh before the Linear, `mlp_activation=before`, has no Dense form and exports as sentemb's module);
- `prompt`, `hicl` and `head=sarcse`: one `sentemb.st_modules.SentembEncoder` module (sentemb's own
  pooling and head, config and weights saved in the folder).
The folder's README.md is a model card: a name unique to the training run, the training config,
the STS table (from `results.json` beside the checkpoint, or `evaluate=true`) and the commands.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import sys
import tempfile
from pathlib import Path
from typing import Any

import hydra
import torch
import yaml
from omegaconf import DictConfig, OmegaConf
from safetensors.torch import load_file, save_file

from sentemb.common.errors import SentembConfigError
from sentemb.common.hydra_plumbing import target_name
from sentemb.common.paths import CONF_DIR
from sentemb.common.process import configure_process
from sentemb.encoders.backbones import check_model
from sentemb.encoders.checkpoint import model_label
from sentemb.encoders.encoder import SentenceEncoder
from sentemb.encoders.pooling import CLSPooling, MeanPooling, mlp_linear
from sentemb.eval.report import markdown_report
from sentemb.eval.suite import evaluate, load_encoder
from sentemb.st_modules import SentembEncoder


def sentence_transformer(encoder: SentenceEncoder, pooling: dict[str, Any], head: dict[str, Any] | None):
    """The encoder as a SentenceTransformer built from sentence-transformers' modules where they exist."""
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.base.modules.dense import Dense
    from sentence_transformers.base.modules.transformer import Transformer
    from sentence_transformers.sentence_transformer.modules.pooling import Pooling

    pooler = encoder.pooling
    tanh_first = isinstance(pooler, CLSPooling) and pooler.mlp_use == "always" and pooler.mlp_activation == "before"
    if head or type(pooler) not in (CLSPooling, MeanPooling) or tanh_first:  # Dense applies Tanh after its Linear
        return SentenceTransformer(modules=[SentembEncoder(encoder, pooling, head)], device="cpu")
    with tempfile.TemporaryDirectory() as folder:  # Transformer loads from a folder: the backbone as trained
        encoder.backbone.save_pretrained(folder)
        encoder.tokenizer.save_pretrained(folder)
        with_unused_pooler(Path(folder), encoder.backbone)
        transformer = Transformer(folder)
        modules = [transformer, Pooling(encoder.hidden_size, "cls" if type(pooler) is CLSPooling else "mean")]
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
    """sentemb-<backbone>-<pooling>[-<head>]-<loss>-<training run folder>: unique per training run."""
    parts = ["sentemb", model_label(source["model"]), short(source["pooling"])]
    if source.get("head"):
        parts.append(short(source["head"]))
    if source.get("loss"):
        parts.append(short(source["loss"]))
    checkpoint = source.get("checkpoint")
    parts.append(Path(checkpoint).parent.parent.name if checkpoint else "untrained")
    return "-".join(parts)


def short(node: dict[str, Any]) -> str:
    name = target_name(node) or "?"
    for suffix in ("Pooling", "Head"):
        name = name.removesuffix(suffix)
    return name.lower()


def beside_results(checkpoint: str | None) -> Path | None:
    """`results.json` of a sentemb.evaluate run kept next to the checkpoint (its folder or its run folder)."""
    if not checkpoint:
        return None
    for folder in (Path(checkpoint).parent, Path(checkpoint).parent.parent):
        if (folder / "results.json").is_file():
            return folder / "results.json"
    return None


def model_card(
    name: str, source: dict[str, Any], results: dict[str, Any] | None, commands: list[str], custom: bool
) -> str:
    config = {k: source[k] for k in ("model", "pooling", "head", "loss", "optimizer", "scheduler") if source.get(k)}
    trained = bool(source.get("checkpoint"))
    about = (
        "A sentence encoder trained with sentemb (unsupervised contrastive sentence embeddings)."
        if trained
        else f"An untrained encoder: {model_label(source['model'])} with {short(source['pooling'])} pooling as loaded, "
        "exported by sentemb without training (a baseline)."
    )
    lines = [
        "---",
        "library_name: sentence-transformers",
        "tags: [sentence-transformers, sentence-similarity, sentemb]",
        "---",
        f"# {name}",
        "",
        about,
        "",
        "```python",
        "from sentence_transformers import SentenceTransformer",
        f"model = SentenceTransformer('<this folder>'{', trust_remote_code=True' if custom else ''})",
        "```",
        *(
            [
                "",
                "This folder holds a `sentemb.st_modules.SentembEncoder` module (sentemb's own pooling or head), so "
                "`sentemb` must be installed, and sentence-transformers >= 6 imports a module class from outside "
                "its own package only with `trust_remote_code=True`.",
            ]
            if custom
            else []
        ),
        "",
        f"Source: `{source.get('checkpoint') or 'no checkpoint (untrained ' + short(source['pooling']) + ')'}`",
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
    return [" ".join(["python -m sentemb.train", *map(shlex.quote, yaml.safe_load(overrides.read_text()) or [])])]


def export(cfg: DictConfig) -> Path:
    if not cfg.get("out"):
        raise SentembConfigError("out is not set. Fix: python -m sentemb.export checkpoint=<ckpt> out=<folder>")
    out = Path(cfg.out).expanduser()
    if out.exists() and not out.is_dir():
        raise SentembConfigError(f"out={out} is a file, not a folder: nothing is overwritten. Fix: pass a new folder")
    if out.exists() and any(out.iterdir()):
        raise SentembConfigError(f"out={out} is not empty: nothing is overwritten. Fix: pass a new folder")
    encoder, source, hparams = load_encoder(cfg, torch.device("cpu"))
    source.update(
        {k: hparams[k] for k in ("loss", "optimizer", "scheduler") if k in hparams}
    )  # the run's, for the card
    name = model_name(source)
    commands = [*training_command(source.get("checkpoint")), "python -m sentemb.export " + " ".join(sys.argv[1:])]
    results_path = beside_results(source.get("checkpoint"))
    results = json.loads(results_path.read_text()) if results_path else None
    if cfg.evaluate:
        defaults = OmegaConf.load(CONF_DIR / "eval.yaml")  # the evaluation's own settings
        eval_cfg = OmegaConf.merge({k: v for k, v in defaults.items() if k not in ("defaults", "hydra")}, cfg)
        results = evaluate(eval_cfg, out / "eval")
        target = f"checkpoint={source['checkpoint']}" if source.get("checkpoint") else "model=... pooling=..."
        commands.append(f"python -m sentemb.evaluate {target} tasks=sts")
    model = sentence_transformer(encoder.eval(), source["pooling"], source.get("head"))
    model.save(str(out), model_name=name)
    custom = any(type(module).__module__ == "sentemb.st_modules" for module in model)
    (out / "README.md").write_text(model_card(name, source, results, commands, custom))
    readable_by_all(out)
    print(f"{name}: sentence-transformers folder written to {out}")
    return out


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
