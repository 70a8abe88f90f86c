"""GradCache (Gao et al., 2021): a contrastive batch larger than memory allows, with the same gradients.

`grad_cache=<chunk>` splits a step in three:
1. every chunk of `chunk` sentences (2·chunk backbone rows: both dropout views; with HiCL, 2·chunk
   segments) runs forward *without* a graph; its RNG state and autocast mode are recorded first;
2. the loss (and every batch-level term: HiCL's local and entailment losses, the DDP gather) is
   computed on the whole batch of cached row outputs, and back-propagated to them only;
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
from collections.abc import Iterator
from dataclasses import dataclass

import torch
from torch import nn

from sentemb.common.errors import SentembConfigError

log = logging.getLogger(__name__)


def check_chunk(chunk: object, batch_size: int | None = None) -> None:
    """`grad_cache`: a whole number of sentences per chunk (>= 1), or null; a chunk of the whole batch is only
    warned about (one chunk adds a forward and saves nothing)."""
    if chunk is None:
        return
    if isinstance(chunk, bool) or not isinstance(chunk, int) or chunk < 1:
        raise SentembConfigError(
            f"grad_cache={chunk} must be a whole number of sentences per chunk (>= 1), or null for one forward. "
            "Fix: e.g. data.batch_size=512 grad_cache=64"
        )
    if batch_size is not None and chunk >= batch_size:
        log.warning("grad_cache=%d >= data.batch_size=%d: one chunk, which only adds a forward", chunk, batch_size)


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


def row_chunks(prepared: dict[str, torch.Tensor], rows: int) -> list[dict[str, torch.Tensor]]:
    """Consecutive slices of `rows` backbone rows, each trimmed of the padding columns none of its rows uses."""
    width = prepared["attention_mask"].shape[1]
    chunks = []
    for start in range(0, prepared["attention_mask"].shape[0], rows):
        chunk = {name: value[start : start + rows] for name, value in prepared.items()}
        used = int(chunk["attention_mask"].any(dim=0).nonzero().max()) + 1
        chunks.append({name: v[:, :used] if v.dim() == 2 and v.shape[1] == width else v for name, v in chunk.items()})
    return chunks


@dataclass
class CachedStep:
    chunks: list[dict[str, torch.Tensor]]
    contexts: list[ChunkContext]
    rows: dict[str, torch.Tensor]  # leaves: the loss back-propagates to them first


class GradCache:
    def __init__(self, chunk: int) -> None:
        check_chunk(chunk)
        self.chunk = chunk
        self.pending: CachedStep | None = None  # between a step's loss and its backward

    def cached_rows(self, encoder: nn.Module, prepared: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Step 1: every chunk's row outputs without a graph, as leaves that will receive the loss's gradient."""
        device = prepared["input_ids"].device
        chunks = row_chunks(prepared, 2 * self.chunk)  # both dropout views of `chunk` sentences
        contexts, outputs = [], []
        for chunk in chunks:
            contexts.append(ChunkContext.capture(device))
            with torch.no_grad():
                outputs.append(encoder.training_rows(chunk))
        rows = {name: torch.cat([out[name] for out in outputs]).requires_grad_() for name in outputs[0]}
        self.pending = CachedStep(chunks, contexts, rows)
        return rows

    def replay_backward(self, encoder: nn.Module, distributed: bool) -> None:
        """Step 3, after the loss's backward filled the cached rows' gradients: chunk by chunk into the weights.

        Under DDP the chunks' parameter gradients are summed first and accumulated once, so DDP's
        reducer (one hook per parameter per step) all-reduces the whole step's gradient.
        """
        pending, self.pending = self.pending, None
        grads = {name: row.grad for name, row in pending.rows.items() if row.grad is not None}
        params = [p for p in encoder.parameters() if p.requires_grad]
        sums: list[torch.Tensor | None] = [None] * len(params)
        start = 0
        for chunk, context in zip(pending.chunks, pending.contexts, strict=True):
            size = chunk["attention_mask"].shape[0]
            with context.replay():
                out = encoder.training_rows(chunk)
            outputs = [out[name] for name in grads]
            cached = [grad[start : start + size] for grad in grads.values()]
            start += size
            if not distributed:
                torch.autograd.backward(outputs, cached)
                continue
            parts = torch.autograd.grad(outputs, params, cached, allow_unused=True)
            sums = [s if p is None else p if s is None else s + p for s, p in zip(sums, parts, strict=True)]
        if distributed:
            used = [(param, total) for param, total in zip(params, sums, strict=True) if total is not None]
            torch.autograd.backward([param for param, _ in used], [total for _, total in used])
