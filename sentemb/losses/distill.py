"""Distillation from a frozen teacher (`teacher.path`, sentemb/training/teacher.py): losses that read the teacher's
embeddings of the same texts (`LossInputs.targets`, one `TeacherTargets` per teacher) beside the student's.

Several teachers (`teacher.path=[a, b]`, `teacher.weights=[w_1, w_2]`, Σ w = 1): the lists and margins below use the
teachers' weighted average, Σ_t w_t · sim_t(·)/τ_t (RankCSE's two teachers, rankcse/trainers.py lines 526-528:
α·first + (1 − α)·second, each cos / --tau2); distill_mse reads one teacher's embeddings and is refused with several.

distill_mse (sentence-transformers' MSELoss / EmbedDistillLoss; Reimers & Gurevych 2020, Eq. 1): over every view v
(anchors, positives, each hard-negative view), s the student's embedding (through a learnt Linear P when the widths
differ), t the teacher's,

    L = mean_v  mean_{i, d} (P s_vi − t_vi)²_d           (distance: mse)
    L = mean_v  mean_i (1 − cos(P s_vi, t_vi))            (distance: cosine, EmbedDistillLoss' cosine)

distill_kl (sentence-transformers' DistillKLDivLoss; RankCSE's listNet, Liu et al. 2023 Eq. 7): for anchor i over its
candidates C_i, with sim the cosine (or the dot product), p the student's and q the teacher's softmax,

    p_ij = softmax_j(sim(s_i, s_j) / τ_s),   q_ij = softmax_j(sim(t_i, t_j) / τ_t),   j ∈ C_i
    L = (τ_s² if tau_squared) · (1/N) Σ_i KL(q_i ‖ p_i)

C_i is `candidates: batch` (LossInputs' layout: every row's positive and hard negatives, RankCSE's in-batch list) or
`own` (anchor i's positive and own hard negatives, DistillKLDivLoss' columns); `drop_positive` leaves anchor i's own
positive out of its list on both sides (RankCSE's listNet fills that diagonal with −inf, rankcse/models.py line 74-75).

listmle (RankCSE's ListMLE, Xia et al. 2008; rankcse/models.py lines 89-109): the candidates ordered by the teacher's
similarity (descending, ties by column), π, the student's logits x_j = sim(s_i, s_j)/τ_s in that order,

    L = (1/N) Σ_i Σ_r [log(Σ_{r' ≥ r} exp(x_π(r') − max x) + 1e-7) − (x_π(r) − max x)]

(the released code shuffles before sorting to break ties at random; here a tie keeps the columns' order, so a step is
reproducible; without ties the two are the same).

margin_mse (sentence-transformers' MarginMSELoss; Hofstätter et al. 2020): for each anchor's own hard negative b,

    L = mean_{i, b} ((sim(s_i, s⁺_i) − sim(s_i, s⁻_ib)) − (sim(t_i, t⁺_i) − sim(t_i, t⁻_ib)))²

with sim the dot product (`similarity: dot`, MarginMSELoss' default pairwise_dot_score) or the cosine; the teacher's
margin is computed from its embeddings (MarginMSELoss takes it as a label).

A teacher embeds the batch's texts only: extra negatives of a negatives part (a queue, noise) have no target and are
refused; labelled hard negatives are rows of every view (distill_mse), candidates (distill_kl, listmle) or margins
(margin_mse). An absent hard negative (a row without that column) is left out on both sides. Similarities in float32
(float64 stays float64), autocast off. Each combines with any objective through loss=sum.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from sentemb.common.errors import SentembConfigError
from sentemb.common.parts import part
from sentemb.losses.base import LossOutput, Objective, normalize, require_choice, require_positive
from sentemb.losses.inputs import HARD_NEGATIVES, PAIRS, TARGETS, LossInputs, TeacherTargets

LISTMLE_EPS = 1e-7  # rankcse/models.py line 87: `self.eps = 1e-7`, inside the log of each suffix sum
SIMILARITIES = ("cos", "dot")
# what a teacher's loss runs beside (`companions`: the every-option check runs it so): a teacher; margin_mse's triplets
TEACHER = ("teacher.path=minilm",)
TRIPLETS = (*TEACHER, "data=labelled")


def floating(z: torch.Tensor) -> torch.Tensor:
    """float32 for half precision (similarities in float32), float64 kept (gradient tests)."""
    return z if z.dtype in (torch.float32, torch.float64) else z.float()


class TeacherObjective(Objective):
    """A loss that reads a teacher's targets (`reads` holds `targets`): refused without `teacher.path` before any model
    loads; it takes labelled hard negatives (the teacher embeds them too) and no extra negatives."""

    reads = frozenset({*PAIRS, TARGETS})
    no_negatives = (
        "a teacher embeds the batch's own texts, so a negatives part's extra rows (a queue, noise) have no target"
    )
    conventions = ("paper",)
    has_symmetric = False

    @classmethod
    def hard_negatives_refusal(cls, config: Mapping[str, Any]) -> str | None:
        return None  # the teacher embeds every view, hard negatives included

    def refuses_hard_negatives(self) -> str | None:
        return None

    def check_reads(self, inputs: LossInputs) -> None:
        """The targets there: a tuple of `TeacherTargets`, each with one (N, T) tensor per view of the inputs, their
        weights summing to 1."""
        super().check_reads(inputs)
        teachers = inputs.targets
        if not isinstance(teachers, tuple) or not all(isinstance(t, TeacherTargets) for t in teachers):
            raise ValueError(
                f"{type(self).__name__}: targets must be a tuple of TeacherTargets (each teacher's embeddings by "
                f"role), got {type(teachers).__name__}"
            )
        if abs(sum(t.weight for t in teachers) - 1.0) > 1e-6:
            raise ValueError(f"{type(self).__name__}: the teachers' weights sum to {sum(t.weight for t in teachers)}")
        for targets in teachers:
            if len(targets.hard_negatives) != len(inputs.hard_negatives):
                raise ValueError(
                    f"{type(self).__name__}: the teacher's targets hold {len(targets.hard_negatives)} hard-negative "
                    f"views, the inputs {len(inputs.hard_negatives)}"
                )
            for view in targets.views():
                if view.dim() != 2 or view.shape[0] != inputs.size:
                    raise ValueError(
                        f"{type(self).__name__}: each teacher view must be (N, T) with N = {inputs.size}, got "
                        f"{tuple(view.shape)}"
                    )

    def bind_widths(self, student: int, teacher: int) -> None:
        """Told the student's and the teacher's widths once both are known (before any checkpoint loads)."""


def present_rows(inputs: LossInputs) -> list[torch.Tensor | None]:
    """Per view (anchors, positives, hard negatives): (N,) bool of the rows that hold it, None where every row does."""
    absent = inputs.absent
    hard = [None if absent is None else ~absent[:, b] for b in range(len(inputs.hard_negatives))]
    return [None, None, *hard]


def similarity(a: torch.Tensor, b: torch.Tensor, kind: str) -> torch.Tensor:
    """(N, M) similarities of rows a (N, D) and b (M, D): cosines (normalised) or dot products."""
    if kind == "cos":
        a, b = normalize(a), normalize(b)
    return floating(a) @ floating(b).T


def teachers_average(inputs: LossInputs, score: Callable[[TeacherTargets], torch.Tensor]) -> torch.Tensor:
    """Σ_t w_t · score(t) over the teachers' targets: their weighted average (one teacher: weight 1, the score itself;
    RankCSE's two: α · first + (1 − α) · second, rankcse/trainers.py lines 526-528)."""
    average = None
    for targets in inputs.targets:
        weighted = targets.weight * score(targets)
        average = weighted if average is None else average + weighted
    return average


