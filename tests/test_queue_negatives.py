"""Extra negatives (ESimCSE's momentum queue): each loss that takes them against a naive loop over batch + queue,
the empty queue against the loss without one, gradients and numerics, and which losses refuse them."""

from __future__ import annotations

import math
import re

import pytest
import torch

from sentemb.common.errors import SentembConfigError
from sentemb.common.paths import PROJECT_ROOT
from sentemb.losses import InfoNCE, Objective, available, build
from sentemb.losses.inputs import HARD_NEGATIVES, SCORES, TARGETS, TeacherTargets
from sentemb.losses.registry import declared_loss, loss_config, negatives_losses, negatives_refusal

N, K, D = 6, 4, 5
# float64 on both sides: only the order of summation differs (~1e-15 relative), far below 1e-12
TOLERANCE = {"rel": 1e-12, "abs": 1e-12}
# from the registry, by what each loss declares (a wrapper of losses, loss=sum, is its terms': below)
OWN_LOSSES = [name for name in available() if not declared_loss({"name": name}).wraps_losses]
TAKES = [name for name in OWN_LOSSES if negatives_refusal(loss_config(name)) is None]
SCORED = [name for name in OWN_LOSSES if SCORES in declared_loss({"name": name}).reads]
REFUSES = [name for name in OWN_LOSSES if name not in TAKES and name not in SCORED]
# the losses whose `convention=reference` form is the paper's computation (they do not override `reference`)
SAME_IN_REFERENCE = [
    name
    for name in TAKES
    if "reference" in declared_loss({"name": name}).conventions
    and declared_loss({"name": name}).reference is Objective.reference
]


def teacher_roles(name: str, z1: torch.Tensor, z2: torch.Tensor) -> dict:
    """What a teacher's loss reads beside the pairs: the teacher's embeddings (here the views themselves), and each
    anchor's hard negatives where it reads them (margin_mse)."""
    reads = declared_loss({"name": name}).reads
    if TARGETS not in reads:
        return {}
    hard = (z2.flip(0),) if HARD_NEGATIVES in reads else ()
    return {"targets": (TeacherTargets(z1, z2, hard),), **({"hard_negatives": hard} if hard else {})}


