"""Distillation losses (sentemb/losses/distill.py) against sentence-transformers' own MSELoss, EmbedDistillLoss,
MarginMSELoss and DistillKLDivLoss on fixed float64 embeddings, and against loops transcribed from RankCSE's released
code (perceptiveshawty/RankCSE at 17c5226be5962803f893b80f63e409eea20f27a3, rankcse/models.py and trainers.py):
loss and gradients within 1e-9."""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F
from sentence_transformers.sentence_transformer.losses import (
    DistillKLDivLoss,
    EmbedDistillLoss,
    MarginMSELoss,
    MSELoss,
)
from sentence_transformers.util import pairwise_cos_sim, pairwise_dot_score
from torch import nn

from sentemb.common.errors import SentembConfigError
from sentemb.losses import build
from sentemb.losses.inputs import LossInputs, TeacherTargets

TOLERANCE = 1e-9
N, D, T = 6, 8, 5  # rows, the student's width, the teacher's


class StandIn(nn.Module):
    """What sentence-transformers' losses ask of their model beside the embeddings: a width and a device."""

    device = torch.device("cpu")

    def get_embedding_dimension(self) -> int:
        return D


def embeddings(hard: int = 1, seed: int = 0, width: int = D, teacher: int = D):
    """Student views (anchors, positives, hard negatives) with gradients, and the teacher's views, float64."""
    gen = torch.Generator().manual_seed(seed)
    student = [torch.randn(N, width, generator=gen, dtype=torch.float64).requires_grad_() for _ in range(2 + hard)]
    targets = [torch.randn(N, teacher, generator=gen, dtype=torch.float64) for _ in range(2 + hard)]
    return student, targets


def inputs_of(student, targets) -> LossInputs:
    return LossInputs(
        anchors=student[0],
        positives=student[1],
        hard_negatives=tuple(student[2:]),
        targets=(TeacherTargets(targets[0], targets[1], tuple(targets[2:])),),
    )


def assert_same(ours: torch.Tensor, theirs: torch.Tensor, leaves: list[torch.Tensor]) -> float:
    """Loss and every leaf's gradient within TOLERANCE; the largest difference."""
    mine = torch.autograd.grad(ours, leaves, retain_graph=True)
    reference = torch.autograd.grad(theirs, leaves, retain_graph=True)
    worst = abs(float(ours.detach()) - float(theirs.detach()))
    for a, b in zip(mine, reference, strict=True):
        worst = max(worst, float((a - b).abs().max()))
    assert worst < TOLERANCE, worst
    return worst


@pytest.mark.parametrize("hard", [0, 2])
def test_distill_mse_is_sentence_transformers_mse_loss(hard):
    student, targets = embeddings(hard)
    ours = build("distill_mse")(inputs_of(student, targets)).loss
    theirs = MSELoss(StandIn()).compute_loss_from_embeddings(student, targets)
    assert_same(ours, theirs, student)


def test_distill_mse_with_a_projection_is_mse_loss_with_projection_dim():
    student, targets = embeddings(1, teacher=T)
    reference = MSELoss(StandIn(), projection_dim=T).double()
    loss = build("distill_mse")
    loss.bind_widths(D, T)
    loss.projection.load_state_dict(reference.projection.state_dict())
    loss = loss.double()
    ours = loss(inputs_of(student, targets)).loss
    theirs = reference.compute_loss_from_embeddings(student, targets)
    leaves = [*student, loss.projection.weight, loss.projection.bias]
    mine = torch.autograd.grad(ours, leaves)
    other = torch.autograd.grad(theirs, [*student, reference.projection.weight, reference.projection.bias])
    assert abs(float(ours.detach()) - float(theirs.detach())) < TOLERANCE
    for a, b in zip(mine, other, strict=True):
        assert float((a - b).abs().max()) < TOLERANCE


def test_distill_mse_cosine_is_embed_distill_loss_cosine():
    student, targets = embeddings(1)
    ours = build("distill_mse", distance="cosine")(inputs_of(student, targets)).loss
    theirs = EmbedDistillLoss(StandIn(), distance_metric="cosine").compute_loss_from_embeddings(student, targets)
    assert_same(ours, theirs, student)