def candidate_logits(
    inputs: LossInputs, anchors: torch.Tensor, candidates: tuple[torch.Tensor, ...], kind: str, own: bool
) -> torch.Tensor:
    """(N, M) similarities of each anchor with its candidates: every view's rows after the anchors (`batch`, M =
    N·(1 + k)) or its own (`own`, M = 1 + k)."""
    if own:
        if kind == "cos":
            anchors, candidates = normalize(anchors), tuple(normalize(c) for c in candidates)
        return torch.stack([(floating(anchors) * floating(c)).sum(-1) for c in candidates], dim=1)
    return similarity(anchors, torch.cat(candidates), kind)


def candidate_mask(inputs: LossInputs, own: bool, drop_positive: bool) -> torch.Tensor | None:
    """(N, M) bool, True where a candidate is out of anchor i's list: an absent hard negative, its own positive
    (`drop_positive`); None when nothing is."""
    n, k = inputs.size, len(inputs.hard_negatives)
    device = inputs.anchors.device
    mask = torch.zeros(n, 1 + k if own else n * (1 + k), dtype=torch.bool, device=device)
    if inputs.absent is not None:
        absent = inputs.absent.to(device)
        if own:
            mask[:, 1:] |= absent
        else:  # column (1 + b)·N + j: row j's b-th hard negative, out of every anchor's list where j lacks it
            mask[:, n:] |= absent.T.reshape(-1)[None, :]
    if drop_positive:
        if own:
            mask[:, 0] = True
        else:
            mask[:, :n].fill_diagonal_(True)
    return mask if bool(mask.any()) else None


