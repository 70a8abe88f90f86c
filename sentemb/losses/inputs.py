"""What a loss receives: one batch of embeddings, each field named by its role (sentence-transformers' losses
receive every column by role the same way).

    anchors          (N, D)    row i: anchor i
    positives        (N, D)    row i: anchor i's positive
    hard_negatives   k × (N, D) row i of the b-th: anchor i's own b-th hard negative (labelled triplets)
    absent           (N, k)    True where row i has no b-th hard negative (a built-in set's missing column)
    extra            (K, D)    the negatives part's extra negatives (ESimCSE's queue, DCLR's noise), no row's own
    excluded         (N, N + K) the negatives part's false negatives of anchor i among [positives | extra]
    duplicates       (N, N·(1 + k)) True where a candidate among [positives | hard negatives] holds anchor i's own text
    scores           (N,)      each (anchor, positive) pair's gold score in [0, 1]
    targets          TeacherTargets × t  each frozen teacher's embeddings of the same rows, view by view (below)
    added            role → tensor: whatever another part adds

A loss with a negatives' denominator scores anchor i against its candidates, laid out here and nowhere else:

    [positives (N) | hard negatives 1 (N) | ... | hard negatives k (N) | extra (K)]

(supervised SimCSE's cat(z1·z2ᵀ, z1·z3ᵀ), Gao et al. 2021 Eq. 5, then the part's): column N + (b−1)·N + i is anchor
i's own b-th hard negative, and every other row's hard negatives are negatives of i too. `candidate_exclusion` is
the one mask of the candidates that are no negative of anchor i: the part's `excluded`, the `duplicates` and the
`absent` hard negatives. A loss that reads a role itself (a margin over each anchor's own hard negative) reads the
field; nothing else depends on the layout.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import torch

# the roles a loss declares it reads (`Objective.reads`): the fields of `LossInputs` a data set or part fills
ANCHORS, POSITIVES, HARD_NEGATIVES, EXTRA, SCORES, TARGETS = (
    "anchors",
    "positives",
    "hard_negatives",
    "extra",
    "scores",
    "targets",
)
PAIRS = frozenset({ANCHORS, POSITIVES})  # what every batch holds


@dataclass(frozen=True)
class LossInputs:
    """One training batch's embeddings and labels by role (module docstring); only `anchors` and `positives` are
    always there. Fields are the global batch's (gathered over the ranks) when the step gathers."""

    anchors: torch.Tensor
    positives: torch.Tensor
    hard_negatives: tuple[torch.Tensor, ...] = ()
    absent: torch.Tensor | None = None
    extra: torch.Tensor | None = None
    excluded: torch.Tensor | None = None
    duplicates: torch.Tensor | None = None
    scores: torch.Tensor | None = None
    targets: tuple[TeacherTargets, ...] = ()
    added: Mapping[str, torch.Tensor] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.anchors.shape != self.positives.shape or self.anchors.dim() != 2:
            raise ValueError(
                f"a loss expects anchors and positives as (N, D) of equal shape, got {tuple(self.anchors.shape)}, "
                f"{tuple(self.positives.shape)}"
            )
        for number, hard in enumerate(self.hard_negatives, 1):
            if hard.shape != self.anchors.shape:
                raise ValueError(
                    f"hard negatives {number} must be (N, D) = {tuple(self.anchors.shape)} like the anchors (row i: "
                    f"anchor i's own), got {tuple(hard.shape)}"
                )
        if self.absent is not None and tuple(self.absent.shape) != (self.anchors.shape[0], len(self.hard_negatives)):
            raise ValueError(
                f"absent must be (N, k) = ({self.anchors.shape[0]}, {len(self.hard_negatives)}), one column per "
                f"hard-negative view, got {tuple(self.absent.shape)}"
            )

    @property
    def size(self) -> int:
        """N, the anchors."""
        return self.anchors.shape[0]

    def with_roles(self, **roles: Any) -> LossInputs:
        """These inputs with the given fields replaced (a negatives part's `extra` and `excluded`, ...)."""
        return replace(self, **roles)

    def present(self) -> frozenset[str]:
        """The roles these inputs hold (a role with no rows, as a queue still empty, is not held)."""
        held = {
            HARD_NEGATIVES: bool(self.hard_negatives),
            EXTRA: self.extra is not None and self.extra.shape[0] > 0,
            SCORES: self.scores is not None,
            TARGETS: bool(self.targets),
        }
        return PAIRS | {role for role, there in held.items() if there} | set(self.added)

    def others(self) -> torch.Tensor | None:
        """The candidates after the positives, in the layout's order (hard negatives, then extra), or None."""
        rows = [*self.hard_negatives, *([] if self.extra is None or self.extra.shape[0] == 0 else [self.extra])]
        if not rows:
            return None
        return rows[0] if len(rows) == 1 else torch.cat(rows)

    def candidate_count(self) -> int:
        """M: the columns of each anchor's candidates (module docstring)."""
        extra = 0 if self.extra is None else self.extra.shape[0]
        return self.size * (1 + len(self.hard_negatives)) + extra

    def candidate_exclusion(self) -> torch.Tensor | None:
        """(N, M) bool: True where candidate j is no negative of anchor i (the part's false negatives, a duplicated
        text, an absent hard negative); never True on the diagonal. None when nothing is excluded and no mask was
        given (the loss then computes exactly as without one)."""
        n, k = self.size, len(self.hard_negatives)
        if self.duplicates is None and self.absent is None:
            if self.excluded is None or not k:
                return self.excluded
            # the hard negatives' columns inserted, unexcluded
            return torch.cat((self.excluded[:, :n], self.excluded.new_zeros(n, n * k), self.excluded[:, n:]), dim=1)
        own = self.duplicates if self.duplicates is not None else self.anchors.new_zeros(n, n * (1 + k), dtype=bool)
        if self.absent is not None:  # a row's missing hard negative is no negative of any anchor
            own = own | torch.cat((self.absent.new_zeros(n), self.absent.T.reshape(-1)))[None, :]
        extra = 0 if self.extra is None else self.extra.shape[0]
        merged = torch.cat((own, own.new_zeros(n, extra)), dim=1)
        if self.excluded is not None:  # the part's mask: its in-batch columns, then its own after the hard negatives
            merged[:, :n] |= self.excluded[:, :n]
            merged[:, n + n * k :] |= self.excluded[:, n:]
        return merged if bool(merged.any()) or self.excluded is not None else None

    def own_hard_negative_bias(self, weight: float, like: torch.Tensor) -> torch.Tensor:
        """(N, M) logits: `weight` at each anchor's own hard negatives' columns (N + b·N + i), 0 elsewhere."""
        n = self.size
        bias = like.new_zeros(n, self.candidate_count())
        rows = torch.arange(n, device=like.device)
        for block in range(1, len(self.hard_negatives) + 1):
            bias[rows, block * n + rows] = weight
        return bias