def batch(seed: int = 0, n: int = N, k: int = K) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Raw float64 views (z2 a noisy copy of z1) and a queue, none normalised."""
    gen = torch.Generator().manual_seed(seed)
    z1 = torch.randn(n, D, generator=gen, dtype=torch.float64)
    z2 = z1 + 0.6 * torch.randn(n, D, generator=gen, dtype=torch.float64)
    return z1, z2, 2.0 * torch.randn(k, D, generator=gen, dtype=torch.float64)


def unit_rows(z: torch.Tensor) -> list[list[float]]:
    rows = z.tolist()
    return [[x / math.sqrt(sum(y * y for y in row)) for x in row] for row in rows]


def cosines(anchors: torch.Tensor, candidates: torch.Tensor) -> list[list[float]]:
    """s_ij = h_i·c_j, one pair at a time, in Python floats."""
    a, c = unit_rows(anchors), unit_rows(candidates)
    return [[sum(x * y for x, y in zip(row, col, strict=True)) for col in c] for row in a]


def per_anchor_mean(z1, z2, queue, anchor_loss) -> float:
    """mean_i anchor_loss(i, s_i·) with candidates h'_0..h'_{N−1}, q_0..q_{K−1} (column i the positive)."""
    s = cosines(z1, torch.cat((z2, queue)))
    return sum(anchor_loss(i, row) for i, row in enumerate(s)) / len(s)


def naive_infonce(z1, z2, queue, tau) -> float:
    def anchor(i, row):
        logits = [x / tau for x in row]
        return -(logits[i] - math.log(sum(math.exp(x) for x in logits)))

    return per_anchor_mean(z1, z2, queue, anchor)


def naive_focal(z1, z2, queue, tau, m) -> float:
    def anchor(i, row):
        logits = [(x * x if j == i else x * (x + m)) / tau for j, x in enumerate(row)]
        return -(logits[i] - math.log(sum(math.exp(x) for x in logits)))

    return per_anchor_mean(z1, z2, queue, anchor)


def clamped_acos(x: float) -> float:
    return math.acos(min(max(x, -1.0 + 1e-6), 1.0 - 1e-6))


def naive_arccon(z1, z2, queue, tau, u) -> float:
    def anchor(i, row):
        logits = [(math.cos(clamped_acos(x) + u) if j == i else x) / tau for j, x in enumerate(row)]
        return -(logits[i] - math.log(sum(math.exp(x) for x in logits)))

    return per_anchor_mean(z1, z2, queue, anchor)


def naive_triplet(z1, z2, queue, distance, margin) -> float:
    def anchor(i, row):
        nearest = min(distance(x) for j, x in enumerate(row) if j != i)
        return max(0.0, distance(row[i]) - nearest + margin)

    return per_anchor_mean(z1, z2, queue, anchor)


def naive_paradigm(z1, z2, queue, gd, w, r, m=0.30, tau=0.05, u=math.pi / 18, power=4.0) -> float:
    """L_i = GD_i Σ_{j≠i} W_ij (s_ij − R_ij s_ii) with every component read off the row's M = N + K columns."""

    def anchor(i, row):
        negatives = [j for j in range(len(row)) if j != i]
        positive = row[i]
        if gd == "margin":
            gate = 1.0 if positive - max(row[j] for j in negatives) < m else 0.0
        elif gd == "infonce":
            gate = 1.0 / (1.0 + math.exp(positive / tau) / sum(math.exp(row[j] / tau) for j in negatives))
        else:
            gate = 1.0
        if w == "softmax":
            raw = {j: math.exp(row[j] / tau) for j in negatives}
        elif w == "hardest":
            hardest = max(negatives, key=lambda j: row[j])
            raw = {j: float(j == hardest) for j in negatives}
        elif w == "power":
            raw = {j: max(row[j], 1e-4) ** power for j in negatives}
        else:
            raw = {j: 1.0 for j in negatives}
        total = sum(raw.values())
        value = 0.0
        for j in negatives:
            if r == "arccon":
                theta = clamped_acos(positive)
                ratio = math.sin(theta + u) / math.sin(theta)
            elif r == "met":
                ratio = math.sqrt(max(1.0 - row[j], 0.0) / max(1.0 - positive, 1e-6))
            else:
                ratio = r
            value += raw[j] / total * (row[j] - ratio * positive)
        return gate * value

    return per_anchor_mean(z1, z2, queue, anchor)


@pytest.mark.parametrize("tau", [0.05, 0.5])
@pytest.mark.parametrize("k", [1, K, 3 * N])
def test_infonce_with_a_queue_matches_a_loop_over_batch_and_queue(tau, k):
    z1, z2, queue = batch(1, k=k)
    assert InfoNCE(tau=tau)(z1, z2, queue).loss.item() == pytest.approx(naive_infonce(z1, z2, queue, tau), **TOLERANCE)


def test_symmetric_infonce_gives_the_other_direction_the_first_view_and_the_same_queue():
    z1, z2, queue = batch(2)
    expected = 0.5 * (naive_infonce(z1, z2, queue, 0.05) + naive_infonce(z2, z1, queue, 0.05))
    got = InfoNCE(symmetric=True)(z1, z2, queue).loss.item()
    assert got == pytest.approx(expected, **TOLERANCE)


