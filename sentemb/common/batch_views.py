"""The views a training batch carries, by key: the anchor's rows, and optionally a positive and a soft negative.

A batch from sentemb.data holds the anchor (view 1) under the tokenizer's own names (`input_ids`,
`attention_mask`, `token_type_ids`). ESimCSE's word repetition adds the positive view under
`positive_<name>`; SNCSE's soft negatives add each sentence's negation under `negative_<name>`.
Without them the positive view is the anchor's rows again (unsupervised SimCSE: dropout alone makes
the pair). Each group is padded on its own; `stacked_views` lays them out as the backbone's rows:
anchor rows, then positive rows, then (if any) soft-negative rows, one forward over 2B or 3B rows.
"""

from __future__ import annotations

import torch

POSITIVE = "positive_"  # ESimCSE: the copy with repeated tokens (view 2)
NEGATIVE = "negative_"  # SNCSE: the sentence's negation (the soft negative, view 3)
ROW_KEYS = ("input_ids", "attention_mask", "token_type_ids")


def view_batch(batch: dict[str, torch.Tensor], prefix: str = "") -> dict[str, torch.Tensor] | None:
    """One view's rows under the plain names (`input_ids`, ...), or None when the batch does not carry that view."""
    if f"{prefix}input_ids" not in batch:
        return None
    return {key: batch[f"{prefix}{key}"] for key in ROW_KEYS if f"{prefix}{key}" in batch}


def anchor_batch(batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The anchor's rows alone (what encode() and the momentum encoder see)."""
    view = view_batch(batch)
    if view is None:
        raise KeyError("a training batch without input_ids")
    return view


def training_view_batches(batch: dict[str, torch.Tensor]) -> list[dict[str, torch.Tensor]]:
    """[anchor, positive] or [anchor, positive, soft negative]; the positive is the anchor's rows when absent."""
    anchor = anchor_batch(batch)
    views = [anchor, view_batch(batch, POSITIVE) or anchor]
    negative = view_batch(batch, NEGATIVE)
    return views if negative is None else [*views, negative]


def has_soft_negatives(batch: dict[str, torch.Tensor]) -> bool:
    return f"{NEGATIVE}input_ids" in batch


def pad_columns(value: torch.Tensor, width: int, pad: int, left: bool) -> torch.Tensor:
    """`value` (B, T) padded with `pad` to (B, width) on the left or the right."""
    missing = width - value.shape[1]
    if missing <= 0:
        return value
    filler = value.new_full((value.shape[0], missing), pad)
    return torch.cat([filler, value] if left else [value, filler], dim=1)


def stacked_views(
    views: list[dict[str, torch.Tensor]], pad_token_id: int | None, padding_side: str = "right"
) -> dict[str, torch.Tensor]:
    """The views' rows one after another (view 1's B rows, view 2's, ...), padded to the longest on the tokenizer's
    side: ids with the pad token, masks and token types with 0."""
    width = max(view["input_ids"].shape[1] for view in views)
    left = padding_side == "left"
    pads = {"input_ids": pad_token_id if pad_token_id is not None else 0, "attention_mask": 0, "token_type_ids": 0}
    keys = [key for key in ROW_KEYS if all(key in view for view in views)]
    return {key: torch.cat([pad_columns(view[key], width, pads[key], left) for view in views]) for key in keys}


def has_views(batch: dict[str, torch.Tensor]) -> bool:
    """Whether the batch carries a view of its own beyond the anchor (a positive or a soft negative)."""
    return f"{POSITIVE}input_ids" in batch or f"{NEGATIVE}input_ids" in batch
