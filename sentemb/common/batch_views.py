"""The views a training batch carries, in order, each under a role: the anchor, its positive, then any others.

A batch from sentemb.data holds the anchor (view 1) under the tokenizer's own names (`input_ids`,
`attention_mask`, `token_type_ids`); every other view holds the same keys under its role's prefix,
`<role>_input_ids`, ...: `positive_` for the positive (a repeated-token copy, a labelled pair's second
sentence), and whatever roles the data was asked for after it (a negation, a hard negative), in the order
the batch holds them. Without a positive of its own the positive view is the anchor's rows again
(unsupervised SimCSE: dropout alone makes the pair). Each view is padded on its own; `stacked_views` lays
them out as the backbone's rows, view after view, one forward over (views × B) rows. A part that reads a
view asks for it by role (`TrainingViews.view`); nothing here knows what a role means.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the role names are read before torch is imported (the labelled reader's pre-run checks)
    import torch

ANCHOR = "anchor"  # view 1: the plain names
POSITIVE = "positive"  # view 2: the anchor's own rows again unless the batch carries one
ROW_KEYS = ("input_ids", "attention_mask", "token_type_ids")
IDS = "input_ids"


def prefix(role: str) -> str:
    """The key prefix of a view's rows: none for the anchor, `<role>_` for any other."""
    return "" if role == ANCHOR else f"{role}_"


def carried_roles(batch: dict[str, torch.Tensor]) -> list[str]:
    """The roles of the views the batch itself carries beyond the anchor, in the batch's order."""
    return [key[: -len(IDS) - 1] for key in batch if key.endswith(f"_{IDS}")]


def view_roles(batch: dict[str, torch.Tensor]) -> list[str]:
    """Every training view's role, in the order the views are laid out: anchor, positive, then the others."""
    return [ANCHOR, POSITIVE, *(role for role in carried_roles(batch) if role != POSITIVE)]


def view_batch(batch: dict[str, torch.Tensor], role: str = ANCHOR) -> dict[str, torch.Tensor] | None:
    """One view's rows under the plain names (`input_ids`, ...), or None when the batch does not carry that view."""
    start = prefix(role)
    if f"{start}{IDS}" not in batch:
        return None
    return {key: batch[f"{start}{key}"] for key in ROW_KEYS if f"{start}{key}" in batch}


def anchor_batch(batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The anchor's rows alone (what encode() and a momentum encoder see)."""
    view = view_batch(batch)
    if view is None:
        raise KeyError("a training batch without input_ids")
    return view


def training_view_batches(batch: dict[str, torch.Tensor]) -> list[dict[str, torch.Tensor]]:
    """Every view's rows in `view_roles` order; the positive is the anchor's rows when the batch carries none."""
    anchor = anchor_batch(batch)
    return [view_batch(batch, role) or anchor for role in view_roles(batch)]


def pad_columns(value: torch.Tensor, width: int, pad: int, left: bool) -> torch.Tensor:
    """`value` (B, T) padded with `pad` to (B, width) on the left or the right."""
    import torch

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
    import torch

    width = max(view["input_ids"].shape[1] for view in views)
    left = padding_side == "left"
    pads = {"input_ids": pad_token_id if pad_token_id is not None else 0, "attention_mask": 0, "token_type_ids": 0}
    keys = [key for key in ROW_KEYS if all(key in view for view in views)]
    return {key: torch.cat([pad_columns(view[key], width, pads[key], left) for view in views]) for key in keys}


def has_views(batch: dict[str, torch.Tensor]) -> bool:
    """Whether the batch carries a view of its own beyond the anchor."""
    return bool(carried_roles(batch))