@pytest.mark.parametrize(("similarity", "function"), [("dot", pairwise_dot_score), ("cos", pairwise_cos_sim)])
@pytest.mark.parametrize("hard", [1, 3])
def test_margin_mse_is_sentence_transformers_margin_mse_loss(similarity, function, hard):
    student, targets = embeddings(hard)
    ours = build("margin_mse", similarity=similarity)(inputs_of(student, targets)).loss
    # MarginMSELoss takes the teacher's margins as labels: computed here from the teacher's embeddings
    labels = torch.stack([function(targets[0], targets[1]) - function(targets[0], n) for n in targets[2:]], dim=1)
    theirs = MarginMSELoss(StandIn(), similarity_fct=function).compute_loss_from_embeddings(student, labels)
    assert_same(ours, theirs, student)


@pytest.mark.parametrize(("similarity", "function"), [("dot", pairwise_dot_score), ("cos", pairwise_cos_sim)])
def test_distill_kl_over_own_candidates_is_distill_kl_div_loss(similarity, function):
    student, targets = embeddings(2)
    fields = {"similarity": similarity, "candidates": "own", "tau_squared": True}
    ours = build("distill_kl", student_tau=0.5, teacher_tau=2.0, **fields)(inputs_of(student, targets)).loss
    labels = torch.stack([function(targets[0], other) for other in targets[1:]], dim=1)  # the teacher's scores
    reference = DistillKLDivLoss(StandIn(), similarity_fct=function, student_temperature=0.5, teacher_temperature=2.0)
    with warnings.catch_warnings():  # it may warn once about the teacher scores' scale: not what is compared here
        warnings.simplefilter("ignore")
        theirs = reference.compute_loss_from_embeddings(student, labels)
    assert_same(ours, theirs, student)


def rankcse_similarities(student, targets, temp: float, tau2: float) -> tuple[torch.Tensor, torch.Tensor]:
    """RankCSE's student and teacher lists: models.py line 264-268 (cos(z1, z2)/temp, then cat cos(z1, z3)/temp) and
    trainers.py line 508 (the teacher's cos(z1T, z2T)/tau2; with a hard negative, its column likewise)."""
    cos = nn.CosineSimilarity(dim=-1)
    student_sim = torch.cat([cos(student[0].unsqueeze(1), s.unsqueeze(0)) / temp for s in student[1:]], dim=1)
    teacher_sim = torch.cat([cos(targets[0].unsqueeze(1), t.unsqueeze(0)) / tau2 for t in targets[1:]], dim=1)
    return student_sim, teacher_sim


def rankcse_listnet(teacher_top1_sim_pred: torch.Tensor, student_top1_sim_pred: torch.Tensor) -> torch.Tensor:
    """rankcse/models.py lines 73-77 (ListNet.forward, gamma_ = 1)."""
    p = F.log_softmax(student_top1_sim_pred.fill_diagonal_(float("-inf")), dim=-1)
    q = F.softmax(teacher_top1_sim_pred.fill_diagonal_(float("-inf")), dim=-1)
    return -(q * p).nansum() / q.nansum()


def rankcse_listmle(teacher_top1_sim_pred: torch.Tensor, student_top1_sim_pred: torch.Tensor) -> torch.Tensor:
    """rankcse/models.py lines 89-109 (ListMLE.forward, gamma_ = 1, eps 1e-7), without the shuffle of lines 95-97
    (random tie resolution; these lists have no ties, so the order is the same)."""
    y_pred, y_true = student_top1_sim_pred, teacher_top1_sim_pred
    y_true_sorted, indices = y_true.sort(descending=True, dim=-1)
    mask = y_true_sorted == -1
    preds_sorted_by_true = torch.gather(y_pred, dim=1, index=indices)
    preds_sorted_by_true[mask] = float("-inf")
    max_pred_values, _ = preds_sorted_by_true.max(dim=1, keepdim=True)
    preds_sorted_by_true_minus_max = preds_sorted_by_true - max_pred_values
    cumsums = torch.cumsum(preds_sorted_by_true_minus_max.exp().flip(dims=[1]), dim=1).flip(dims=[1])
    observation_loss = torch.log(cumsums + 1e-7) - preds_sorted_by_true_minus_max
    observation_loss[mask] = 0.0
    return torch.mean(torch.sum(observation_loss, dim=1))


@pytest.mark.parametrize("hard", [0, 1])
def test_distill_kl_with_rankcse_settings_is_listnet(hard):
    student, targets = embeddings(hard, seed=1)
    loss = build("distill_kl", student_tau=0.05, teacher_tau=0.05, drop_positive=True)
    ours = loss(inputs_of(student, targets)).loss
    student_sim, teacher_sim = rankcse_similarities(student, targets, 0.05, 0.05)
    theirs = rankcse_listnet(teacher_sim.clone(), student_sim)
    # ListNet is the cross-entropy −Σ q log p; the KL is it minus the teacher's entropy, a constant of the student
    q = F.softmax(teacher_sim.clone().fill_diagonal_(float("-inf")), dim=-1)
    entropy = -torch.where(q > 0, q * q.log(), torch.zeros_like(q)).sum() / N
    assert_same(ours, theirs - entropy, student)


