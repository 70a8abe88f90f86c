"""GradCache (Gao et al., 2021): a contrastive batch larger than memory allows, with the same gradients.

`grad_cache.sentences=<n>` (or the short form `grad_cache=<n>`) chunks a step by sentences: 2·n
backbone rows a chunk (both dropout views; with HiCL, the segments of n sentences' rows).
`grad_cache.tokens=<n>` chunks it by real tokens instead: the rows are sorted by length (longest
first, so each chunk is dense) and filled greedily up to n tokens a chunk (a longer row gets a
chunk of its own); on long-tailed lengths a fixed sentence count wastes memory on short rows and
overflows it on long ones (sentence-transformers' CachedMultipleNegativesRankingLoss made the same move).
Either way a step runs in three parts:
1. every chunk runs forward *without* a graph; its RNG state and autocast mode are recorded first;
2. the loss (and every batch-level term: HiCL's local and entailment losses, the DDP gather) is
   computed on the whole batch of cached row outputs, put back in the batch's row order, and
   back-propagated to them only;
3. each chunk runs forward again *with* a graph under its recorded RNG state, so dropout draws
   the same masks (sentence-transformers' CachedMultipleNegativesRankingLoss replays its RNG the
   same way), and receives the cached gradient of its rows.

Per-row auxiliary terms (SARCSE's reconstruction loss of each row) are cached like the embeddings,
so their gradient reaches the backbone through step 3. The only difference from a plain step is
the batch a row is computed in (chunk vs full batch): float32 last bits, as any batch change.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

import torch
from torch import nn
from torch.distributed.fsdp import FSDPModule

from sentemb.common.errors import SentembConfigError

log = logging.getLogger(__name__)


def _count(key: str, value: object, unit: str, example: str) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise SentembConfigError(
            f"{key}={value} must be a whole number of {unit} per chunk (>= 1), or null. Fix: e.g. {example}"
        )


def check_grad_cache(value: object, batch_size: int | None = None) -> None:
    """`grad_cache`: null, a number of sentences a chunk (short form), or {sentences: n} / {tokens: n}, not both.

    A sentence chunk of the whole batch is only warned about (one chunk adds a forward and saves nothing).
    """
    if value is None:
        return
    if not isinstance(value, Mapping):
        _count("grad_cache", value, "sentences", "data.batch_size=512 grad_cache=64")
        value = {"sentences": value}
    unknown = set(value) - {"sentences", "tokens"}
    if unknown:
        raise SentembConfigError(f"grad_cache.{sorted(unknown)[0]}: unknown key; use grad_cache.sentences or .tokens")
    sentences, tokens = value.get("sentences"), value.get("tokens")
    _count("grad_cache.sentences", sentences, "sentences", "data.batch_size=512 grad_cache.sentences=64")
    _count("grad_cache.tokens", tokens, "real tokens", "data.batch_size=512 grad_cache.tokens=4096")
    if sentences is not None and tokens is not None:
        raise SentembConfigError(
            f"grad_cache.sentences={sentences} and grad_cache.tokens={tokens}: chunk by one of them. "
            "Fix: set the other to null"
        )
    if sentences is not None and batch_size is not None and sentences >= batch_size:
        log.warning("grad_cache=%d >= data.batch_size=%d: one chunk, which only adds a forward", sentences, batch_size)


@dataclass(frozen=True)
class ChunkContext:
    """What a chunk's forward depends on besides its inputs: the RNG (dropout masks) and autocast."""

    device: torch.device
    cpu_rng: torch.Tensor
    device_rng: torch.Tensor | None
    autocast: bool
    autocast_dtype: torch.dtype

    @classmethod
    def capture(cls, device: torch.device) -> ChunkContext:
        device_rng = None if device.type == "cpu" else torch.get_device_module(device.type).get_rng_state(device)
        return cls(
            device,
            torch.get_rng_state(),
            device_rng,
            torch.is_autocast_enabled(device.type),
            torch.get_autocast_dtype(device.type),
        )

    @contextlib.contextmanager
    def replay(self) -> Iterator[None]:
        """Run under the recorded RNG and autocast; the global RNG is left as it was before."""
        devices = [] if self.device_rng is None else [self.device]
        with torch.random.fork_rng(devices=devices, device_type=self.device.type):
            torch.set_rng_state(self.cpu_rng)
            if self.device_rng is not None:
                torch.get_device_module(self.device.type).set_rng_state(self.device_rng, self.device)
            with torch.autocast(self.device.type, dtype=self.autocast_dtype, enabled=self.autocast):
                yield


def sentence_chunks(rows: int, size: int) -> list[torch.Tensor]:
    """Consecutive runs of `size` rows of a batch of `rows`, as row indices."""
    return list(torch.arange(rows).split(size))


def token_chunks(attention_mask: torch.Tensor, budget: int) -> list[torch.Tensor]:
    """Rows sorted longest first, filled greedily up to `budget` real tokens a chunk (a longer row alone)."""
    lengths = attention_mask.sum(dim=1).cpu()
    order = torch.argsort(lengths, descending=True, stable=True)
    chunks, current, used = [], [], 0
    for row, length in zip(order.tolist(), lengths[order].tolist(), strict=True):
        if current and used + length > budget:
            chunks.append(torch.tensor(current))
            current, used = [], 0
        current.append(row)
        used += length
    return [*chunks, torch.tensor(current)] if current else chunks