@dataclass(frozen=True)
class TeacherTargets:
    """A frozen teacher's embeddings of the step's texts, by the same roles and rows as the student's (`teacher.path`,
    sentemb/training/teacher.py): anchors (N, T), positives (N, T), one (N, T) per hard-negative view; T the teacher's
    width, no gradient. Gathered over the ranks with the student's embeddings. `weight`: the teacher's share where
    several teachers' similarity lists are averaged (`teacher.weights`; RankCSE's α, rankcse/trainers.py line 528)."""

    anchors: torch.Tensor
    positives: torch.Tensor
    hard_negatives: tuple[torch.Tensor, ...] = ()
    weight: float = 1.0

    def views(self) -> tuple[torch.Tensor, ...]:
        """Every view's rows in LossInputs' order: anchors, positives, hard negatives."""
        return (self.anchors, self.positives, *self.hard_negatives)

    def candidates(self) -> torch.Tensor:
        """(N·(1 + k), T): the candidates' layout (module docstring) without extra rows: positives, hard negatives."""
        return torch.cat((self.positives, *self.hard_negatives))


def duplicate_mask(text_ids: torch.Tensor) -> torch.Tensor:
    """The `duplicates` of a batch whose texts have ids `text_ids` (N, V: anchor, positive, hard negatives): (N,
    N·(V − 1)) bool, True where candidate column j holds anchor i's anchor or positive text, or is the positive of
    another row with i's anchor text (a duplicated anchor's other positive); never on the diagonal."""
    anchors, positives = text_ids[:, 0], text_ids[:, 1]
    candidates = text_ids[:, 1:].T.reshape(-1)  # column b·N + j: row j's (b+1)-th candidate text
    n = text_ids.shape[0]
    own = (candidates[None, :] == anchors[:, None]) | (candidates[None, :] == positives[:, None])
    same_anchor = anchors[None, :] == anchors[:, None]  # row j's positive is another positive of i's anchor text
    own[:, :n] |= same_anchor
    own[:, :n].fill_diagonal_(False)
    return own
