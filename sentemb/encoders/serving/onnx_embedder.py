"""Sentence embeddings from an ONNX folder written by `python -m sentemb.export format=onnx`.

This file is copied verbatim into every such folder as `sentemb_onnx.py`: it needs only numpy,
onnxruntime and tokenizers (no torch, no transformers, no sentemb) and runs nothing it reads.

    from sentemb_onnx import load
    model = load("<folder>")                      # onnx/model.onnx; file="onnx/model_qint8.onnx" for int8
    vectors = model.embed(["A sentence.", ...])   # (n, dim) float32

The graph maps token ids to the sentence embedding with the pooling inside it. What happens before
the graph is the pooling's token-level preparation, described by `sentemb_onnx.json` (`rows`):
- `plain`: the tokenizer's ids as they are (CLS, mean, weighted mean, latent);
- `append`: a token (EOS) added to each sentence that does not end with it (last-token pooling);
- `template`: the sentence's ids with `strip` removed and `replace` applied, cut to what fits in
  `max_length`, between `start + prefix` and `suffix + end` (prompt-[MASK], PromptEOL).
`encode(max_length=...)` truncates the tokenised sentence first, on `truncation_side`, as sentemb's
encode() does. Rows are padded on `padding_side` with `pad_token_id`; sentences go through the graph longest first,
`batch_size` at a time (little padding), and come back in the input order. The session runs ONNX
Runtime's own graph optimisations, less the `disabled_optimizers` the JSON names.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer

RECIPE = "sentemb_onnx.json"
FORMAT = 1


def prepared_rows(ids: Sequence[Sequence[int]], rows: dict) -> list[list[int]]:
    """Each tokenised sentence laid out as the graph's input row, as the JSON's `rows` says (sentemb's poolings
    lay out their training and encode() rows with this same function)."""
    if rows["kind"] == "plain":
        return [list(i) for i in ids]
    if rows["kind"] == "append":
        token = rows["token"]
        return [list(i) if i and i[-1] == token else [*i, token] for i in ids]
    if rows["kind"] == "template":
        strip, replace = set(rows["strip"]), {int(k): v for k, v in rows["replace"].items()}
        head, tail = rows["start"] + rows["prefix"], rows["suffix"] + rows["end"]
        room = rows["max_length"] - len(head) - len(tail)
        if room < 1:
            raise ValueError(f"the template takes {len(head) + len(tail)} of max_length {rows['max_length']} tokens")
        return [[*head, *[replace.get(t, t) for t in i if t not in strip][:room], *tail] for i in ids]
    raise ValueError(f"unknown rows kind {rows['kind']!r}")


def inside(folder: Path, name: str, recipe_path: Path) -> Path:
    """`folder / name` if that file lies inside `folder` (links resolved), else refused: a recipe or a caller that
    names a graph elsewhere (`../`, an absolute path, a link out) gets nothing read."""
    path = (folder / str(name)).resolve()
    if not path.is_relative_to(folder.resolve()):
        raise ValueError(f"{recipe_path}: graph {name!r} lies outside {folder}: refused (a graph is one of its files)")
    return path


class OnnxEncoder:
    """An exported folder's graph and tokenizer; `embed` / `encode` give float32 sentence embeddings."""

    def __init__(
        self,
        folder: str | Path,
        file: str | None = None,
        providers: Sequence[str] | None = None,
        threads: int | None = None,
        recipe: dict | None = None,
    ) -> None:
        self.folder = Path(folder)
        recipe_path = self.folder / RECIPE
        if recipe is None and not recipe_path.is_file():
            raise FileNotFoundError(f"{recipe_path} not found: {self.folder} is not a sentemb ONNX export")
        # `recipe`: the folder's recipe as a caller already read and checked it (sentemb: the one rule for files)
        self.recipe = recipe if recipe is not None else json.loads(recipe_path.read_text())
        if not isinstance(self.recipe, dict) or self.recipe.get("format") != FORMAT:
            kind = self.recipe.get("format") if isinstance(self.recipe, dict) else type(self.recipe).__name__
            raise ValueError(f"{recipe_path}: format {kind!r}, this loader reads {FORMAT}")
        self.file = inside(self.folder, file or self.recipe["graphs"]["fp32"], recipe_path)
        if not self.file.is_file():
            raise FileNotFoundError(f"{self.file} not found; the folder holds {sorted(self.recipe['graphs'].values())}")
        import onnxruntime as ort  # here: sentemb's poolings import this module for `prepared_rows` alone

        options = ort.SessionOptions()
        if threads:
            options.intra_op_num_threads = threads
        self.session = ort.InferenceSession(
            str(self.file),
            options,
            providers=list(providers or ["CPUExecutionProvider"]),
            disabled_optimizers=self.recipe.get("disabled_optimizers") or None,  # sentemb measured them slower
        )
        self.tokenizer = Tokenizer.from_file(str(inside(self.folder, "tokenizer.json", recipe_path)))
        self.tokenizer.no_padding()  # padding and truncation are done here, as sentemb's encode() does them
        self.tokenizer.no_truncation()
        self.inputs = [i.name for i in self.session.get_inputs()]
        self.dimension = int(self.recipe["dimension"])
        self.pooling = self.recipe.get("pooling", "?")  # the pooling inside the graph (its registry name)

    def rows(self, sentences: Sequence[str], max_length: int | None = None) -> list[list[int]]:
        """The graph's input ids of each sentence, before padding; tokenised with truncation to `max_length`."""
        tokenizer = self.tokenizer
        if max_length is not None:  # a copy: this loader's own tokenizer is never changed (threads may share it)
            tokenizer = Tokenizer.from_str(self.tokenizer.to_str())
            tokenizer.enable_truncation(max_length, direction=self.recipe.get("truncation_side", "right"))
        ids = [e.ids for e in tokenizer.encode_batch(list(sentences), add_special_tokens=True)]
        return prepared_rows(ids, self.recipe["rows"])

    def batch(self, rows: list[list[int]]) -> dict[str, np.ndarray]:
        """Padded int64 inputs of the graph for these rows."""
        length = max(1, *map(len, rows))  # an empty sentence (no special tokens) is one padding token
        ids = np.full((len(rows), length), self.recipe["pad_token_id"], dtype=np.int64)
        mask = np.zeros((len(rows), length), dtype=np.int64)
        left = self.recipe["padding_side"] == "left"
        for n, row in enumerate(rows):
            cut = slice(length - len(row), length) if left else slice(0, len(row))
            ids[n, cut], mask[n, cut] = row, 1
        feeds = {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)}
        return {name: feeds[name] for name in self.inputs}

    def encode(
        self,
        sentences: Sequence[str],
        batch_size: int = 32,
        max_length: int | None = None,
        show_progress: bool = False,
    ) -> np.ndarray:
        """(len(sentences), dimension) float32; no truncation unless `max_length`. The arguments are sentemb's
        encode()'s; `show_progress` is accepted and ignored (no progress bar without extra dependencies)."""
        unique = list(dict.fromkeys(sentences))
        out = np.zeros((len(unique), self.dimension), dtype=np.float32)
        if unique:
            rows = self.rows(unique, max_length)
            order = sorted(range(len(unique)), key=lambda i: -len(rows[i]))
            for start in range(0, len(order), batch_size):
                chunk = order[start : start + batch_size]
                out[chunk] = self.session.run([self.recipe["output"]], self.batch([rows[i] for i in chunk]))[0]
        at = {sentence: i for i, sentence in enumerate(unique)}
        return out[[at[s] for s in sentences]]

    def embed(self, sentences: Sequence[str], batch_size: int = 32) -> np.ndarray:
        """Sentence embeddings, float32, one row per sentence (not normalised: the cosine is the similarity)."""
        return self.encode(sentences, batch_size=batch_size)


def load(folder: str | Path, file: str | None = None, threads: int | None = None) -> OnnxEncoder:
    """The folder's fp32 graph, or `file` (e.g. "onnx/model_qint8.onnx")."""
    return OnnxEncoder(folder, file=file, threads=threads)