class ListObjective(TeacherObjective):
    """The shared fields of the losses over each anchor's candidate list (distill_kl, listmle)."""

    def __init__(
        self,
        student_tau: float = 0.05,
        teacher_tau: float = 0.05,
        similarity: str = "cos",
        candidates: str = "batch",
        drop_positive: bool = False,
    ) -> None:
        super().__init__()
        self.student_tau = require_positive("student_tau", student_tau, "0.05")
        self.teacher_tau = require_positive("teacher_tau", teacher_tau, "0.05")
        self.similarity = require_choice("similarity", similarity, SIMILARITIES)
        self.candidates = require_choice("candidates", candidates, ("batch", "own"))
        if not isinstance(drop_positive, bool):
            raise SentembConfigError(
                f"loss.drop_positive={drop_positive!r} must be true or false. Fix: loss.drop_positive=false"
            )
        self.drop_positive = drop_positive

    def lists(self, inputs: LossInputs) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """(student logits, teacher logits, the mask of candidates out of each list), (N, M) each."""
        own = self.candidates == "own"
        if own and not inputs.hard_negatives and not self.drop_positive:
            raise ValueError(
                f"{type(self).__name__} with candidates=own over pairs alone: each anchor's list holds its positive "
                "only, so the loss is 0. Fix: loss.candidates=batch, or data with a hard-negative column"
            )
        views = (inputs.positives, *inputs.hard_negatives)
        student = candidate_logits(inputs, inputs.anchors, views, self.similarity, own)

        def logits(targets: TeacherTargets) -> torch.Tensor:  # sim_t / τ_t
            views = (targets.positives, *targets.hard_negatives)
            similarities = candidate_logits(inputs, targets.anchors, views, self.similarity, own)
            return similarities.to(student.dtype) / self.teacher_tau

        teacher = teachers_average(inputs, logits)
        return student / self.student_tau, teacher, candidate_mask(inputs, own, self.drop_positive)