@pytest.mark.parametrize("hard", [0, 1])
def test_listmle_is_rankcse_listmle(hard):
    student, targets = embeddings(hard, seed=2)
    ours = build("listmle", student_tau=0.05, teacher_tau=0.05)(inputs_of(student, targets)).loss
    student_sim, teacher_sim = rankcse_similarities(student, targets, 0.05, 0.05)
    assert_same(ours, rankcse_listmle(teacher_sim, student_sim), student)


def test_an_absent_hard_negative_is_left_out_on_both_sides():
    student, targets = embeddings(1, seed=3)
    absent = torch.zeros(N, 1, dtype=torch.bool)
    absent[2] = True
    whole = inputs_of(student, targets).with_roles(absent=absent)
    kept = [i for i in range(N) if i != 2]
    margin = build("margin_mse")(whole).loss
    rows = [s[kept] for s in student], [t[kept] for t in targets]
    assert torch.allclose(margin, build("margin_mse")(inputs_of(*rows)).loss, atol=1e-12)
    # distill_kl over own candidates: row 2 has its positive alone, so its term is 0; the others' are unchanged
    kl = build("distill_kl", candidates="own")
    per_row = [kl(inputs_of([s[i : i + 1] for s in student], [t[i : i + 1] for t in targets])).loss for i in kept]
    assert torch.allclose(kl(whole).loss, torch.stack(per_row).sum() / N, atol=1e-12)


def test_the_teacher_losses_refuse_what_they_cannot_read():
    student, targets = embeddings(0)
    with pytest.raises(ValueError, match="reads targets"):
        build("distill_mse")(student[0], student[1])
    with pytest.raises(SentembConfigError, match="takes no extra negatives.*no target"):
        build("distill_kl")(inputs_of(student, targets).with_roles(extra=torch.randn(3, D, dtype=torch.float64)))
    with pytest.raises(ValueError, match="reads hard_negatives"):
        build("margin_mse")(inputs_of(student, targets))
    with pytest.raises(ValueError, match="candidates=own over pairs alone"):
        build("listmle", candidates="own")(inputs_of(student, targets))
    for name, field, value in [
        ("distill_kl", "student_tau", 0),
        ("listmle", "similarity", "l2"),
        ("distill_mse", "distance", "l1"),
        ("distill_kl", "candidates", "all"),
    ]:
        with pytest.raises(SentembConfigError, match=rf"loss\.{field}.*Fix"):
            build(name, **{field: value})


def test_measured_differences_are_reported(capsys):
    """The largest difference of each comparison above (loss or any gradient), printed for the record (-s)."""
    student, targets = embeddings(2)
    labels = torch.stack([pairwise_dot_score(targets[0], t) for t in targets[1:]], dim=1)
    margins = labels[:, :1] - labels[:, 1:]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cases = {
            "MSELoss": (build("distill_mse"), MSELoss(StandIn()).compute_loss_from_embeddings(student, targets)),
            "MarginMSELoss": (
                build("margin_mse"),
                MarginMSELoss(StandIn()).compute_loss_from_embeddings(student, margins),
            ),
            "DistillKLDivLoss": (
                build("distill_kl", similarity="dot", candidates="own", tau_squared=True, student_tau=1, teacher_tau=1),
                DistillKLDivLoss(StandIn()).compute_loss_from_embeddings(student, labels),
            ),
        }
    for name, (loss, theirs) in cases.items():
        print(f"{name}: max |difference| {assert_same(loss(inputs_of(student, targets)).loss, theirs, student):.2e}")
    student_sim, teacher_sim = rankcse_similarities(student, targets, 0.05, 0.05)
    ours = build("listmle")(inputs_of(student, targets)).loss
    print(
        f"RankCSE ListMLE: max |difference| {assert_same(ours, rankcse_listmle(teacher_sim, student_sim), student):.2e}"
    )


