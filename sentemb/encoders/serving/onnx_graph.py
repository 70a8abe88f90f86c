"""An encoder as one ONNX graph, token ids to sentence embedding with the pooling inside; its int8 form.

`EmbeddingGraph` is the padded forward of `SentenceEncoder` on rows its pooling has prepared
(`Pooling.prepare`): the backbone (decoders with their explicit position ids, counted from each
sentence's first real token) and the pooling, whose per-batch inputs come from the ids alone
(`Pooling.graph_batch`: the prompt's mask position). The preparation itself (a template, an
appended EOS) is token-level list work and stays outside the graph, described in the folder's
`sentemb_onnx.json` (`Pooling.serving_rows`) and done by `onnx_embedder.py`, which the folder ships.
The graph is exported by torch's ONNX exporter (torch.export, dynamic batch and sequence axes) and
runs in float32; `quantize_int8` is ONNX Runtime's dynamic quantisation.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import torch
from torch import nn

from sentemb.common.errors import SentembConfigError
from sentemb.common.parts import declared_part
from sentemb.encoders.encoder import SentenceEncoder
from sentemb.encoders.part_configs import part_entry
from sentemb.encoders.serving import onnx_embedder
from sentemb.encoders.serving.onnx_embedder import FORMAT, RECIPE

GRAPH_OUTPUTS = ("sentence_embedding", "last_hidden_state")  # the second is what sentence-transformers' ONNX reads
# protobuf's 2 GB limit on one file: larger graphs keep their weights in a `.data` file beside them
SINGLE_FILE_BYTES = 1_800_000_000
GRAPHS = {"fp32": "onnx/model.onnx", "int8": "onnx/model_qint8.onnx"}  # sentence-transformers' ONNX names
LOADER = "sentemb_onnx.py"  # onnx_embedder.py, copied into the folder under this name
QUANTIZE = (None, "int8")
# ONNX Runtime's session optimisations the loader leaves out: its fused SkipLayerNormalization CPU kernel (1.32) made
# MiniLM 0.83x as fast in int8 and 0.91x in fp32 as the residual Add + LayerNormalization it replaces, the same maths
# (2-core Xeon, STS-B test sentences, 4 rounds each; docs/export.md#onnx)
DISABLED_OPTIMIZERS = ("SkipLayerNormFusion",)
EXAMPLE = ["a man is playing a guitar on a stage .", "hello"]  # two rows of different lengths: both axes dynamic


class EmbeddingGraph(nn.Module):
    """(input_ids, attention_mask[, token_type_ids]) of prepared, padded rows → (sentence embedding, token states);
    `whitening`: a linear layer applied to the float32 embedding as the graph's last op (BERT-whitening's
    y = x Wᵀ + b, the very weights of the sentence-transformers folder's last Dense module); `truncate_dim`: the
    embedding's first d dimensions alone (export's truncate_dim, a Matryoshka size; sentence-transformers'
    `truncate_embeddings` keeps `[..., :d]` the same way, unnormalised)."""

    def __init__(
        self, encoder: SentenceEncoder, whitening: nn.Linear | None = None, truncate_dim: int | None = None
    ) -> None:
        super().__init__()
        self.encoder = encoder
        self.whitening = whitening
        self.truncate_dim = truncate_dim

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, token_type_ids: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        batch = {"input_ids": input_ids, "attention_mask": attention_mask}
        if token_type_ids is not None:
            batch["token_type_ids"] = token_type_ids
        hidden = self.encoder.padded_states(batch)
        pooling = self.encoder.pooling
        embedding = pooling(hidden, pooling.graph_batch(batch, self.encoder.tokenizer)).float()
        if self.whitening is not None:
            embedding = self.whitening(embedding)
        if self.truncate_dim is not None:
            embedding = embedding[:, : self.truncate_dim]
        return embedding, hidden.float()  # similarities are taken in float32


def graph_inputs(encoder: SentenceEncoder) -> list[str]:
    """The graph's inputs: ids and mask, and token_type_ids where the tokenizer gives them (BERT)."""
    names = ["input_ids", "attention_mask"]
    return names + (["token_type_ids"] if "token_type_ids" in encoder.tokenizer.model_input_names else [])