@part("loss", "distill_kl", companions=TEACHER)
class DistillKL(ListObjective):
    """KL(teacher ‖ student) between the softmax similarity distributions over each anchor's candidates (module
    docstring): sentence-transformers' DistillKLDivLoss, RankCSE's listNet."""

    def __init__(
        self,
        student_tau: float = 0.05,
        teacher_tau: float = 0.05,
        similarity: str = "cos",
        candidates: str = "batch",
        drop_positive: bool = False,
        tau_squared: bool = False,
    ) -> None:
        super().__init__(student_tau, teacher_tau, similarity, candidates, drop_positive)
        if not isinstance(tau_squared, bool):
            raise SentembConfigError(
                f"loss.tau_squared={tau_squared!r} must be true or false. Fix: loss.tau_squared=false"
            )
        self.tau_squared = tau_squared

    def compute(self, inputs: LossInputs) -> LossOutput:
        with torch.autocast(device_type=inputs.anchors.device.type, enabled=False):
            student, teacher, mask = self.lists(inputs)
            if mask is not None:
                student, teacher = student.masked_fill(mask, float("-inf")), teacher.masked_fill(mask, float("-inf"))
            log_p, log_q = student.log_softmax(dim=1), teacher.detach().log_softmax(dim=1)
            # q·(log q − log p), 0 where a candidate is out of the list (KLDivLoss' batchmean: the sum over N rows)
            terms = log_q.exp() * (log_q - log_p)
            if mask is not None:
                terms = terms.masked_fill(mask, 0.0)
            loss = terms.sum() / student.shape[0]
            if self.tau_squared:  # DistillKLDivLoss' `loss * self.student_temperature ** 2` (Hinton et al. 2015)
                loss = loss * self.student_tau**2
        return LossOutput(loss)


@part("loss", "listmle", companions=TEACHER)
class ListMLE(ListObjective):
    """RankCSE's ListMLE: the student's likelihood of the teacher's ranking of each anchor's candidates (module
    docstring)."""

    def compute(self, inputs: LossInputs) -> LossOutput:
        with torch.autocast(device_type=inputs.anchors.device.type, enabled=False):
            student, teacher, mask = self.lists(inputs)
            if mask is not None:  # out of the list: ranked last by the teacher, −inf for the student, no term
                teacher = teacher.masked_fill(mask, float("-inf"))
            _, order = teacher.detach().sort(dim=1, descending=True, stable=True)
            ranked = student.gather(1, order)
            out = None if mask is None else mask.gather(1, order)
            if out is not None:
                ranked = ranked.masked_fill(out, float("-inf"))
            # the max keeps its gradient as the released code's does (line 103-104): with the 1e-7 inside the log the
            # shift is not exactly neutral where a suffix sum is below it
            shifted = ranked - ranked.max(dim=1, keepdim=True).values
            # Σ_{r' ≥ r} exp(x_r' − max): a reversed cumulative sum (rankcse/models.py line 105)
            suffix = shifted.exp().flip(dims=[1]).cumsum(dim=1).flip(dims=[1])
            terms = torch.log(suffix + LISTMLE_EPS) - shifted
            if out is not None:
                terms = terms.masked_fill(out, 0.0)
            loss = terms.sum(dim=1).mean()
        return LossOutput(loss)


