"""Export's `whitening=<corpus file>`: whitening= and whitening_dim= checked and the corpus read before any model
loads, BERT-whitening fitted on the exported encoder's embeddings (sentemb.eval.whitening), the folder ended with
sentence-transformers' own Dense module computing (x − μ)W, the record of the fit (`sentemb_whitening.json`) and the
card's section about it (docs/export.md#whitening)."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import torch
from omegaconf import DictConfig

from sentemb.common.errors import SentembConfigError
from sentemb.common.published_files import publish_text
from sentemb.encoders.encoder import SentenceEncoder
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

# an exported folder's record of its whitening fit (`write_whitening_record`; sentemb.st_modules checks it on loading)
WHITENING = "sentemb_whitening.json"


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
