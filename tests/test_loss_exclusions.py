"""False negatives excluded from a loss's negatives (`Objective.forward(..., excluded=)`, DCLR): each loss that takes
extra negatives against a naive per-anchor loop from which the excluded columns are deleted, a row with every negative
excluded, the symmetric direction's transpose, the telemetry, and the refusals."""

from __future__ import annotations

import math

import pytest
import torch

from sentemb.common.errors import SentembConfigError
from sentemb.losses import InfoNCE, Objective, build
from sentemb.losses.base import LossOutput
from sentemb.losses.registry import loss_config, negatives_refusal
from tests.test_queue_negatives import REFUSES, clamped_acos, cosines

N, K, D = 6, 4, 5
# float64 on both sides: only the order of summation differs (~1e-15 relative), far below 1e-12
TOLERANCE = {"rel": 1e-12, "abs": 1e-12}
FULL_ROW = 2  # the anchor whose every negative (batch and queue) is excluded


def batch(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Raw float64 views (z2 a noisy copy of z1), extra negatives, and an exclusion mask: about a third of the
    candidates, never the diagonal, and every negative of anchor FULL_ROW."""
    gen = torch.Generator().manual_seed(seed)
    z1 = torch.randn(N, D, generator=gen, dtype=torch.float64)
    z2 = z1 + 0.6 * torch.randn(N, D, generator=gen, dtype=torch.float64)
    queue = 2.0 * torch.randn(K, D, generator=gen, dtype=torch.float64)
    excluded = torch.rand(N, N + K, generator=gen) < 0.35
    excluded[FULL_ROW] = True
    excluded[:, :N].fill_diagonal_(False)
    return z1, z2, queue, excluded


def naive_mean(z1, z2, queue, excluded, anchor_loss) -> float:
    """mean_i anchor_loss(s_ii, [s_ij for the negatives j left]): the excluded columns deleted from row i."""
    s = cosines(z1, torch.cat((z2, queue)))
    drop = excluded.tolist()
    total = 0.0
    for i, row in enumerate(s):
        negatives = [x for j, x in enumerate(row) if j != i and not drop[i][j]]
        total += anchor_loss(row[i], negatives)
    return total / len(s)


def softmax_loss(positive_logit: float, negative_logits: list[float]) -> float:
    """−log e^{p} / (e^{p} + Σ e^{n}), the excluded terms gone from the denominator (DCLR's α = 0)."""
    return -(positive_logit - math.log(math.exp(positive_logit) + sum(math.exp(x) for x in negative_logits)))


def naive_infonce(tau):
    return lambda p, negs: softmax_loss(p / tau, [x / tau for x in negs])


def naive_focal(tau, m):
    return lambda p, negs: softmax_loss(p * p / tau, [x * (x + m) / tau for x in negs])


def naive_arccon(tau, u):
    return lambda p, negs: softmax_loss(math.cos(clamped_acos(p) + u) / tau, [x / tau for x in negs])


def naive_triplet(distance, margin):
    """No negative left: no triplet (0)."""
    return lambda p, negs: max(0.0, distance(p) - min(distance(x) for x in negs) + margin) if negs else 0.0


def naive_paradigm(gd, w, r, m=0.30, tau=0.05, u=math.pi / 18, power=4.0):
    """GD_i Σ_j W_ij (s_ij − R_ij s_ii) over the negatives j left (none left: 0)."""

    def anchor(p, negs):
        if not negs:
            return 0.0
        if gd == "margin":
            gate = 1.0 if p - max(negs) < m else 0.0
        elif gd == "infonce":
            gate = 1.0 / (1.0 + math.exp(p / tau) / sum(math.exp(x / tau) for x in negs))
        else:
            gate = 1.0
        if w == "softmax":
            raw = [math.exp(x / tau) for x in negs]
        elif w == "hardest":
            raw = [float(j == max(range(len(negs)), key=lambda k: negs[k])) for j in range(len(negs))]
        elif w == "power":
            raw = [max(x, 1e-4) ** power for x in negs]
        else:
            raw = [1.0] * len(negs)
        value = 0.0
        for weight, x in zip(raw, negs, strict=True):
            if r == "arccon":
                theta = clamped_acos(p)
                ratio = math.sin(theta + u) / math.sin(theta)
            elif r == "met":
                ratio = math.sqrt(max(1.0 - x, 0.0) / max(1.0 - p, 1e-6))
            else:
                ratio = r
            value += weight / sum(raw) * (x - ratio * p)
        return gate * value

    return anchor


def met_distance(s: float) -> float:
    return math.sqrt(max(2 - 2 * s, 1e-6))


LOOPS = [
    ("infonce", {"tau": 0.05}, naive_infonce(0.05)),
    ("infonce", {"tau": 0.5}, naive_infonce(0.5)),
    ("focal", {"tau": 0.05, "m": 0.3}, naive_focal(0.05, 0.3)),
    ("focal", {"tau": 0.2, "m": -0.1}, naive_focal(0.2, -0.1)),
    ("arccon", {"tau": 0.05, "u": 0.2}, naive_arccon(0.05, 0.2)),
    ("mpt", {"m": 0.23}, naive_triplet(lambda s: -s, 0.23)),
    ("met", {"m": 0.45}, naive_triplet(met_distance, 0.45)),
    ("mat", {"m": 0.15}, naive_triplet(clamped_acos, 0.15 * math.pi)),
] + [
    ("paradigm", {"gd": gd, "w": w, "r": r}, naive_paradigm(gd, w, r))
    for gd, w, r in [
        ("margin", "softmax", 1.0),
        ("margin", "hardest", 1.5),
        ("infonce", "uniform", "arccon"),
        ("none", "power", "met"),
        ("none", "softmax", 1.75),
        ("infonce", "hardest", "met"),
        ("none", "uniform", 1.0),
    ]
]
IDS = [f"{name}-{fields}" for name, fields, _ in LOOPS]


@pytest.mark.parametrize(("name", "fields", "loop"), LOOPS, ids=IDS)
def test_each_loss_with_exclusions_matches_its_formula_with_the_excluded_columns_deleted(name, fields, loop):
    z1, z2, queue, excluded = batch(1)
    expected = naive_mean(z1, z2, queue, excluded, loop)
    assert expected != 0.0  # a margin that no anchor passes would test nothing
    loss = build(name, **fields)
    assert loss(z1, z2, queue, excluded=excluded).loss.item() == pytest.approx(expected, **TOLERANCE)
    # without extra negatives: the (N, N) block alone
    expected = naive_mean(z1, z2, queue[:0], excluded[:, :N], loop)
    assert loss(z1, z2, excluded=excluded[:, :N]).loss.item() == pytest.approx(expected, **TOLERANCE)


@pytest.mark.parametrize(("name", "fields", "loop"), LOOPS, ids=IDS)
def test_a_row_with_every_negative_excluded_adds_nothing_and_stays_finite(name, fields, loop):
    z1, z2, queue, excluded = batch(2)
    a, b = z1.clone().requires_grad_(), z2.clone().requires_grad_()
    out = build(name, **fields)(a, b, queue, excluded=excluded)
    out.loss.backward()
    assert torch.isfinite(out.loss) and torch.isfinite(a.grad).all() and torch.isfinite(b.grad).all()
    assert all(math.isfinite(value) for value in out.stats.values()), dict(out.stats)
    assert loop(0.3, []) == 0.0  # the naive loop's row: no negative left, nothing to push
    # every negative of every row excluded: a finite loss, no negatives' statistics
    everything = ~torch.eye(N, N + K, dtype=torch.bool)
    out = build(name, **fields)(z1, z2, queue, excluded=everything)
    assert torch.isfinite(out.loss) and "cos_neg" not in out.stats
    assert all(math.isfinite(value) for value in out.stats.values()), dict(out.stats)


@pytest.mark.parametrize(("name", "fields"), [(name, fields) for name, fields, _ in LOOPS], ids=IDS)
def test_nothing_excluded_is_exactly_the_loss_without_exclusions(name, fields):
    z1, z2, queue, _ = batch(3)
    results = []
    for excluded in (None, torch.zeros(N, N + K, dtype=torch.bool)):
        a, b = z1.clone().requires_grad_(), z2.clone().requires_grad_()
        out = build(name, **fields)(a, b, queue, excluded=excluded)
        out.loss.backward()
        results.append((out.loss.detach(), a.grad, b.grad))
    assert all(torch.equal(x, y) for x, y in zip(*results, strict=True))


def test_a_weighted_sum_passes_the_exclusions_to_each_term():
    z1, z2, queue, excluded = batch(4)
    terms = {"infonce": {"weight": 1.0}, "hard": {"weight": 0.5, "loss": "mpt", "m": 0.1}}
    out = build("sum", terms=terms)(z1, z2, queue, excluded=excluded)
    expected = naive_mean(z1, z2, queue, excluded, naive_infonce(0.05))
    expected += 0.5 * naive_mean(z1, z2, queue, excluded, naive_triplet(lambda s: -s, 0.1))
    assert out.loss.item() == pytest.approx(expected, **TOLERANCE)
    assert build("sum", terms=terms)(z1, z2, excluded=excluded[:, :N]).loss.item() == pytest.approx(
        naive_mean(z1, z2, queue[:0], excluded[:, :N], naive_infonce(0.05))
        + 0.5 * naive_mean(z1, z2, queue[:0], excluded[:, :N], naive_triplet(lambda s: -s, 0.1)),
        **TOLERANCE,
    )


def test_the_symmetric_direction_gets_the_transposed_block_and_the_same_extra_columns():
    z1, z2, queue, excluded = batch(5)
    transposed = torch.cat((excluded[:, :N].T, excluded[:, N:]), dim=1)
    expected = 0.5 * (
        naive_mean(z1, z2, queue, excluded, naive_infonce(0.05))
        + naive_mean(z2, z1, queue, transposed, naive_infonce(0.05))
    )
    got = InfoNCE(symmetric=True)(z1, z2, queue, excluded=excluded).loss.item()
    assert got == pytest.approx(expected, **TOLERANCE)


@pytest.mark.parametrize("name", ["infonce", "arccon", "mpt", "mat"])  # MET's reference distance adds an ε
def test_the_reference_convention_excludes_as_the_paper_does_where_it_is_the_same_computation(name):
    z1, z2, queue, excluded = batch(6)
    paper = build(name)(z1, z2, queue, excluded=excluded)
    reference = build(name, convention="reference")(z1, z2, queue, excluded=excluded)
    assert torch.equal(paper.loss, reference.loss), name


def test_the_telemetry_reads_the_negatives_left():
    z1, z2, queue, excluded = batch(7)
    s = cosines(z1, torch.cat((z2, queue)))
    kept = [s[i][j] for i in range(N) for j in range(N + K) if j != i and not excluded[i, j]]
    stats = InfoNCE()(z1, z2, queue, excluded=excluded).stats
    assert stats["cos_neg"] == pytest.approx(sum(kept) / len(kept), **TOLERANCE)


def test_a_bad_mask_is_refused():
    z1, z2, queue, excluded = batch(8)
    with pytest.raises(ValueError, match=r"bool \(N, N \+ K\) = \(6, 10\)"):
        InfoNCE()(z1, z2, queue, excluded=excluded[:, :N])  # the queue's columns missing
    with pytest.raises(ValueError, match="bool"):
        InfoNCE()(z1, z2, queue, excluded=excluded.float())
    diagonal = excluded.clone()
    diagonal[3, 3] = True
    with pytest.raises(ValueError, match="diagonal"):
        InfoNCE()(z1, z2, queue, excluded=diagonal)
    with pytest.raises(ValueError, match="diagonal"):  # a sum checks before any term runs
        build("sum", terms={"infonce": {"weight": 1.0}})(z1, z2, queue, excluded=diagonal)


@pytest.mark.parametrize("name", REFUSES)
def test_losses_that_refuse_extra_negatives_refuse_exclusions_with_the_same_reason(name):
    z1, z2, _, excluded = batch(9)
    with pytest.raises(SentembConfigError, match="takes no extra negatives") as err:
        build(name)(z1, z2, excluded=excluded[:, :N])
    assert negatives_refusal(loss_config(name)) in str(err.value)
    with pytest.raises(SentembConfigError, match="sg loss"):
        build("paradigm", convention="reference")(z1, z2, excluded=excluded[:, :N])
    terms = {"infonce": {"weight": 1.0}, "decorrelate": {"weight": 0.1, "loss": "barlow"}}
    with pytest.raises(SentembConfigError, match="'decorrelate'"):
        build("sum", terms=terms)(z1, z2, excluded=excluded[:, :N])


def test_a_loss_of_your_own_without_the_keyword_still_works_when_nothing_is_excluded():
    class Own(Objective):
        no_negatives = None

        def directional(self, h1: torch.Tensor, h2: torch.Tensor) -> LossOutput:
            return LossOutput((h1 @ h2.T).diagonal().mean())

    z1, z2, queue, excluded = batch(10)
    assert torch.isfinite(Own()(z1, z2, queue).loss)
    with pytest.raises(TypeError, match="excluded"):  # it says it takes negatives, not how it would exclude them
        Own()(z1, z2, queue, excluded=excluded)
