"""A training step's `LossInputs` (sentemb/losses/inputs.py): the views' embeddings and the batch's labels by role.

The anchor and positive views are the anchors and positives; a labelled batch's hard-negative views
(`hard_negative_1` ...) its hard negatives, with the rows that lack one (`absent`: a built-in set's missing column,
text id `ABSENT`); its scores the scores. Where the loss masks duplicates out of its negatives (it has a negatives'
denominator), each text's id (`text_ids`) gives the `duplicates`. Under DDP with gathered negatives every field is
the global batch's.
"""

from __future__ import annotations

import torch

from sentemb.data.labelled import ABSENT, SCORES, TEXT_IDS, is_hard_negative
from sentemb.encoders.poolings.base import TrainingViews
from sentemb.losses.inputs import LossInputs, duplicate_mask
from sentemb.training.distributed import gather_with_grad
from sentemb.training.negatives.base import gathered


def hard_negative_views(views: TrainingViews) -> list[torch.Tensor]:
    """The hard-negative views' embeddings, in the batch's order (none for unlabelled data)."""
    return [embedding for role, embedding in zip(views.roles, views.embeddings, strict=True) if is_hard_negative(role)]


def present_rows(batch: dict[str, torch.Tensor], views: TrainingViews) -> dict[str, torch.Tensor]:
    """role → (B,) bool: the rows that have that hard-negative view, for each one some row lacks (none elsewhere)."""
    text_ids = batch.get(TEXT_IDS)
    if text_ids is None:
        return {}
    roles = [role for role in views.roles if is_hard_negative(role)]
    # text_ids' columns: anchor, positive, then the hard negatives in view order
    return {role: text_ids[:, 2 + number] != ABSENT for number, role in enumerate(roles)}


def step_inputs(views: TrainingViews, batch: dict[str, torch.Tensor], world: int, masks_duplicates: bool) -> LossInputs:
    """The step's loss inputs from its views and batch, gathered over the ranks when `world` > 1;
    `masks_duplicates`: the loss has negatives to mask duplicated texts out of."""
    z1, z2, hard = views.z1, views.z2, hard_negative_views(views)
    text_ids, scores = batch.get(TEXT_IDS), batch.get(SCORES)
    if world > 1:
        z1, z2, hard = gather_with_grad(z1), gather_with_grad(z2), [gather_with_grad(h) for h in hard]
        text_ids, scores = (None if x is None else gathered(x) for x in (text_ids, scores))
    ids = None if text_ids is None else text_ids[:, : 2 + len(hard)]
    return LossInputs(
        anchors=z1,
        positives=z2,
        hard_negatives=tuple(hard),
        absent=ids[:, 2:] == ABSENT if ids is not None and hard else None,
        duplicates=duplicate_mask(ids) if ids is not None and masks_duplicates else None,
        scores=scores,
    )