def take_rows(prepared: dict[str, torch.Tensor], index: torch.Tensor) -> dict[str, torch.Tensor]:
    """The prepared batch's rows `index`, trimmed of the padding columns none of them uses."""
    width = prepared["attention_mask"].shape[1]
    index = index.to(prepared["attention_mask"].device)
    chunk = {name: value.index_select(0, index) for name, value in prepared.items()}
    used = int(chunk["attention_mask"].any(dim=0).nonzero().max()) + 1
    return {name: v[:, :used] if v.dim() == 2 and v.shape[1] == width else v for name, v in chunk.items()}


def row_chunks(prepared: dict[str, torch.Tensor], rows: int) -> list[dict[str, torch.Tensor]]:
    """Consecutive slices of `rows` backbone rows, each trimmed of its unused padding columns."""
    return [take_rows(prepared, index) for index in sentence_chunks(prepared["attention_mask"].shape[0], rows)]


@dataclass
class CachedStep:
    chunks: list[dict[str, torch.Tensor]]
    indices: list[torch.Tensor]  # each chunk's rows in the prepared batch
    contexts: list[ChunkContext]
    rows: dict[str, torch.Tensor]  # leaves in the batch's row order: the loss back-propagates to them first


class GradCache:
    """One of `sentences` (sentences a chunk) or `tokens` (real tokens a chunk); see the module docstring."""

    def __init__(self, sentences: int | None = None, tokens: int | None = None) -> None:
        check_grad_cache({"sentences": sentences, "tokens": tokens})
        if sentences is None and tokens is None:
            raise SentembConfigError("grad_cache: give grad_cache.sentences or grad_cache.tokens")
        self.sentences, self.tokens = sentences, tokens
        self.pending: CachedStep | None = None  # between a step's loss and its backward

    @classmethod
    def from_config(cls, value: int | Mapping[str, int | None] | None) -> GradCache | None:
        """The `grad_cache` config value (null, a sentence count, or {sentences, tokens}) → a GradCache or None."""
        check_grad_cache(value)
        options = {"sentences": value} if isinstance(value, int) else dict(value or {})
        return cls(**options) if any(v is not None for v in options.values()) else None

    def chunk_indices(self, prepared: dict[str, torch.Tensor]) -> list[torch.Tensor]:
        mask = prepared["attention_mask"]
        if self.tokens is not None:
            return token_chunks(mask, self.tokens)
        return sentence_chunks(mask.shape[0], 2 * self.sentences)  # both dropout views of `sentences` sentences

    def cached_rows(self, encoder: nn.Module, prepared: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Step 1: every chunk's row outputs without a graph, as leaves that will receive the loss's gradient."""
        device = prepared["input_ids"].device
        indices = self.chunk_indices(prepared)
        chunks = [take_rows(prepared, index) for index in indices]
        contexts, outputs = [], []
        for chunk in chunks:
            contexts.append(ChunkContext.capture(device))
            with torch.no_grad():
                outputs.append(encoder.training_rows(chunk))
        # chunk order → the batch's row order (token chunks are sorted by length)
        where = torch.argsort(torch.cat(indices)).to(device)
        rows = {
            name: torch.cat([out[name] for out in outputs]).index_select(0, where).requires_grad_()
            for name in outputs[0]
        }
        self.pending = CachedStep(chunks, indices, contexts, rows)
        return rows

    def replay_backward(self, encoder: nn.Module, distributed: bool) -> None:
        """Step 3, after the loss's backward filled the cached rows' gradients: chunk by chunk into the weights.

        Under DDP the chunks' parameter gradients are summed first and accumulated once, so DDP's
        reducer (one hook per parameter per step) all-reduces the whole step's gradient. Under FSDP
        (trainer=fsdp) each chunk back-propagates on its own, as on one process: the sharded weights
        are not in autograd's graph (their gathered copies are), and each backward's reduce-scatter adds
        its chunk's averaged gradient to theirs.
        """
        pending, self.pending = self.pending, None
        distributed = distributed and not isinstance(encoder, FSDPModule)
        grads = {name: row.grad for name, row in pending.rows.items() if row.grad is not None}
        params = [p for p in encoder.parameters() if p.requires_grad]
        sums: list[torch.Tensor | None] = [None] * len(params)
        for chunk, index, context in zip(pending.chunks, pending.indices, pending.contexts, strict=True):
            with context.replay():
                out = encoder.training_rows(chunk)
            outputs = [out[name] for name in grads]
            cached = [grad.index_select(0, index.to(grad.device)) for grad in grads.values()]
            if not distributed:
                torch.autograd.backward(outputs, cached)
                continue
            parts = torch.autograd.grad(outputs, params, cached, allow_unused=True)
            sums = [s if p is None else p if s is None else s + p for s, p in zip(sums, parts, strict=True)]
        if distributed:
            used = [(param, total) for param, total in zip(params, sums, strict=True) if total is not None]
            torch.autograd.backward([param for param, _ in used], [total for _, total in used])