LOOPS = [
    ("focal", {"tau": 0.05, "m": 0.3}, lambda z1, z2, q: naive_focal(z1, z2, q, 0.05, 0.3)),
    ("focal", {"tau": 0.2, "m": -0.1}, lambda z1, z2, q: naive_focal(z1, z2, q, 0.2, -0.1)),
    ("arccon", {"tau": 0.05, "u": 0.2}, lambda z1, z2, q: naive_arccon(z1, z2, q, 0.05, 0.2)),
    ("mpt", {"m": 0.23}, lambda z1, z2, q: naive_triplet(z1, z2, q, lambda s: -s, 0.23)),
    ("met", {"m": 0.45}, lambda z1, z2, q: naive_triplet(z1, z2, q, lambda s: math.sqrt(max(2 - 2 * s, 1e-6)), 0.45)),
    ("mat", {"m": 0.15}, lambda z1, z2, q: naive_triplet(z1, z2, q, clamped_acos, 0.15 * math.pi)),
] + [
    ("paradigm", {"gd": gd, "w": w, "r": r}, lambda z1, z2, q, gd=gd, w=w, r=r: naive_paradigm(z1, z2, q, gd, w, r))
    for gd, w, r in [
        ("margin", "softmax", 1.0),
        ("margin", "hardest", 1.5),
        ("infonce", "uniform", "arccon"),
        ("none", "power", "met"),
        ("none", "softmax", 1.75),
        ("infonce", "hardest", "met"),
    ]
]


@pytest.mark.parametrize(("name", "fields", "loop"), LOOPS, ids=[f"{n}-{f}" for n, f, _ in LOOPS])
def test_each_loss_with_a_queue_matches_its_formula_over_batch_and_queue(name, fields, loop):
    z1, z2, queue = batch(3)
    expected = loop(z1, z2, queue)
    assert expected != 0.0  # a margin that no anchor passes would test nothing
    assert build(name, **fields)(z1, z2, queue).loss.item() == pytest.approx(expected, **TOLERANCE)


def test_the_queue_changes_the_loss_a_batch_alone_gives():
    z1, z2, queue = batch(4)
    queue = torch.cat((queue, z1[:1]))  # a row equal to anchor 0: the hardest negative of the triplet losses
    for name in TAKES:
        loss = build(name)
        assert loss(z1, z2, queue).loss.item() != loss(z1, z2).loss.item(), name


def taking_configs() -> list[tuple[str, dict]]:
    configs = [(name, {}) for name in TAKES] + [(name, {"symmetric": True}) for name in TAKES]
    configs += [(name, {"convention": "reference"}) for name in SAME_IN_REFERENCE]
    configs += [("paradigm", {"gd": gd, "w": w, "r": r}) for gd, w, r in [("infonce", "power", "arccon")]]
    configs += [("sum", {"terms": {"infonce": {"weight": 1.0}, "mpt": {"weight": 0.5, "m": 0.1}}})]
    return configs


@pytest.mark.parametrize(("name", "fields"), taking_configs())
def test_an_empty_queue_or_none_gives_exactly_the_loss_without_one(name, fields):
    z1, z2, _ = batch(5)
    results = []
    for negatives in ("absent", None, torch.empty(0, D, dtype=torch.float64)):
        a, b = z1.clone().requires_grad_(), z2.clone().requires_grad_()
        loss = build(name, **fields)
        out = loss(a, b) if isinstance(negatives, str) else loss(a, b, negatives)
        out.loss.backward()
        results.append((out.loss.detach(), a.grad, b.grad, dict(out.stats)))
    for other in results[1:]:
        assert all(torch.equal(x, y) for x, y in zip(results[0][:3], other[:3], strict=True))
        assert other[3] == results[0][3]


@pytest.mark.parametrize(("name", "fields"), taking_configs())
def test_gradients_reach_the_views_and_not_a_queue_without_grad(name, fields):
    z1, z2, queue = batch(6)
    a, b = z1.clone().requires_grad_(), z2.clone().requires_grad_()
    out = build(name, **fields)(a, b, queue)
    out.loss.backward()
    assert queue.grad is None and not queue.requires_grad
    assert torch.isfinite(a.grad).all() and torch.isfinite(b.grad).all()
    assert a.grad.abs().sum() > 0 and b.grad.abs().sum() > 0


