"""The model card of an exported folder (its README.md): the model's name, how the folder loads (a
sentence-transformers folder, or peft's adapter folder), the STS table, the training and export commands and
the training config, written portably (a packaged model as conf/model/ names it)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any

import yaml

from sentemb.common.errors import SentembConfigError
from sentemb.common.file_values import Shape, parse_yaml, read_json, read_yaml
from sentemb.encoders.checkpoint import current_part, model_label
from sentemb.encoders.part_configs import is_decoder_config
from sentemb.eval.report import markdown_report
from sentemb.eval.scored_checkpoint import why_not_scored


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


def own_results(checkpoint: str | None, shape: Shape) -> tuple[dict[str, Any] | None, str]:
    """The `results.json` beside the checkpoint (`beside_results`) if it scored this very checkpoint file, read
    with `shape`; else (None, why it is left out: '' where there is none)."""
    path = beside_results(checkpoint)
    if path is None:
        return None, ""
    results = read_json(path, shape)
    why = why_not_scored(results, checkpoint) if isinstance(results, dict) else "it is not a JSON object"
    if why:
        return None, f"`{path}` is left out: {why}."
    return results, ""


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
    left_out: str = "",
) -> str:
    """README.md of an exported folder: `usage`, how to load it (`folder_usage` or `adapter_usage`); `left_out`: why
    the results beside the checkpoint are not shown (another checkpoint's)."""
    parts = ("model", "pooling", "head", "adapter", "loss", "optimizer", "scheduler", "data")
    config = {k: source[k] for k in parts if source.get(k)}
    trained = bool(source.get("checkpoint"))
    pooling = short("pooling", source["pooling"])
    about = (
        training_about(source)
        if trained
        else f"An untrained encoder: {model_label(source['model'])} with {pooling} pooling as loaded, "
        "exported by sentemb without training (a baseline)."
    )
    not_shown = [left_out, ""] if left_out else []
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
        *not_shown,
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


def training_about(source: dict[str, Any]) -> str:
    """How the checkpoint trained, from its run's own config: its loss and its data (labelled or raw sentences)."""
    loss = f"loss `{short('loss', source['loss'])}`" if source.get("loss") else "an unrecorded loss"
    data = source.get("data")
    if not isinstance(data, dict):
        return (
            f"A sentence encoder trained with sentemb ({loss}); its training data are not known: its run folder "
            "holds no .hydra/config.yaml."
        )
    if data.get("corpus") is not None:
        return (
            f"A sentence encoder trained with sentemb without labels ({loss} on unlabelled sentences, "
            f"`data.corpus: {data['corpus']}`): unsupervised sentence embeddings."
        )
    where = f"data.source: {data.get('source')}" + (f", data.path: {data['path']}" if data.get("path") else "")
    return f"A sentence encoder trained with sentemb on labelled data ({loss}, `{where}`): supervised."


def run_data(checkpoint: str | None) -> dict[str, Any] | None:
    """The training data config of the checkpoint's run, from its `.hydra/config.yaml` beside checkpoints/ (shown
    in the card as written, never applied); None without that file."""
    if not checkpoint:
        return None
    config = Path(checkpoint).parent.parent / ".hydra" / "config.yaml"
    if not config.is_file():
        return None
    composed = parse_yaml(config, HYDRA_FILES_FIX)
    data = composed.get("data") if isinstance(composed, dict) else None
    return data if isinstance(data, dict) else None


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
