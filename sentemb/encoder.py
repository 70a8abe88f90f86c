"""SentenceEncoder: backbone + tokenizer + pooling, and the one `encode()` every evaluation uses.

Training-time dev evaluation, `sentemb.evaluate` and export all call `encode()`, so their
numbers are identical by construction.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from torch import nn
from tqdm.auto import tqdm
from transformers import PreTrainedModel, PreTrainedTokenizerBase


class SentenceEncoder(nn.Module):
    def __init__(self, backbone: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, pooling: nn.Module) -> None:
        super().__init__()
        self.backbone = backbone
        self.pooling = pooling
        self.tokenizer = tokenizer

    @property
    def hidden_size(self) -> int:
        return self.backbone.config.hidden_size

    def forward(self, batch: dict[str, torch.Tensor], train_head: bool = False) -> torch.Tensor:
        """Token ids → sentence embeddings (B, H); `train_head` adds the train-only pooling MLP."""
        inputs = {k: v for k, v in batch.items() if k in ("input_ids", "attention_mask", "token_type_ids")}
        hidden = self.backbone(**inputs).last_hidden_state
        return self.pooling(hidden, batch["attention_mask"], train_head=train_head)

    @torch.no_grad()
    def encode(
        self,
        sentences: Sequence[str],
        batch_size: int = 128,
        max_length: int | None = None,
        show_progress: bool = False,
    ) -> np.ndarray:
        """Embed sentences in eval mode, no grad, float32; no truncation unless `max_length` is given.

        Each distinct sentence is encoded once, in batches of similar length (longest first),
        and the rows come back in the input order.
        """
        unique = list(dict.fromkeys(sentences))
        order = sorted(range(len(unique)), key=lambda i: -len(unique[i]))
        device = next(self.backbone.parameters()).device
        was_training = self.training
        self.eval()
        try:
            chunks = []
            starts = range(0, len(order), batch_size)
            for start in tqdm(starts, desc="encode", disable=not show_progress, leave=False):
                texts = [unique[i] for i in order[start : start + batch_size]]
                tokens = self.tokenizer(
                    texts,
                    padding=True,
                    truncation=max_length is not None,
                    max_length=max_length,
                    return_tensors="pt",
                ).to(device)
                with torch.autocast(device_type=device.type, enabled=False):
                    chunks.append(self(tokens).float().cpu())
        finally:
            self.train(was_training)
        if not chunks:
            return np.zeros((0, self.hidden_size), dtype=np.float32)
        stacked = torch.cat(chunks)
        embeddings = torch.empty_like(stacked)
        embeddings[torch.tensor(order)] = stacked
        row = {sentence: i for i, sentence in enumerate(unique)}
        return embeddings[[row[s] for s in sentences]].numpy()
