"""What a labelled batch adds to a step's loss: its hard negatives as extra candidate columns, its duplicates masked.

A labelled batch (sentemb.data.labelled) carries each row's hard negatives as views `hard_negative_1` ... and each
text's id (`text_ids`, (B, views)). The in-batch loss then scores anchor i against the candidates

    [positives (N) | hard negatives 1 (N) | ... | hard negatives k (N) | the negatives part's (a queue, noise)]

(supervised SimCSE's cat(z1·z2ᵀ, z1·z3ᵀ), Gao et al. 2021 Eq. 5), so column N + (b−1)·N + i is anchor i's own b-th
hard negative, and every other row's hard negatives are negatives of i too. A text met twice in the global batch is
never a negative for itself: candidate j of anchor i is masked (`excluded`: out of the denominator) when its text is
i's anchor or positive text, when j is the positive of another row with i's anchor text (a duplicated anchor's
other positive), or when it is a hard negative the row lacks (`ABSENT`).
"""

from __future__ import annotations

from dataclasses import replace

import torch

from sentemb.data.labelled import ABSENT, is_hard_negative
from sentemb.encoders.poolings.base import TrainingViews
from sentemb.training.negatives import StepNegatives


def hard_negative_views(views: TrainingViews) -> list[torch.Tensor]:
    """The hard-negative views' embeddings, in the batch's order (none for unlabelled data)."""
    return [embedding for role, embedding in zip(views.roles, views.embeddings, strict=True) if is_hard_negative(role)]


def duplicate_mask(text_ids: torch.Tensor) -> torch.Tensor:
    """(N, N·(V − 1)) bool: True where candidate column j (the positives, then each hard-negative view's rows) is no
    negative of anchor i (module docstring); never True on the diagonal (i's own positive). `text_ids`: (N, V)."""
    anchors, positives = text_ids[:, 0], text_ids[:, 1]
    candidates = text_ids[:, 1:].T.reshape(-1)  # column b·N + j: row j's (b+1)-th candidate text
    n = text_ids.shape[0]
    own = (candidates[None, :] == anchors[:, None]) | (candidates[None, :] == positives[:, None])
    own |= (candidates == ABSENT)[None, :]
    same_anchor = anchors[None, :] == anchors[:, None]  # row j's positive is another positive of i's anchor text
    own[:, :n] |= same_anchor
    own[:, :n].fill_diagonal_(False)
    return own


def with_labelled(
    step: StepNegatives, hard: list[torch.Tensor], text_ids: torch.Tensor | None, masks: bool
) -> StepNegatives:
    """The step's negatives with the labelled hard negatives first (`hard`: k global (N, D) views), and its
    exclusions with the duplicates' (`masks`: the loss takes exclusions; `text_ids`: the global batch's)."""
    if not hard and (text_ids is None or not masks):
        return step
    extra = step.negatives
    negatives = torch.cat([*hard, *([] if extra is None else [extra])]) if hard else extra
    excluded = step.excluded
    if masks and text_ids is not None:
        labelled = duplicate_mask(text_ids[:, : 2 + len(hard)])
        n, queued = labelled.shape[0], 0 if extra is None else extra.shape[0]
        merged = torch.cat((labelled, labelled.new_zeros(n, queued)), dim=1)
        if excluded is not None:  # the part's mask: its in-batch columns, then its own after the hard negatives
            merged[:, :n] |= excluded[:, :n]
            merged[:, n + n * len(hard) :] |= excluded[:, n:]
        excluded = merged if bool(merged.any()) or excluded is not None else None
    elif excluded is not None and hard:  # the hard negatives' columns inserted, unexcluded
        n = excluded.shape[0]
        excluded = torch.cat((excluded[:, :n], excluded.new_zeros(n, n * len(hard)), excluded[:, n:]), dim=1)
    return replace(step, negatives=negatives, excluded=excluded, hard_negatives=len(hard))
