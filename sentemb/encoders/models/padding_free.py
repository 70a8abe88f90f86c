"""Padding-free encoding: the backbone's linear layers see only a batch's real tokens.

A padded batch (B, L) of a family that packs (encoders/models/families.py) is packed into one row of its T real tokens
(`input_ids` (1, T), `position_ids` restarting at every sentence, as transformers'
`DataCollatorWithFlattening` builds them). Embeddings, Q/K/V, output projections and
feed-forward layers (nearly all of an encoder's FLOPs at SimCSE's lengths) then run on T rows
instead of B·L. Attention must not cross a sentence boundary: `packed_attention`, registered
through transformers' `AttentionInterface`, lays Q, K and V out per sentence again and runs
`scaled_dot_product_attention` with the key-padding mask, so every sentence attends to its
own tokens only, with the same attention dropout as the padded path (SimCSE's augmentation
includes it; flash-attention's varlen kernels have none, so they are not used here). Its
cost, O(L²) per sentence, is small next to the linear layers at these lengths.

A batch that is nearly free of padding already (`encode()` sorts sentences by length) is left
padded: `worth_packing`. The token states come back in the padded (B, L, H) layout (zeros at
padding), so every pooling and head (CLS, mean, prompt [MASK], HiCL segments, SARCSE) reads them unchanged.
Padded calls of the same backbone (no packing arguments) run transformers' SDPA attention.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from transformers import AttentionInterface, PreTrainedModel
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from sentemb.encoders.models.cpu_attention import guard_cpu_attention
from sentemb.encoders.models.families import family_of

log = logging.getLogger(__name__)

ATTENTION = "sentemb_padding_free"
# attention implementations whose padded computation `packed_attention` reproduces (eager and SDPA are the same maths)
REPLACEABLE_ATTENTION = ("sdpa", "eager", ATTENTION)
# a batch at least this dense stays padded: packing's re-layout then costs more than the padding it saves
# (make bench, 2-core CPU: training batches 68% real tokens 1.26x faster packed; encode()'s length-sorted
# batches, ~95% real, 0.94x)
PACK_BELOW = 0.85


def worth_packing(attention_mask: torch.Tensor) -> bool:
    """Whether packing saves time on this batch: its real tokens under PACK_BELOW of its padded size."""
    return bool(attention_mask.float().mean() < PACK_BELOW)


@dataclass(frozen=True)
class PackedRows:
    """Where a padded batch's real tokens are: flat indices into B·L, and the (B, L) key-padding mask."""

    token_index: torch.Tensor  # (T,) positions of the real tokens in the flattened (B·L) batch, row-major
    key_mask: torch.Tensor  # (B, L) bool: True at real tokens

    @classmethod
    def of(cls, attention_mask: torch.Tensor) -> PackedRows:
        keep = attention_mask.bool()
        # a row without tokens would give softmax over nothing (NaN); let it attend to its own padding instead
        keep = keep | ~keep.any(dim=1, keepdim=True)
        return cls(attention_mask.bool().flatten().nonzero().squeeze(1), keep)

    def causal_mask(self) -> torch.Tensor:
        """(B, 1, L, L): real keys at or before each query; a query before its row's first real token (left padding)
        keeps itself, so no softmax row is empty (its output is dropped)."""
        length = self.key_mask.shape[1]
        ones = torch.ones(length, length, dtype=torch.bool, device=self.key_mask.device)
        eye = torch.eye(length, dtype=torch.bool, device=self.key_mask.device)
        return (self.key_mask[:, None, None, :] & ones.tril()) | eye

    def pack(self, padded: torch.Tensor) -> torch.Tensor:
        """(B, L) → (1, T): the real tokens, sentence after sentence."""
        return padded.flatten().index_select(0, self.token_index).unsqueeze(0)

    def unpack(self, states: torch.Tensor) -> torch.Tensor:
        """(1, T, H) → (B, L, H), zeros at padding."""
        rows, length = self.key_mask.shape
        flat = states.new_zeros(rows * length, states.shape[-1]).index_copy(0, self.token_index, states[0])
        return flat.view(rows, length, -1)


