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

from sentemb.common.batch_views import view_roles
from sentemb.encoders.models.decoders import is_decoder
from sentemb.encoders.models.padding_free import (
    enable_padding_free,
    layer_states,
    padding_free_states,
    position_ids,
    worth_packing,
)
from sentemb.encoders.poolings.base import Pooling, TrainingViews

BACKBONE_INPUTS = ("input_ids", "attention_mask", "token_type_ids")


class SentenceEncoder(nn.Module):
    """`padding_free` (model.padding_free): the backbone computes only real tokens (encoders/models/padding_free.py)
    where its family packs (encoders/models/families.py); other backbones keep padded batches (one log line says so)."""

    def __init__(
        self,
        backbone: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        pooling: Pooling,
        padding_free: bool = True,
    ) -> None:
        super().__init__()
        self.backbone = backbone
        self.pooling = pooling
        self.tokenizer = tokenizer
        self.padding_free = padding_free and enable_padding_free(backbone)
        # rotary positions count from each sentence's first real token, so left padding moves nothing
        self.explicit_positions = is_decoder(backbone)

    @property
    def hidden_size(self) -> int:
        return self.backbone.config.hidden_size

    def hidden_states(
        self, batch: dict[str, torch.Tensor], backbone: nn.Module | None = None
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The backbone's token states for `batch` after the pooling's own input preparation (template, slices);
        `backbone`: another copy of the backbone (a momentum encoder) instead of this encoder's own."""
        batch = self.pooling.prepare(batch, self.tokenizer)
        return self.backbone_states(batch, backbone), batch

    def backbone_states(self, prepared: dict[str, torch.Tensor], backbone: nn.Module | None = None) -> torch.Tensor:
        inputs = {k: v for k, v in prepared.items() if k in BACKBONE_INPUTS}
        if self.padding_free and worth_packing(inputs["attention_mask"]):
            backbone = self.backbone if backbone is None else backbone
            return padding_free_states(backbone, inputs, self.pooling.hidden_layers)
        return self.padded_states(inputs, backbone)

    def padded_states(self, inputs: dict[str, torch.Tensor], backbone: nn.Module | None = None) -> torch.Tensor:
        """The backbone's token states of a padded batch (its inputs only: BACKBONE_INPUTS)."""
        backbone = self.backbone if backbone is None else backbone
        if self.explicit_positions:
            inputs = {**inputs, "position_ids": position_ids(inputs["attention_mask"], backbone).clamp(min=0)}
        layers = self.pooling.hidden_layers  # first_last_avg, avg_top2: the mean of several layers' states
        return layer_states(backbone(**inputs, output_hidden_states=layers is not None), layers)

    def training_batch(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The backbone's rows of a training step, as the pooling lays them out (`Pooling.training_batch`: both views,
        and a head's own rows such as MNTP's masked copies)."""
        return self.pooling.training_batch(batch, self.tokenizer)

    def training_rows(self, prepared: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Per-row training outputs of prepared rows (any subset of them: GradCache passes chunks)."""
        return self.pooling.training_rows(self.backbone_states(prepared), self.with_side_states(prepared, True))

    def with_side_states(
        self, prepared: dict[str, torch.Tensor], train_head: bool, backbone: nn.Module | None = None
    ) -> dict[str, torch.Tensor]:
        """`prepared` with the states of the pooling's side rows (`Pooling.side_rows`: PromptBERT's template alone), or
        as it is when the pooling has none; positions in the backbone's own numbering (RoBERTa's from pad + 1)."""
        side = self.pooling.side_rows(prepared, self.tokenizer, train_head)
        if side is None:
            return prepared
        backbone = self.backbone if backbone is None else backbone
        inputs = {k: side[k] for k in (*BACKBONE_INPUTS, "position_ids") if k in side}
        if "position_ids" in inputs:
            first = position_ids(torch.ones_like(inputs["position_ids"][:1, :1]), backbone)
            inputs["position_ids"] = inputs["position_ids"] + first
        states = backbone(**inputs).last_hidden_state
        return {**prepared, **{f"side_{k}": v for k, v in side.items() if k not in inputs}, "side_states": states}

    def training_views(self, batch: dict[str, torch.Tensor]) -> TrainingViews:
        """Every view's embeddings in one forward over their rows (unsup. SimCSE: the batch twice, two dropout views),
        train-only heads on, each view named by its role (`view_roles`)."""
        prepared = self.training_batch(batch)
        views = self.pooling.training_views(self.training_rows(prepared), prepared, batch["input_ids"].shape[0])
        return views.named(view_roles(batch))

    def forward(
        self, batch: dict[str, torch.Tensor], train_head: bool = False, backbone: nn.Module | None = None
    ) -> torch.Tensor:
        """Token ids → sentence embeddings (B, H); `train_head` adds the train-only pooling MLP; `backbone` another
        copy of the backbone to compute the token states (ESimCSE's momentum encoder)."""
        hidden, prepared = self.hidden_states(batch, backbone)
        return self.pooling(hidden, self.with_side_states(prepared, train_head, backbone), train_head=train_head)

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