def serving_recipe(encoder: SentenceEncoder, graphs: dict[str, str], dimension: int) -> dict[str, Any]:
    """sentemb_onnx.json: how `onnx_embedder.py` turns sentences into the graph's inputs, and the graph files."""
    tokenizer = encoder.tokenizer
    rows = encoder.pooling.serving_rows(tokenizer)
    if not tokenizer.is_fast:
        raise SentembConfigError(
            f"format=onnx: the tokenizer ({type(tokenizer).__name__}) is a slow one, with no tokenizer.json for the "
            "folder's loader to read. Fix: model.tokenizer loading a fast tokenizer (transformers' default)"
        )
    if tokenizer.pad_token_id is None:
        raise SentembConfigError(
            f"format=onnx: the tokenizer ({type(tokenizer).__name__}) has no pad token, so batches cannot be padded. "
            "Fix: model.tokenizer.pad_token=<a token of its vocabulary> (decoders: the EOS token)"
        )
    return {
        "format": FORMAT,
        "graphs": graphs,
        "output": GRAPH_OUTPUTS[0],
        "dimension": dimension,
        "pooling": getattr(declared_part(encoder.pooling), "name", type(encoder.pooling).__name__),
        "padding_side": rows.pop("padding_side", tokenizer.padding_side),
        "truncation_side": tokenizer.truncation_side,
        "pad_token_id": tokenizer.pad_token_id,
        "rows": rows,
        "disabled_optimizers": list(DISABLED_OPTIMIZERS),
    }


def example_rows(encoder: SentenceEncoder) -> dict[str, torch.Tensor]:
    """EXAMPLE tokenised and prepared by the pooling, as the graph's inputs."""
    batch = encoder.pooling.prepare(encoder.tokenizer(EXAMPLE, padding=True, return_tensors="pt"), encoder.tokenizer)
    zeros = torch.zeros_like(batch["input_ids"])  # token_type_ids: a prepared row is one segment
    return {name: batch.get(name, zeros) for name in graph_inputs(encoder)}


def parameter_bytes(module: nn.Module) -> int:
    return sum(p.numel() * 4 for p in module.parameters())  # exported in float32


def export_graph(
    encoder: SentenceEncoder, path: Path, whitening: nn.Linear | None = None, truncate_dim: int | None = None
) -> int:
    """Write the float32 graph to `path` (weights beside it in `<name>.data` above SINGLE_FILE_BYTES); its output
    size. The encoder is exported in eval mode and float32; `whitening`, a float32 linear layer, ends the graph, or
    the embedding's first `truncate_dim` dimensions do."""
    encoder = encoder.float().eval()
    graph, inputs = EmbeddingGraph(encoder, whitening, truncate_dim).eval(), example_rows(encoder)
    axes = {name: {0: torch.export.Dim("batch"), 1: torch.export.Dim("sequence")} for name in inputs}
    with torch.no_grad():
        dimension = graph(**inputs)[0].shape[-1]
        torch.onnx.export(
            graph,
            (),
            str(path),
            kwargs=inputs,
            input_names=list(inputs),
            output_names=list(GRAPH_OUTPUTS),
            dynamic_shapes=axes,
            dynamo=True,
            external_data=parameter_bytes(encoder) > SINGLE_FILE_BYTES,
            optimize=True,
            verbose=False,
        )
    return int(dimension)


def quantize_int8(source: Path, target: Path, keep_float: tuple[str, ...] = ()) -> None:
    """ONNX Runtime's dynamic quantisation: int8 weights per output channel, activations quantised per batch.

    7-bit weights (`reduce_range`) keep the u8 x s8 products out of AVX2's saturating 16-bit sums, so the
    same file gives the same numbers on CPUs with and without VNNI; only weight x activation products are
    quantised (`MatMulConstBOnly`), never attention's activation x activation ones. The nodes that read an
    initializer named in `keep_float` stay float32 (the whitening: see `write_onnx_folder`), checked in the result.
    """
    from onnxruntime.quantization import QuantType, quantize_dynamic

    quantize_dynamic(
        str(source),
        str(target),
        weight_type=QuantType.QInt8,
        per_channel=True,
        reduce_range=True,
        nodes_to_exclude=reading_nodes(source, keep_float) if keep_float else None,
        extra_options={"MatMulConstBOnly": True},
        use_external_data_format=source.with_name(source.name + ".data").exists(),
    )
    if keep_float:
        check_float(target, keep_float)


