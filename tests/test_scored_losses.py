"""The losses on scored pairs (sentemb/losses/scored.py): each against a loop written from its equation, their edge
cases (no ordered pair of pairs, duplicated sentences), their refusals, and their dtype under autocast."""

from __future__ import annotations

import math

import pytest
import torch

from sentemb.common.errors import SentembConfigError
from sentemb.losses import build
from sentemb.losses.base import RANKED_SCORES, Objective
from sentemb.losses.inputs import SCORES
from sentemb.losses.registry import available, declared_loss, loss_config, negatives_refusal
from sentemb.losses.scored import AnglE, CoSENT, CosineMSE, ScoredPairObjective

# the registry's losses that read scores, and those that rank them (use the scores' order only: nothing to learn
# without a strictly ordered pair of pairs)
SCORED = [name for name in available() if SCORES in declared_loss({"name": name}).reads]
RANKING = [name for name in SCORED if declared_loss({"name": name}).learns_from == RANKED_SCORES]


def pairs(n: int = 6, d: int = 8, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Fixed float64 pairs with ties among the scores (0.2 twice, 0.8 twice) and the ends of [0, 1]."""
    torch.manual_seed(seed)
    z1, z2 = torch.randn(n, d, dtype=torch.float64), torch.randn(n, d, dtype=torch.float64)
    scores = torch.tensor([0.2, 0.8, 0.2, 1.0, 0.0, 0.8], dtype=torch.float64)[:n]
    return z1, z2, scores


def cosine(x: list[float], y: list[float]) -> float:
    dot = sum(a * b for a, b in zip(x, y, strict=True))
    return dot / (math.sqrt(sum(a * a for a in x)) * math.sqrt(sum(b * b for b in y)))


def angle(x: list[float], y: list[float]) -> float:
    """AnglE's normalised angle, step by step as the paper's code describes it: (u + iv)/(p + iq) per element over
    Σ|y_k|², divided by ‖x‖/‖y‖, its real and imaginary parts summed, the absolute value."""
    half = len(x) // 2
    u, v, p, q = x[:half], x[half:], y[:half], y[half:]
    norm_y2 = sum(a * a for a in y)
    norm_x, norm_y = math.sqrt(sum(a * a for a in x)), math.sqrt(norm_y2)
    total = 0.0
    for k in range(half):
        re = (u[k] * p[k] + v[k] * q[k]) / norm_y2
        im = (v[k] * p[k] - u[k] * q[k]) / norm_y2
        total += (re + im) / (norm_x / norm_y)
    return abs(total)


def naive_ranking(similarities: list[float], scores: list[float], scale: float) -> float:
    """log(1 + Σ_{s_i > s_j} e^{λ(sim_j − sim_i)}): a tie (s_i = s_j) has no term."""
    total = 1.0
    for i, (sim_i, s_i) in enumerate(zip(similarities, scores, strict=True)):
        for j, (sim_j, s_j) in enumerate(zip(similarities, scores, strict=True)):
            if i != j and s_i > s_j:
                total += math.exp(scale * (sim_j - sim_i))
    return math.log(total)


def naive(name: str, z1: torch.Tensor, z2: torch.Tensor, scores: torch.Tensor, **fields: float) -> float:
    x, y, s = z1.tolist(), z2.tolist(), scores.tolist()
    cosines = [cosine(a, b) for a, b in zip(x, y, strict=True)]
    if name == "cosent":
        return naive_ranking(cosines, s, fields.get("scale", 20.0))
    if name == "angle":
        scale = fields.get("scale", 20.0)
        angles = [angle(a, b) for a, b in zip(x, y, strict=True)]
        value = fields.get("angle_weight", 1.0) * naive_ranking(angles, s, scale)
        return value + fields.get("cosine_weight", 0.0) * naive_ranking(cosines, s, scale)
    if name == "cosine_mse":
        return sum((c - t) ** 2 for c, t in zip(cosines, s, strict=True)) / len(s)
    raise KeyError(name)


@pytest.mark.parametrize(
    "name, fields",
    [
        ("cosent", {}),
        ("cosent", {"scale": 5.0}),
        ("angle", {}),
        ("angle", {"scale": 5.0, "cosine_weight": 0.5, "angle_weight": 2.0}),
        ("cosine_mse", {}),
    ],
)
def test_each_loss_equals_a_naive_loop_over_its_equation(name, fields):
    z1, z2, scores = pairs()
    value = build(name, **fields)(z1, z2, scores=scores).loss
    assert value.dtype == torch.float64
    # float64 both sides, other summation orders (the loop divides step by step, the loss on unit vectors): ~1e-15
    # relative; 1e-10 is far below any formula error (a wrong sign or a missing tie rule moves it by > 1e-3)
    assert value.item() == pytest.approx(naive(name, z1, z2, scores, **fields), rel=1e-10)


def test_ties_contribute_no_term():
    z1, z2, scores = pairs()
    loss = CoSENT()
    # the two pairs scored 0.2 swapped in cosine order: a tie has no term, so the value does not move
    swapped = z2.clone()
    swapped[[0, 2]] = swapped[[2, 0]]
    z1_swapped = z1.clone()
    z1_swapped[[0, 2]] = z1_swapped[[2, 0]]
    torch.testing.assert_close(loss(z1, z2, scores=scores).loss, loss(z1_swapped, swapped, scores=scores).loss)


@pytest.mark.parametrize("name", RANKING)
def test_the_ranking_losses_use_only_the_order_of_the_scores(name):
    z1, z2, scores = pairs()
    loss = build(name)
    # a monotone map of the scores keeps every order: the same value (exact: the same mask, the same terms)
    assert torch.equal(loss(z1, z2, scores=scores).loss, loss(z1, z2, scores=scores.pow(3)).loss)


@pytest.mark.parametrize("name", RANKING)
@pytest.mark.parametrize("case", ["one pair", "all scores equal", "no pair"])
def test_no_ordered_pair_of_pairs_gives_zero_loss_and_zero_gradients(name, case):
    z1, z2, scores = pairs()
    if case == "one pair":
        z1, z2, scores = z1[:1], z2[:1], scores[:1]
    elif case == "all scores equal":
        scores = torch.full_like(scores, 0.6)
    else:
        z1, z2, scores = z1[:0], z2[:0], scores[:0]
    z1, z2 = z1.clone().requires_grad_(), z2.clone().requires_grad_()
    out = build(name)(z1, z2, scores=scores)
    out.loss.backward()
    # exact: log(1 + 0), every term masked out; the gradient exists and is a structural zero
    assert out.loss.item() == 0.0
    assert z1.grad is not None and torch.count_nonzero(z1.grad) == 0 and torch.count_nonzero(z2.grad) == 0
    assert all(math.isfinite(v) for v in out.stats.values()), out.stats


def test_cosine_mse_learns_from_a_single_pair_and_gives_zero_for_none():
    z1, z2, scores = pairs()
    one = CosineMSE()(z1[:1], z2[:1], scores=scores[:1]).loss
    # a single labelled pair is a regression target of its own (unlike a ranking, which needs two)
    assert one.item() == pytest.approx(naive("cosine_mse", z1[:1], z2[:1], scores[:1]), rel=1e-10)
    empty1, empty2 = z1[:0].clone().requires_grad_(), z2[:0].clone().requires_grad_()
    out = CosineMSE()(empty1, empty2, scores=scores[:0])
    out.loss.backward()
    assert out.loss.item() == 0.0 and empty1.grad is not None


@pytest.mark.parametrize("name", SCORED)
def test_gradients_are_finite_for_duplicated_and_identical_sentences(name):
    base = 3.0 * torch.eye(8)[:3]
    cases = {
        "identical sentences (cos = 1)": (base.repeat(2, 1), base.repeat(2, 1)),
        "opposite sentences (cos = -1)": (base.repeat(2, 1), -base.repeat(2, 1)),
        "every sentence the same": (torch.ones(6, 8), torch.ones(6, 8)),
    }
    scores = torch.tensor([0.1, 0.5, 0.9, 0.3, 0.5, 0.7])
    for case, (z1, z2) in cases.items():
        z1, z2 = z1.clone().requires_grad_(), z2.clone().requires_grad_()
        out = build(name)(z1, z2, scores=scores)
        out.loss.backward()
        assert torch.isfinite(out.loss), case
        assert torch.isfinite(z1.grad).all() and torch.isfinite(z2.grad).all(), case
        assert all(math.isfinite(v) for v in out.stats.values()), (case, out.stats)


@pytest.mark.parametrize("name", SCORED)
def test_similarities_in_float32_under_bf16_autocast(name):
    gen = torch.Generator().manual_seed(4)
    z1 = torch.randn(8, 16, generator=gen).bfloat16().requires_grad_()
    z2 = torch.randn(8, 16, generator=gen).bfloat16()
    scores = torch.rand(8, generator=gen).bfloat16()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = build(name)(z1, z2, scores=scores)
    out.loss.backward()
    assert out.loss.dtype == torch.float32 and torch.isfinite(out.loss) and torch.isfinite(z1.grad.float()).all()


def test_angle_refuses_an_odd_width():
    z1, z2, scores = pairs(d=7)
    with pytest.raises(ValueError, match="D must be even, got D = 7"):
        AnglE()(z1, z2, scores=scores)


@pytest.mark.parametrize("name", SCORED)
def test_each_refuses_extra_negatives_and_exclusions(name):
    z1, z2, scores = pairs()
    reason = negatives_refusal(loss_config(name))
    assert reason == f"loss={name} takes no extra negatives: {ScoredPairObjective.no_negatives}."
    loss = build(name)
    for queue in (torch.randn(4, 8, dtype=torch.float64), torch.randn(0, 8, dtype=torch.float64)):
        with pytest.raises(SentembConfigError, match="takes no extra negatives") as err:
            loss(z1, z2, queue, scores=scores)
        assert reason in str(err.value)
    with pytest.raises(SentembConfigError, match="takes no extra negatives"):
        loss(z1, z2, excluded=torch.zeros(6, 6, dtype=torch.bool), scores=scores)


@pytest.mark.parametrize("name", SCORED)
def test_each_refuses_missing_or_malformed_scores(name):
    z1, z2, scores = pairs()
    loss = build(name)
    with pytest.raises(ValueError, match="needs each pair's gold score"):
        loss(z1, z2)
    with pytest.raises(ValueError, match=r"scores must be an \(6,\) float tensor"):
        loss(z1, z2, scores=scores[:5])
    with pytest.raises(ValueError, match=r"scores must be an \(6,\) float tensor"):
        loss(z1, z2, scores=torch.ones(6, dtype=torch.long))
    for bad in (math.nan, math.inf):
        broken = scores.clone()
        broken[2] = bad
        with pytest.raises(ValueError, match="non-finite"):
            loss(z1, z2, scores=broken)
    with pytest.raises(ValueError, match=r"outside \[0, 1\]"):
        loss(z1, z2, scores=5.0 * scores)  # an STS label not scaled by its range


def test_built_from_the_yaml_with_its_defaults_and_flagged_as_taking_scores():
    cosent, angle_loss, mse = build("cosent"), build("angle"), build("cosine_mse")
    assert isinstance(cosent, CoSENT) and cosent.scale == 20.0
    assert isinstance(angle_loss, AnglE)
    assert (angle_loss.scale, angle_loss.cosine_weight, angle_loss.angle_weight) == (20.0, 0.0, 1.0)
    assert isinstance(mse, CosineMSE)
    assert all(SCORES in loss.reads for loss in (cosent, angle_loss, mse)) and SCORES not in Objective.reads
    assert SCORES not in build("infonce").reads
    with pytest.raises(SentembConfigError, match="loss.scale=0"):
        build("cosent", scale=0)
    with pytest.raises(SentembConfigError, match="loss.cosine_weight=-1"):
        build("angle", cosine_weight=-1.0)


def test_a_weighted_sum_refuses_a_scored_term_before_anything_loads():
    from sentemb.common.errors import SentembConfigError
    from sentemb.losses import build

    with pytest.raises(SentembConfigError, match=r"loss.terms.cosent: CoSENT learns from scored pairs.*Fix: "):
        build("sum", terms={"infonce": {"weight": 1.0}, "cosent": {"weight": 0.5}})