@part("loss", "distill_mse", companions=TEACHER)
class DistillMSE(TeacherObjective):
    """The student's embedding of every view against the teacher's (module docstring): sentence-transformers'
    MSELoss (distance: mse) or EmbedDistillLoss' cosine (distance: cosine); a learnt Linear maps the student's width
    to the teacher's when they differ (a submodule: trained, saved in the checkpoint)."""

    def __init__(self, distance: str = "mse", normalize: bool = False) -> None:
        super().__init__()
        self.distance = require_choice("distance", distance, ("mse", "cosine"))
        if not isinstance(normalize, bool):
            raise SentembConfigError(f"loss.normalize={normalize!r} must be true or false. Fix: loss.normalize=false")
        self.normalize = normalize
        self.projection: nn.Linear | None = None

    def bind_widths(self, student: int, teacher: int) -> None:
        """A Linear student → teacher width when they differ (EmbedDistillLoss' projection_dim), else none."""
        self.projection = nn.Linear(student, teacher) if student != teacher else None

    def projected(self, student: torch.Tensor) -> torch.Tensor:
        """P s. Under DDP every rank computes this loss on the gathered batch and the step scales its backward by the
        world size (training/module.py `step_loss`), which is exact for the encoder (each rank back-propagates into its
        own rows); the projection sees every row on every rank, so its gradient is scaled back by 1/world here (the
        value unchanged): DDP's average is then one process's gradient."""
        weight, bias = self.projection.weight, self.projection.bias
        world = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
        if world > 1:
            weight = weight.detach() + (weight - weight.detach()) / world
            bias = bias.detach() + (bias - bias.detach()) / world
        return F.linear(student.to(weight.dtype), weight, bias).to(student.dtype)

    def compute(self, inputs: LossInputs) -> LossOutput:
        if len(inputs.targets) != 1:
            raise ValueError(
                f"DistillMSE matches one teacher's embeddings, got {len(inputs.targets)} teachers' (refused before "
                "training by the teacher check)"
            )
        (targets,) = inputs.targets
        views = (inputs.anchors, inputs.positives, *inputs.hard_negatives)
        losses = []
        with torch.autocast(device_type=inputs.anchors.device.type, enabled=False):
            for student, teacher, rows in zip(views, targets.views(), present_rows(inputs), strict=True):
                student = floating(student)
                if self.projection is not None:
                    student = self.projected(student)
                if student.shape[1] != teacher.shape[1]:
                    raise ValueError(
                        f"DistillMSE: the student's width {student.shape[1]} is not the teacher's {teacher.shape[1]} "
                        "and no projection was bound (bind_widths)"
                    )
                teacher = teacher.detach().to(student.dtype)
                if self.normalize:
                    student, teacher = F.normalize(student, dim=-1), F.normalize(teacher, dim=-1)
                if rows is not None:
                    student, teacher = student[rows.to(student.device)], teacher[rows.to(student.device)]
                    if student.shape[0] == 0:
                        continue
                if self.distance == "mse":  # F.mse_loss: the mean over rows and dimensions (ST's MSELoss)
                    losses.append(F.mse_loss(student, teacher))
                else:
                    losses.append((1 - F.cosine_similarity(student, teacher, dim=-1)).mean())
            loss = torch.stack(losses).mean()  # the mean over views (EmbedDistillLoss' `torch.stack(losses).mean()`)
        return LossOutput(loss)


@part("loss", "margin_mse", companions=TRIPLETS)
class MarginMSE(TeacherObjective):
    """sentence-transformers' MarginMSELoss: the student's margin sim(a, p) − sim(a, n) against the teacher's, for
    each anchor's own hard negatives (module docstring)."""

    reads = frozenset({*PAIRS, HARD_NEGATIVES, TARGETS})

    def __init__(self, similarity: str = "dot") -> None:
        super().__init__()
        self.similarity = require_choice("similarity", similarity, ("dot", "cos"))

    def margins(
        self, anchors: torch.Tensor, positives: torch.Tensor, negatives: tuple[torch.Tensor, ...]
    ) -> torch.Tensor:
        """(N, k): sim(a_i, p_i) − sim(a_i, n_ib)."""
        if self.similarity == "cos":
            anchors, positives = normalize(anchors), normalize(positives)
            negatives = tuple(normalize(n) for n in negatives)
        anchors, positives = floating(anchors), floating(positives)
        positive = (anchors * positives).sum(-1)
        return torch.stack([positive - (anchors * floating(n)).sum(-1) for n in negatives], dim=1)

    def compute(self, inputs: LossInputs) -> LossOutput:
        with torch.autocast(device_type=inputs.anchors.device.type, enabled=False):
            student = self.margins(inputs.anchors, inputs.positives, inputs.hard_negatives)
            teacher = teachers_average(
                inputs, lambda t: self.margins(t.anchors, t.positives, t.hard_negatives).detach().to(student.dtype)
            )
            squared = (student - teacher) ** 2
            if inputs.absent is not None:  # a row's missing hard negative has no margin
                present = ~inputs.absent.to(squared.device)
                loss = squared[present].sum() / present.sum().clamp(min=1)
            else:
                loss = squared.mean()  # nn.MSELoss over (N, k)
        return LossOutput(loss)


def bind_teacher_widths(loss: nn.Module, student: int, teacher: int) -> None:
    """Every teacher loss in `loss` (a sum's terms, a Matryoshka's inner loss) told both widths."""
    for module in list(loss.modules()):
        if isinstance(module, TeacherObjective):
            module.bind_widths(student, teacher)