FLOAT_READERS = ("Gemm", "MatMul", "Transpose")  # the float ops that may read a kept weight (or its transposed copy)


def reading_nodes(path: Path, initializers: tuple[str, ...]) -> list[str]:
    """The names of the graph's nodes that take one of `initializers` as an input, each under the names ONNX
    Runtime's quantiser gives them too (it splits a Gemm into `<name>_MatMul` and `<name>_Add` before it excludes
    nodes); each initializer must have one."""
    import onnx

    nodes = onnx.load(str(path), load_external_data=False).graph.node
    found = {name: [node.name for node in nodes if name in node.input] for name in initializers}
    missing = [name for name, names in found.items() if not names]
    if missing:  # torch's exporter named them otherwise: quantising them silently would be worse than stopping
        raise RuntimeError(f"{path}: no node reads {missing}, so they cannot be kept out of the int8 quantisation")
    return [variant for names in found.values() for node in names for variant in (node, f"{node}_MatMul")]


def check_float(path: Path, initializers: tuple[str, ...]) -> None:
    """Every node of the quantised graph reading one of `initializers` (or a tensor the quantiser made of it) is a
    float op: none was quantised."""
    import onnx

    nodes = onnx.load(str(path), load_external_data=False).graph.node
    readers = {node.op_type for node in nodes for i in node.input if i.startswith(initializers)}
    if not readers or not readers <= set(FLOAT_READERS):
        raise RuntimeError(f"{path}: {initializers} are read by {sorted(readers)}, not kept float32 as asked")


def check_graph_parts(pooling: dict[str, Any], head: dict[str, Any] | None, quantize: str | None) -> None:
    """format=onnx's options, pooling and head, checked from the configs before any model loads."""
    if quantize not in QUANTIZE:
        raise SentembConfigError(
            f"export.quantize={quantize!r}: use int8 (ONNX Runtime's dynamic quantisation) or null (fp32 only)"
        )
    for kind, node in (("pooling", pooling), ("head", head)):  # each declares why it is not one graph, if it is not
        entry = part_entry(kind, node)
        refusal = entry.build.graph_refusal if entry is not None else None
        if refusal:
            raise SentembConfigError(refusal)


# EmbeddingGraph.whitening's weight as torch's exporter names it: its node stays float32 in the int8 graph
WHITENING_WEIGHT = "whitening.weight"


def write_onnx_folder(
    encoder: SentenceEncoder,
    out: Path,
    quantize: str | None,
    whitening: nn.Linear | None = None,
    truncate_dim: int | None = None,
) -> dict[str, Any]:
    """Into `out`: the fp32 graph (and its int8 form), sentemb_onnx.json and the loader, and the tokenizer where the
    folder has none yet (a sentence-transformers save has written it); the recipe written (its `graphs`: the files).

    `whitening` (float32 `nn.Linear`) is the graph's last op; the int8 graph keeps it float32: it divides each
    direction by its standard deviation, which would magnify the per-batch int8 rounding of its input most in the
    directions of least variance, and it is one small matrix (k x D) beside the backbone's."""
    graphs = {name: path for name, path in GRAPHS.items() if name == "fp32" or quantize == name}
    recipe = serving_recipe(encoder, graphs, dimension=0)  # its checks before the export's minutes
    (out / "onnx").mkdir(parents=True, exist_ok=True)
    recipe["dimension"] = export_graph(encoder, out / graphs["fp32"], whitening, truncate_dim)
    if quantize:
        keep_float = (WHITENING_WEIGHT,) if whitening is not None else ()
        quantize_int8(out / graphs["fp32"], out / graphs[quantize], keep_float)
    if not (out / "tokenizer.json").is_file():
        encoder.tokenizer.save_pretrained(str(out))
    (out / RECIPE).write_text(json.dumps(recipe, indent=2) + "\n")
    shutil.copyfile(onnx_embedder.__file__, out / LOADER)
    return recipe