def packed_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    packed_rows: PackedRows | None = None,
    **kwargs: object,
) -> tuple[torch.Tensor, None]:
    """Attention over packed tokens (1, heads, T, d), each sentence attending to itself; SDPA when not packed."""
    if packed_rows is None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout, scaling, **kwargs)
    rows, length = packed_rows.key_mask.shape
    heads, dim = query.shape[1], query.shape[3]
    # a causal decoder: each token attends to its sentence's earlier tokens only
    allowed = packed_rows.causal_mask() if causal_attention(module) else packed_rows.key_mask[:, None, None, :]

    def per_sentence(x: torch.Tensor) -> torch.Tensor:  # (1, h, T, d) → (B, h, L, d); h: query or key/value heads
        flat = x.new_zeros(x.shape[1], rows * length, dim).index_copy(1, packed_rows.token_index, x[0])
        return flat.view(x.shape[1], rows, length, dim).transpose(0, 1)

    out = F.scaled_dot_product_attention(
        per_sentence(query),
        per_sentence(key),
        per_sentence(value),
        attn_mask=allowed,
        dropout_p=dropout,
        scale=scaling,
        enable_gqa=key.shape[1] != heads,  # grouped-query attention (decoders): fewer key/value heads than query heads
    )
    # (B, heads, L, d) → the real tokens' rows (1, T, heads, d), the layout transformers' attention functions return
    out = out.transpose(1, 2).reshape(rows * length, heads, dim).index_select(0, packed_rows.token_index)
    return out.unsqueeze(0), None


def causal_attention(module: torch.nn.Module) -> bool:
    """Whether an attention layer is causal: decoders' layers say so, and their config's `is_causal` can switch it off
    (model.bidirectional)."""
    return bool(getattr(module, "is_causal", False)) and getattr(getattr(module, "config", None), "is_causal", True)


AttentionInterface.register(ATTENTION, packed_attention)
AttentionMaskInterface.register(ATTENTION, sdpa_mask)  # padded calls build SDPA's mask
guard_cpu_attention()  # bf16 attention that holds under any CPU kernel family (cpu_attention.py), padded or packed


def unsupported_reason(backbone: PreTrainedModel) -> str | None:
    """Why `backbone` cannot encode padding-free (None: it can)."""
    family = family_of(backbone.config)
    if family is None or not family.padding_free:  # the position ids written here: from 0, or RoBERTa's offset
        model_type = getattr(backbone.config, "model_type", None)
        return f"model_type {model_type!r} is not a family that packs (encoders/models/families.py: padding_free)"
    if not backbone._can_set_attn_implementation():
        return f"{type(backbone).__name__} does not route attention through transformers' AttentionInterface"
    if backbone.config._attn_implementation not in REPLACEABLE_ATTENTION:
        return f"it was loaded with attn_implementation={backbone.config._attn_implementation!r}"
    return None


def enable_padding_free(backbone: PreTrainedModel) -> bool:
    """Switch `backbone` to the packed-aware attention; False (and one log line) where it cannot take it."""
    reason = unsupported_reason(backbone)
    if reason is not None:
        log.info("padding-free encoding is off for %s: %s; batches stay padded", type(backbone).__name__, reason)
        return False
    backbone.set_attn_implementation(ATTENTION)
    return True


def position_ids(attention_mask: torch.Tensor, backbone: PreTrainedModel) -> torch.Tensor:
    """Each real token's position within its sentence (B, L), in the backbone's own numbering."""
    within = attention_mask.long().cumsum(dim=1) - 1
    if getattr(family_of(backbone.config), "position_offset", False):  # RoBERTa: from padding_idx + 1
        return within + backbone.config.pad_token_id + 1
    return within


def padding_free_states(
    backbone: PreTrainedModel, batch: dict[str, torch.Tensor], layers: tuple[int, ...] | None = None
) -> torch.Tensor:
    """`backbone(**batch).last_hidden_state` computed on the real tokens only; (B, L, H), zeros at padding. `layers`:
    the mean of those `hidden_states` instead (`layer_states`)."""
    rows = PackedRows.of(batch["attention_mask"])
    inputs = {"input_ids": rows.pack(batch["input_ids"])}
    inputs["position_ids"] = rows.pack(position_ids(batch["attention_mask"], backbone))
    if "token_type_ids" in batch:
        inputs["token_type_ids"] = rows.pack(batch["token_type_ids"])
    output = backbone(**inputs, packed_rows=rows, output_hidden_states=layers is not None)
    return rows.unpack(layer_states(output, layers))


def layer_states(output: Any, layers: tuple[int, ...] | None) -> torch.Tensor:
    """The token states a pooling reads from a backbone's output: the last layer's, or the mean of `layers` (indices
    into `hidden_states`: 0 the embedding output, 1 the first transformer layer, −1 the last)."""
    if layers is None:
        return output.last_hidden_state
    return torch.stack([output.hidden_states[index] for index in layers]).mean(dim=0)
