"""Export's `format=onnx`: format= and export.quantize, the pooling's graph and the STS-B files checked before any
model loads; the ONNX graph(s) and their loader written into the folder, and the model card's section about them,
with the artefacts measured against the torch encoder (sentemb.eval.deployed)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf

from sentemb.common.errors import SentembConfigError
from sentemb.common.hydra_plumbing import resolved_container
from sentemb.common.paths import resolve_data_root
from sentemb.encoders.encoder import SentenceEncoder
from sentemb.encoders.serving.onnx_embedder import OnnxEncoder
from sentemb.encoders.serving.onnx_graph import check_graph_parts, write_onnx_folder
from sentemb.eval.deployed import ArtefactCheck, artefact_table
from sentemb.eval.truncation import truncated
from sentemb.eval.whitening_export import WhitenedEncoder

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
    truncate_dim: int | None = None,
) -> list[str]:
    """Write the ONNX graph(s), the loader and its recipe into `out`; the model card's lines about them. The encoder
    is made float32 (the graph's precision, and the reference the artefacts are measured against); `whitening`, the
    whitening Dense module's Linear, is the graph's last op and part of the reference; `truncate_dim` (a Matryoshka
    size): the graph outputs the embedding's first d dimensions, and the reference is cut the same way."""
    recipe = write_onnx_folder(encoder, out, quantize, whitening, truncate_dim)
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
        + (f" It outputs the embedding's first {truncate_dim} dimensions (truncate_dim)." if truncate_dim else "")
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
        reference = truncated(encoder if whitening is None else WhitenedEncoder(encoder, whitening), truncate_dim)
        lines += ["", "### Measured", "", *artefact_table(check.measure(reference, artefacts), files, out)]
    return lines


RECIPE_WORDS = {
    "plain": "each sentence is tokenised as the tokenizer does it",
    "append": "each sentence is tokenised and EOS appended where the tokenizer did not end it with EOS",
    "template": "each sentence's tokens are placed in the pooling's prompt template (cut to fit its max_length)",
}
