"""Poolings for decoder LLMs: last token, position-weighted mean, latent attention, PromptEOL.

Every pooling here finds a sentence's tokens from its attention mask, so it reads the same tokens
under left padding, right padding and padding-free batches (whose states come back padded).

- `last_token` (E5-Mistral, Qwen3-Embedding): the state of the last real token, after EOS is
  appended to every sentence the tokenizer did not end with EOS (a causal decoder's last token is
  the only one that has seen the whole sentence).
- `weighted_mean` (SGPT, Muennighoff 2022, Eq. 1): token i of n weighted i / Σ_j j, so later
  tokens, which have seen more of the sentence in a causal decoder, count more.
- `latent` (NV-Embed, Lee et al. 2024, §3.2): the token states are queries that cross-attend to a
  trainable latent array (keys and values), then an MLP, each with a residual, then the masked mean.
- `prompt_eol` (PromptEOL, Jiang et al. 2023): the sentence inside `This sentence : "[X]" means in
  one word:"`, the last token's state (the model's next-word summary of the sentence).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from transformers import PreTrainedTokenizerBase

from sentemb.common.errors import SentembConfigError
from sentemb.common.numbers import Bounds, require_whole
from sentemb.common.parts import part
from sentemb.encoders.models.model_files import SIZE_LIMITS
from sentemb.encoders.poolings.base import Pooling
from sentemb.encoders.poolings.templates import check_room, model_max_length, real_ids
from sentemb.encoders.serving.onnx_embedder import prepared_rows

MAX_LATENTS = 65536  # 128x NV-Embed's 512
PROMPTEOL_TEMPLATE = 'This sentence : "[X]" means in one word:"'


def last_real_index(attention_mask: torch.Tensor) -> torch.Tensor:
    """(B,) the position of each row's last real token, wherever the padding is."""
    length = attention_mask.shape[1]
    return length - 1 - attention_mask.flip(1).int().argmax(dim=1)