@pytest.mark.parametrize(("name", "fields"), taking_configs())
def test_duplicates_and_a_queue_row_equal_to_an_anchor_stay_finite(name, fields):
    # four orthogonal sentences, each twice; identical views (cos = 1); queue rows equal to anchors 0 and 1, scaled
    z = (3.0 * torch.eye(D, dtype=torch.float64)[:3]).repeat(2, 1)
    queue = torch.cat((7.0 * z[:2], torch.randn(2, D, dtype=torch.float64)))
    a, b = z.clone().requires_grad_(), z.clone().requires_grad_()
    out = build(name, **fields)(a, b, queue)
    out.loss.backward()
    assert torch.isfinite(out.loss) and torch.isfinite(a.grad).all() and torch.isfinite(b.grad).all()
    assert all(math.isfinite(value) for value in out.stats.values())


def test_a_batch_of_one_learns_from_the_queue_alone():
    z1, z2, queue = batch(7, n=1)
    a = z1.clone().requires_grad_()
    out = InfoNCE()(a, z2, queue)
    out.loss.backward()
    assert out.loss.item() == pytest.approx(naive_infonce(z1, z2, queue, 0.05), **TOLERANCE)
    assert a.grad.abs().sum() > 0
    assert "uniformity" not in out.stats and math.isfinite(out.stats["cos_neg"])  # one sentence: no pair
    assert InfoNCE()(z1, z2).loss.item() == 0.0  # without a queue a batch of one still has no negatives
    assert InfoNCE()(z1, z2, queue[:0]).loss.item() == 0.0


@pytest.mark.parametrize("name", ["infonce", "arccon", "mpt", "mat"])  # MET's reference distance adds an ε
def test_reference_convention_takes_the_queue_as_the_paper_does(name):
    z1, z2, queue = batch(8)
    paper, reference = build(name)(z1, z2, queue), build(name, convention="reference")(z1, z2, queue)
    assert torch.equal(paper.loss, reference.loss), name


def test_a_float32_queue_under_bf16_autocast_gives_float32_similarities():
    z1, z2, queue = (t.float() for t in batch(9))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = InfoNCE()(z1.bfloat16(), z2.bfloat16(), queue.bfloat16())
    assert out.loss.dtype == torch.float32


def test_a_queue_of_the_wrong_width_is_refused():
    z1, z2, queue = batch(10)
    with pytest.raises(ValueError, match="must be \\(K, D\\) with D = 5"):
        InfoNCE()(z1, z2, queue[:, :3])


@pytest.mark.parametrize("name", OWN_LOSSES)
def test_every_loss_does_what_it_declares_about_extra_negatives(name):
    """The contract, from the registry: a loss that declares extra negatives takes a queue (its loss changes with a
    queue holding the hardest negative); one that refuses them says why, in one sentence, and refuses a queue."""
    reason = negatives_refusal(loss_config(name))
    assert reason is None or (isinstance(reason, str) and reason.strip().endswith(".")), name
    z1, z2, queue = batch(15)
    queue = torch.cat((queue, z1[:1]))
    scores = {"scores": torch.linspace(0.0, 1.0, N, dtype=torch.float64)} if name in SCORED else {}
    loss = build(name)
    if reason is None:
        assert loss(z1, z2, queue).loss.item() != loss(z1, z2).loss.item(), name
    else:
        with pytest.raises(SentembConfigError, match="takes no extra negatives"):
            loss(z1, z2, queue, **scores)


@pytest.mark.parametrize("name", REFUSES)
def test_losses_without_a_negatives_denominator_refuse_a_queue_before_and_after_building(name):
    reason = negatives_refusal(loss_config(name))
    assert reason.startswith(f"loss={name} takes no extra negatives: ")
    z1, z2, queue = batch(11)
    loss = build(name)
    roles = teacher_roles(name, z1, z2)
    for negatives in (queue, queue[:0]):  # even an empty queue: the configuration, not the step, is wrong
        with pytest.raises(SentembConfigError, match="takes no extra negatives") as err:
            loss(z1, z2, negatives, **roles)
        assert reason in str(err.value)
    loss(z1, z2, **roles)  # without a queue it is unchanged


