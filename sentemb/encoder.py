"""SentenceEncoder: backbone + tokenizer + pooling, and the one `encode()` every evaluation uses.

Training-time dev evaluation, `sentemb.evaluate` and export all call `encode()`, so their
numbers are identical by construction.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import nn
from tqdm.auto import tqdm
from transformers import PreTrainedModel, PreTrainedTokenizerBase


@dataclass
class TrainingViews:
    """The two dropout views' embeddings, the global loss's weight, and auxiliary (weight, loss) terms."""

    z1: torch.Tensor
    z2: torch.Tensor
    global_weight: float = 1.0
    auxiliary: dict[str, tuple[float, torch.Tensor]] = field(default_factory=dict)


class SentenceEncoder(nn.Module):
    def __init__(self, backbone: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, pooling: nn.Module) -> None:
        super().__init__()
        self.backbone = backbone
        self.pooling = pooling
        self.tokenizer = tokenizer

    @property
    def hidden_size(self) -> int:
        return self.backbone.config.hidden_size

    def hidden_states(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The backbone's token states for `batch` after the pooling's own input preparation (template, slices)."""
        if hasattr(self.pooling, "prepare"):
            batch = self.pooling.prepare(batch, self.tokenizer)
        inputs = {k: v for k, v in batch.items() if k in ("input_ids", "attention_mask", "token_type_ids")}
        return self.backbone(**inputs).last_hidden_state, batch

    def training_views(self, batch: dict[str, torch.Tensor]) -> TrainingViews:
        """Both dropout views in one forward over the doubled batch (unsup. SimCSE); train-only heads on."""
        n = batch["input_ids"].shape[0]
        doubled = {name: torch.cat([value, value]) for name, value in batch.items()}
        hidden, prepared = self.hidden_states(doubled)
        if hasattr(self.pooling, "training_views"):  # HiCL: segment-level objectives as well
            return self.pooling.training_views(hidden, prepared, n)
        if hasattr(self.pooling, "embed_and_reconstruction_loss"):  # SARCSE: each view rebuilds its own tokens
            z, reconstruction = self.pooling.embed_and_reconstruction_loss(
                hidden, prepared["attention_mask"], prepared["input_ids"]
            )
            return TrainingViews(z[:n], z[n:], self.pooling.alpha, self.pooling.reconstruction_terms(reconstruction, n))
        embeddings = self.pooling(hidden, prepared["attention_mask"], train_head=True, input_ids=prepared["input_ids"])
        return TrainingViews(embeddings[:n], embeddings[n:])

    def forward(self, batch: dict[str, torch.Tensor], train_head: bool = False) -> torch.Tensor:
        """Token ids → sentence embeddings (B, H); `train_head` adds the train-only pooling MLP."""
        hidden, batch = self.hidden_states(batch)
        return self.pooling(hidden, batch["attention_mask"], train_head=train_head, input_ids=batch["input_ids"])

    @torch.inference_mode()
    def encode(
        self,
        sentences: Sequence[str],
        batch_size: int = 128,
        max_length: int | None = None,
        show_progress: bool = False,
    ) -> np.ndarray:
        """Embed sentences in eval mode, no grad, float32; no truncation unless `max_length` is given.

        Each distinct sentence is tokenised once (one batched call), encoded once, in batches of
        equal-ish token count (longest first, so padding is minimal), and the rows come back
        in the input order.
        """
        unique = list(dict.fromkeys(sentences))
        if not unique:
            return np.zeros((0, self.hidden_size), dtype=np.float32)
        tokens = self.tokenizer(unique, truncation=max_length is not None, max_length=max_length)
        order = sorted(range(len(unique)), key=lambda i: -len(tokens["input_ids"][i]))
        device = next(self.backbone.parameters()).device
        # padding pre-tokenised rows is what DataCollatorWithPadding does too; the hint to call the tokenizer is moot
        self.tokenizer.deprecation_warnings["Asking-to-pad-a-fast-tokenizer"] = True
        was_training = self.training
        self.eval()
        try:
            chunks = []
            for start in tqdm(range(0, len(order), batch_size), desc="encode", disable=not show_progress, leave=False):
                rows = [{key: values[i] for key, values in tokens.items()} for i in order[start : start + batch_size]]
                batch = self.tokenizer.pad(rows, return_tensors="pt").to(device)
                with torch.autocast(device_type=device.type, enabled=False):
                    chunks.append(self(batch).float().cpu())
        finally:
            self.train(was_training)
        stacked = torch.cat(chunks)
        embeddings = torch.empty_like(stacked)
        embeddings[torch.tensor(order)] = stacked
        row = {sentence: i for i, sentence in enumerate(unique)}
        return embeddings[[row[s] for s in sentences]].numpy()