def last_real_state(hidden: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    return hidden[torch.arange(hidden.shape[0], device=hidden.device), last_real_index(attention_mask)]


def padded(rows: list[list[int]], like: dict[str, torch.Tensor], tokenizer: PreTrainedTokenizerBase) -> dict:
    """Rows of ids padded on the tokenizer's padding side, on `like`'s device."""
    batch = tokenizer.pad({"input_ids": rows}, return_tensors="pt")
    return {name: batch[name].to(like["input_ids"].device) for name in ("input_ids", "attention_mask")}


class DecoderPooling(Pooling):
    """No head replaces a decoder pooling's output (SARCSE builds its vector from the encoder's [CLS] layout)."""

    option = ""  # the conf/pooling/ option, as a refusal names it

    def with_head(self, head: Pooling) -> Pooling:
        # not refuse_head's fix (pooling=cls or hicl): neither takes a decoder LLM's token states
        raise SentembConfigError(
            f"head=sarcse with pooling={self.option}: SARCSE builds the sentence vector itself from an encoder's "
            "[CLS] state, so that pooling would be ignored, and no pooling of a decoder LLM has a [CLS] state. "
            "Fix: head=null with a decoder's pooling, or head=sarcse with an encoder (e.g. model=minilm pooling=cls)"
        )


@part("pooling", "last_token")
class LastTokenPooling(DecoderPooling):
    """The last real token's state; `append_eos` adds EOS to each sentence that does not end with it."""

    option = "last_token"

    def __init__(self, hidden_size: int, append_eos: bool = True) -> None:
        super().__init__()
        self.append_eos = append_eos

    def prepare(self, batch: dict[str, torch.Tensor], tokenizer: PreTrainedTokenizerBase) -> dict[str, torch.Tensor]:
        eos = tokenizer.eos_token_id
        if not self.append_eos or eos is None:
            return batch
        last = batch["input_ids"].gather(1, last_real_index(batch["attention_mask"])[:, None])
        if bool((last == eos).all()):  # the tokenizer already ends every sentence with EOS
            return batch
        return padded(prepared_rows(real_ids(batch), self.serving_rows(tokenizer)), batch, tokenizer)

    def serving_rows(self, tokenizer: PreTrainedTokenizerBase) -> dict[str, Any]:
        """`prepare`'s EOS appended to each sentence that does not end with it."""
        eos = tokenizer.eos_token_id
        return {"kind": "append", "token": eos} if self.append_eos and eos is not None else {"kind": "plain"}

    def forward(self, hidden: torch.Tensor, batch: dict[str, torch.Tensor], train_head: bool = False) -> torch.Tensor:
        return last_real_state(hidden, batch["attention_mask"])


def position_weights(attention_mask: torch.Tensor) -> torch.Tensor:
    """(B, L) SGPT's weights: the i-th real token of n gets i / (n(n+1)/2); 0 at padding."""
    rank = attention_mask.long().cumsum(dim=1) * attention_mask.long()
    return rank / rank.sum(dim=1, keepdim=True).clamp(min=1)


@part("pooling", "weighted_mean")
class WeightedMeanPooling(DecoderPooling):
    """Σ_i w_i h_i with SGPT's position weights (later tokens count more)."""

    option = "weighted_mean"

    def __init__(self, hidden_size: int) -> None:
        super().__init__()

    def forward(self, hidden: torch.Tensor, batch: dict[str, torch.Tensor], train_head: bool = False) -> torch.Tensor:
        weights = position_weights(batch["attention_mask"]).to(hidden.dtype)
        return (hidden * weights.unsqueeze(-1)).sum(dim=1)


@part("pooling", "latent")
class LatentAttentionPooling(DecoderPooling):
    """NV-Embed's latent attention: tokens (queries) attend to `num_latents` trainable latents (keys, values) with
    `num_heads` heads, then an MLP of width `intermediate_size` (null: 4 x hidden), each added to its input; the
    masked mean of the result."""

    option = "latent"

    def __init__(
        self, hidden_size: int, num_latents: int = 512, num_heads: int = 8, intermediate_size: int | None = None
    ) -> None:
        super().__init__()
        # bounded: each latent is a trainable row, and the MLP two hidden x intermediate matrices
        require_whole("pooling.num_latents", num_latents, Bounds(1, MAX_LATENTS), "pooling.num_latents=512 (NV-Embed)")
        require_whole("pooling.num_heads", num_heads, Bounds(1), "pooling.num_heads=8 (NV-Embed)")  # divides the width
        if intermediate_size is not None:
            limit = Bounds(1, SIZE_LIMITS["intermediate_size"])
            require_whole("pooling.intermediate_size", intermediate_size, limit, "null (4 x the hidden size)")
        if hidden_size % num_heads:
            raise SentembConfigError(
                f"pooling.num_heads={num_heads} must divide the model's hidden size {hidden_size}. Fix: e.g. "
                f"pooling.num_heads={next(h for h in (8, 4, 2, 1) if hidden_size % h == 0)}"
            )
        width = intermediate_size or 4 * hidden_size
        self.latents = nn.Parameter(torch.randn(num_latents, hidden_size) * hidden_size**-0.5)
        self.query_norm, self.latent_norm = nn.LayerNorm(hidden_size), nn.LayerNorm(hidden_size)
        self.attention = nn.MultiheadAttention(hidden_size, num_heads, batch_first=True)
        self.mlp_norm = nn.LayerNorm(hidden_size)
        self.mlp = nn.Sequential(nn.Linear(hidden_size, width), nn.GELU(), nn.Linear(width, hidden_size))

    def forward(self, hidden: torch.Tensor, batch: dict[str, torch.Tensor], train_head: bool = False) -> torch.Tensor:
        latents = self.latent_norm(self.latents).to(hidden.dtype).expand(hidden.shape[0], -1, -1)
        attended, _ = self.attention(self.query_norm(hidden), latents, latents, need_weights=False)
        states = hidden + attended
        states = states + self.mlp(self.mlp_norm(states))
        mask = batch["attention_mask"].unsqueeze(-1).to(states.dtype)
        return (states * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1.0)


def check_eol_template(template: str) -> str:
    if not isinstance(template, str) or template.count("[X]") != 1:
        raise SentembConfigError(
            f"pooling.template={template!r} must contain [X] (the sentence) exactly once. "
            f"Fix: e.g. pooling.template='{PROMPTEOL_TEMPLATE}'"
        )
    return template


@part("pooling", "prompt_eol")
class PromptEOLPooling(DecoderPooling):
    """PromptEOL: each sentence inside `template` ([X]; the tokenizer's BOS first if it adds one), the last token's
    state. The sentence is truncated to fit `max_length` (null: the tokenizer's limit), never the template."""

    option = "prompt_eol"

    def __init__(self, hidden_size: int, template: str = PROMPTEOL_TEMPLATE, max_length: int | None = None) -> None:
        super().__init__()
        self.template = check_eol_template(template)
        self.max_length = max_length

    def serving_rows(self, tokenizer: PreTrainedTokenizerBase) -> dict[str, Any]:
        """The template's pieces: what the tokenizer puts before any text (a BOS token, or nothing), the text
        before and after [X], the special tokens stripped from the sentence, and the length it is cut to fit."""
        before, after = (tokenizer(part, add_special_tokens=False)["input_ids"] for part in self.template.split("[X]"))
        start = tokenizer("")["input_ids"]
        specials = {tokenizer.bos_token_id, tokenizer.eos_token_id, tokenizer.pad_token_id} - {None}
        limit = self.max_length or model_max_length(tokenizer)
        check_room(len(start) + len(before) + len(after), limit)
        pieces = {"start": start, "prefix": before, "suffix": after, "end": []}
        return {"kind": "template", **pieces, "strip": sorted(specials), "replace": {}, "max_length": limit}

    def prepare(self, batch: dict[str, torch.Tensor], tokenizer: PreTrainedTokenizerBase) -> dict[str, torch.Tensor]:
        return padded(prepared_rows(real_ids(batch), self.serving_rows(tokenizer)), batch, tokenizer)

    def forward(self, hidden: torch.Tensor, batch: dict[str, torch.Tensor], train_head: bool = False) -> torch.Tensor:
        return last_real_state(hidden, batch["attention_mask"])