@pytest.mark.parametrize("name", SCORED)
def test_scored_pair_losses_refuse_a_queue_before_and_after_building(name):
    reason = negatives_refusal(loss_config(name))
    assert reason.startswith(f"loss={name} takes no extra negatives: ") and "labelled pair" in reason
    z1, z2, queue = batch(11)
    scores = torch.linspace(0.0, 1.0, N, dtype=torch.float64)
    for negatives in (queue, queue[:0]):  # refused before anything else is checked (AnglE's even width among them)
        with pytest.raises(SentembConfigError, match="takes no extra negatives") as err:
            build(name)(z1, z2, negatives, scores=scores)
        assert reason in str(err.value)


@pytest.mark.parametrize("name", ["align_mhe", "align_mhs", "mmhe", "mmhs", "mbarlow", "mvicreg"])
def test_named_refusals_say_why(name):
    assert "same-view pairs" in negatives_refusal(loss_config(name)), name
    assert "cross-correlation" in negatives_refusal(loss_config("barlow"))
    assert "variance and covariance" in negatives_refusal(loss_config("vicreg"))


def test_paradigm_refuses_a_queue_only_under_the_reference_convention():
    assert negatives_refusal(loss_config("paradigm")) is None
    reason = negatives_refusal(loss_config("paradigm", convention="reference"))
    assert "sg loss" in reason
    z1, z2, queue = batch(12)
    with pytest.raises(SentembConfigError, match="sg loss"):
        build("paradigm", convention="reference")(z1, z2, queue)


def test_the_class_answers_without_building_anything():
    from sentemb.losses import BarlowTwins, Paradigm

    assert InfoNCE.negatives_refusal({}) is None
    assert Paradigm.negatives_refusal({"convention": "reference"}) is not None
    assert BarlowTwins.negatives_refusal({}).startswith("loss=barlow takes no extra negatives")

    class Undeclared(Objective):  # a new loss takes a queue only once it says it can
        pass

    assert Undeclared.negatives_refusal({}) is not None


def test_a_weighted_sum_takes_a_queue_when_every_term_does_and_passes_it_to_each():
    terms = {"infonce": {"weight": 1.0}, "hard": {"weight": 0.5, "loss": "mpt", "m": 0.1}}
    assert negatives_refusal(loss_config("sum", terms=terms)) is None
    z1, z2, queue = batch(13)
    out = build("sum", terms=terms)(z1, z2, queue)
    expected = InfoNCE()(z1, z2, queue).loss + 0.5 * build("mpt", m=0.1)(z1, z2, queue).loss
    assert torch.equal(out.loss, expected)


def test_a_weighted_sum_with_a_refusing_term_names_it():
    terms = {"infonce": {"weight": 1.0}, "decorrelate": {"weight": 0.1, "loss": "barlow"}}
    reason = negatives_refusal(loss_config("sum", terms=terms))
    assert "'decorrelate'" in reason and "loss=barlow takes no extra negatives" in reason
    z1, z2, queue = batch(14)
    with pytest.raises(SentembConfigError, match="'decorrelate'"):
        build("sum", terms=terms)(z1, z2, queue)
    built = {"mine": {"weight": 1.0, "objective": build("mmhe")}}
    assert "'mine'" in negatives_refusal({"name": "sum", "terms": built})


def test_the_docs_list_the_losses_that_take_negatives_as_the_registry_does():
    """docs/labelled.md names the losses that take hard negatives as extra columns: the registry's, all of them."""
    page = (PROJECT_ROOT / "docs" / "labelled.md").read_text(encoding="utf-8")
    listed = re.search(r"The losses with a negatives' denominator take\s+them: ((?:`\w+`,?\s*)+)", page).group(1)
    assert re.findall(r"`(\w+)`", listed) == negatives_losses()