@pytest.mark.parametrize("name", ["distill_kl", "listmle", "margin_mse"])
def test_sizes_cut_the_students_embeddings_and_keep_the_teachers_whole(name):
    from sentemb.losses.matryoshka import Matryoshka

    student, targets = embeddings(hard=1, seed=3)
    dims, weights = [D, D // 2, D // 4], [1.0, 0.5, 0.25]
    ours = Matryoshka(build(name), dims, weights)(inputs_of(student, targets)).loss
    # by hand: the inner loss on each prefix of the student's views, against the teacher's full-width embeddings
    sizes = zip(dims, weights, strict=True)
    by_hand = sum(w * build(name)(inputs_of([s[:, :d] for s in student], targets)).loss for d, w in sizes)
    assert_same(ours, by_hand, student)


# ---- several teachers: their similarity lists averaged with weights (RankCSE's two teachers, --alpha_)

ALPHA = 0.33  # run_rankcse.sh: --alpha_ 0.33 (the first teacher's share)


def two_teachers(seed: int, hard: int = 0):
    """Student views and two teachers of different widths (T and T + 2), float64."""
    student, first = embeddings(hard, seed=seed, teacher=T)
    _, second = embeddings(hard, seed=seed + 100, teacher=T + 2)
    inputs = inputs_of(student, first).with_roles(
        targets=(
            TeacherTargets(first[0], first[1], tuple(first[2:]), weight=ALPHA),
            TeacherTargets(second[0], second[1], tuple(second[2:]), weight=1.0 - ALPHA),
        )
    )
    return student, first, second, inputs


def rankcse_mixed_teachers(first, second, alpha: float, tau2: float) -> torch.Tensor:
    """rankcse/trainers.py lines 524-528: each teacher's cos(z1T, z2T)/tau2, then alpha·first + (1 − alpha)·second."""
    cos = nn.CosineSimilarity(dim=-1)
    first_teacher_top1_sim = cos(first[0].unsqueeze(1), first[1].unsqueeze(0)) / tau2
    second_teacher_top1_sim = cos(second[0].unsqueeze(1), second[1].unsqueeze(0)) / tau2
    return (alpha * first_teacher_top1_sim) + ((1.0 - alpha) * second_teacher_top1_sim)


@pytest.mark.parametrize("name", ["distill_kl", "listmle"])
def test_two_teachers_are_rankcses_weighted_average_of_their_lists(name):
    """RankCSE's released two-teacher step (pairs: its teachers read z1, z2 alone) against both list losses."""
    student, first, second, inputs = two_teachers(seed=5)
    teacher_sim = rankcse_mixed_teachers(first, second, ALPHA, 0.05)
    student_sim, _ = rankcse_similarities(student, first, 0.05, 0.05)
    if name == "listmle":
        ours = build("listmle", student_tau=0.05, teacher_tau=0.05)(inputs).loss
        assert_same(ours, rankcse_listmle(teacher_sim, student_sim), student)
        return
    ours = build("distill_kl", student_tau=0.05, teacher_tau=0.05, drop_positive=True)(inputs).loss
    q = F.softmax(teacher_sim.clone().fill_diagonal_(float("-inf")), dim=-1)
    entropy = -torch.where(q > 0, q * q.log(), torch.zeros_like(q)).sum() / N  # as in the one-teacher test above
    assert_same(ours, rankcse_listnet(teacher_sim.clone(), student_sim) - entropy, student)
    # and the mixture is not either teacher alone: the second teacher moves the loss
    alone = build("distill_kl", student_tau=0.05, teacher_tau=0.05, drop_positive=True)(inputs_of(student, first)).loss
    assert abs(float((ours - alone).detach())) > 1e-3


def test_two_teachers_margins_are_margin_mse_on_their_averaged_labels():
    """margin_mse with two teachers: sentence-transformers' MarginMSELoss on the weighted average of the teachers'
    margins (each its own dot products)."""
    student, first, second, inputs = two_teachers(seed=6, hard=2)

    def margins(views):
        labels = torch.stack([pairwise_dot_score(views[0], v) for v in views[1:]], dim=1)
        return labels[:, :1] - labels[:, 1:]

    mixed = ALPHA * margins(first) + (1.0 - ALPHA) * margins(second)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        theirs = MarginMSELoss(StandIn()).compute_loss_from_embeddings(student, mixed)
    assert_same(build("margin_mse")(inputs).loss, theirs, student)


def test_one_teacher_of_several_is_refused_where_a_loss_reads_one():
    student, _, _, inputs = two_teachers(seed=7)
    with pytest.raises(ValueError, match="DistillMSE matches one teacher's embeddings, got 2"):
        build("distill_mse")(inputs)
    skewed = inputs.with_roles(targets=(inputs.targets[0],) * 2)  # weights 0.33 + 0.33
    with pytest.raises(ValueError, match="weights sum to 0.66"):
        build("listmle")(skewed)
