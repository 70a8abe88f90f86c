"""InfoNCE against a naive loop over its definition, and its numerics."""

from __future__ import annotations

import math

import pytest
import torch

from sentemb.common.errors import SentembConfigError
from sentemb.common.parts import lookup
from sentemb.losses import InfoNCE, available, build
from sentemb.losses.inputs import PAIRS


def naive_infonce(z1: torch.Tensor, z2: torch.Tensor, tau: float) -> float:
    """L = mean_i −log e^{s_ii/τ} / Σ_j e^{s_ij/τ}, one anchor and one candidate at a time."""
    n = z1.shape[0]
    h1 = [row / row.norm() for row in z1.double()]
    h2 = [row / row.norm() for row in z2.double()]
    total = 0.0
    for i in range(n):
        logits = [float(h1[i] @ h2[j]) / tau for j in range(n)]
        total += -(logits[i] - math.log(sum(math.exp(x) for x in logits)))
    return total / n


@pytest.mark.parametrize("tau", [0.05, 0.1, 1.0])
def test_matches_naive_definition(tau):
    gen = torch.Generator().manual_seed(0)
    z1, z2 = torch.randn(8, 16, generator=gen), torch.randn(8, 16, generator=gen)
    # float32 loss vs a float64 loop: the cosines' ~1e-7 rounding, scaled by 1/τ ≤ 20 into the logits, ~1e-6
    assert InfoNCE(tau=tau)(z1, z2).loss.item() == pytest.approx(naive_infonce(z1, z2, tau), rel=1e-5)


def test_symmetric_averages_both_directions():
    gen = torch.Generator().manual_seed(1)
    z1, z2 = torch.randn(8, 16, generator=gen), torch.randn(8, 16, generator=gen)
    expected = 0.5 * (naive_infonce(z1, z2, 0.05) + naive_infonce(z2, z1, 0.05))
    # float32 loss vs a float64 loop: the cosines' ~1e-7 rounding, scaled by 1/τ ≤ 20 into the logits, ~1e-6
    assert InfoNCE(symmetric=True)(z1, z2).loss.item() == pytest.approx(expected, rel=1e-5)


def test_scale_invariant_because_it_normalises():
    gen = torch.Generator().manual_seed(2)
    z1, z2 = torch.randn(8, 16, generator=gen), torch.randn(8, 16, generator=gen)
    loss = InfoNCE()
    # 7·z and 0.1·z normalise to unit vectors that differ in the last bit (~1e-7), times 1/τ = 20 in the logits
    assert loss(z1, z2).loss.item() == pytest.approx(loss(7.0 * z1, 0.1 * z2).loss.item(), rel=1e-5)


def test_duplicated_sentences_and_identical_views_stay_finite():
    # four orthogonal sentences, each twice in the batch; both views identical (cos = 1)
    z = (3.0 * torch.eye(16)[:4]).repeat(2, 1).requires_grad_()
    out = InfoNCE()(z, z)
    out.loss.backward()
    assert torch.isfinite(out.loss) and torch.isfinite(z.grad).all()
    # each anchor ties with its duplicate; the other six add 6·e^{−1/τ} ≈ 1e-8, float32 rounding ~1e-7: rel 1e-6
    assert out.loss.item() == pytest.approx(math.log(2), rel=1e-6)


def test_similarities_in_float32_under_bf16_autocast():
    gen = torch.Generator().manual_seed(3)
    z1, z2 = torch.randn(8, 16, generator=gen), torch.randn(8, 16, generator=gen)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = InfoNCE()(z1.bfloat16(), z2.bfloat16())
    assert out.loss.dtype == torch.float32 and torch.isfinite(out.loss)


def test_stats_report_positive_and_negative_cosines():
    z = torch.eye(4)
    stats = InfoNCE()(z, z).stats
    # one-hot rows: every product is 0 or 1, so only float32 normalisation could round (~1e-7)
    assert stats["cos_pos"] == pytest.approx(1.0, abs=1e-6) and stats["cos_neg"] == pytest.approx(0.0, abs=1e-6)


@pytest.mark.parametrize("tau", [0.0, -1.0])
def test_rejects_non_positive_temperature(tau):
    with pytest.raises(SentembConfigError, match="loss.tau"):
        InfoNCE(tau=tau)


# --------------------------------------------------------------------------- the whole library
def unit_rows(z: torch.Tensor) -> list[torch.Tensor]:
    return [row / row.norm() for row in z.double()]


def naive_original(name: str, z1: torch.Tensor, z2: torch.Tensor) -> float:
    """Each original-form definition of the spec, one anchor / pair / entry at a time."""
    h, hp = unit_rows(z1), unit_rows(z2)
    n, dim = len(h), h[0].numel()
    dot = lambda x, y: float(x @ y)  # noqa: E731
    dist = lambda x, y: float((x - y).norm())  # noqa: E731
    others = lambda i: [j for j in range(n) if j != i]  # noqa: E731
    align = sum(dist(h[i], hp[i]) ** 2 for i in range(n)) / n
    if name == "arccon":
        tau, u = 0.05, math.pi / 18
        return (
            sum(
                -math.cos(math.acos(dot(h[i], hp[i])) + u) / tau
                + math.log(
                    math.exp(math.cos(math.acos(dot(h[i], hp[i])) + u) / tau)
                    + sum(math.exp(dot(h[i], hp[j]) / tau) for j in others(i))
                )
                for i in range(n)
            )
            / n
        )
    if name == "mpt":
        return sum(max(0.0, -dot(h[i], hp[i]) + max(dot(h[i], hp[j]) for j in others(i)) + 0.23) for i in range(n)) / n
    if name == "met":
        return sum(max(0.0, dist(h[i], hp[i]) - min(dist(h[i], hp[j]) for j in others(i)) + 0.45) for i in range(n)) / n
    if name == "focal":
        tau, m = 0.05, 0.3
        total = 0.0
        for i in range(n):
            positive = dot(h[i], hp[i]) ** 2 / tau
            negatives = sum(math.exp(dot(h[i], hp[j]) * (dot(h[i], hp[j]) + m) / tau) for j in others(i))
            total += -(positive - math.log(negatives + math.exp(positive)))
        return total / n
    if name == "align_mhe":
        pairs = [math.exp(-(dist(h[k], h[q]) ** 2)) for k in range(n) for q in range(k + 1, n)]
        return align + math.log(2 / (n * (n - 1)) * sum(pairs))
    if name == "align_mhs":
        return align + sum(-min(dist(h[i], h[j]) for j in others(i)) for i in range(n)) / n
    if name == "barlow":
        nu = 5e-3
        c = [[sum(float(h[i][k] * hp[i][q]) for i in range(n)) / n for q in range(dim)] for k in range(dim)]
        return sum((c[k][k] - 1) ** 2 for k in range(dim)) + nu * sum(
            c[k][q] ** 2 for k in range(dim) for q in range(dim) if k != q
        )
    if name == "vicreg":

        def covariance(x):
            mean = [sum(float(x[i][k]) for i in range(n)) / n for k in range(dim)]
            cov = [
                [
                    sum((float(x[i][k]) - mean[k]) * (float(x[i][q]) - mean[q]) for i in range(n)) / (n - 1)
                    for q in range(dim)
                ]
                for k in range(dim)
            ]
            v = sum(cov[k][q] ** 2 for k in range(dim) for q in range(dim) if k != q) / dim
            c = sum(max(0.0, 1.0 - math.sqrt(cov[k][k] + 1e-4)) for k in range(dim)) / dim
            return v, c

        (v1, c1), (v2, c2) = covariance(h), covariance(hp)
        return align + (v1 + v2) + (c1 + c2)
    raise KeyError(name)


# every registered loss of pairs alone (what reads more, scores: tests/test_scored_losses.py; a wrapper of losses is
# built from its terms), in every convention it declares
EVERY_LOSS = [
    name
    for name in available()
    if lookup("loss", name).build.reads == PAIRS and not lookup("loss", name).build.wraps_losses
]
EVERY_FORM = [(name, convention) for name in EVERY_LOSS for convention in lookup("loss", name).build.conventions]


# the original forms `naive_original` writes out as loops
@pytest.mark.parametrize("name", ["arccon", "mpt", "met", "focal", "align_mhe", "align_mhs", "barlow", "vicreg"])
def test_original_forms_equal_a_naive_loop(name):
    gen = torch.Generator().manual_seed(3)
    z1, z2 = (
        torch.randn(8, 6, generator=gen, dtype=torch.float64),
        torch.randn(8, 6, generator=gen, dtype=torch.float64),
    )
    # float64 both sides, other summation orders: ~1e-15; 1e-9 also covers arccos's 1/sin θ, far below a formula error
    assert build(name)(z1, z2).loss.item() == pytest.approx(naive_original(name, z1, z2), rel=1e-9)


@pytest.mark.parametrize("name, convention", EVERY_FORM)
def test_every_loss_is_finite_for_duplicates_and_cos_plus_minus_one(name, convention):
    base = 3.0 * torch.eye(16)[:4]
    cases = {
        "duplicated sentences": (base.repeat(2, 1), base.repeat(2, 1) + 0.01),
        "identical views (cos = 1)": (base.repeat(2, 1), base.repeat(2, 1)),
        "opposite views (cos = -1)": (base.repeat(2, 1), -base.repeat(2, 1)),
        "all sentences identical": (torch.ones(8, 16), torch.ones(8, 16)),
    }
    for case, (z1, z2) in cases.items():
        z1, z2 = z1.clone().requires_grad_(), z2.clone().requires_grad_()
        out = build(name, convention=convention)(z1, z2)
        out.loss.backward()
        assert torch.isfinite(out.loss), case
        assert torch.isfinite(z1.grad).all() and torch.isfinite(z2.grad).all(), case
        assert all(math.isfinite(v) for v in out.stats.values()), (case, out.stats)


@pytest.mark.parametrize("name, convention", EVERY_FORM)
def test_every_loss_computes_in_float32_under_bf16_autocast(name, convention):
    gen = torch.Generator().manual_seed(4)
    z1 = torch.randn(8, 16, generator=gen).bfloat16().requires_grad_()
    z2 = torch.randn(8, 16, generator=gen).bfloat16()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = build(name, convention=convention)(z1, z2)
    out.loss.backward()
    assert out.loss.dtype == torch.float32 and torch.isfinite(out.loss) and torch.isfinite(z1.grad.float()).all()


@pytest.mark.parametrize("name", ["paradigm", "mpt", "met", "mmhe", "mmhs", "mbarlow", "mvicreg"])
def test_no_anchor_past_the_margin_gives_zero_loss_and_zero_gradient(name):
    z = torch.eye(8, 16)  # s_ii = 1, every negative at 0: a gap of 1 passes every margin
    z1, z2 = z.clone().requires_grad_(), z.clone().requires_grad_()
    out = build(name)(z1, z2)
    out.loss.backward()
    # exact: d_i = 0 multiplies every anchor's terms, so this is a structural zero, not a rounding
    assert out.loss.item() == 0.0
    assert torch.count_nonzero(z1.grad) == 0 and torch.count_nonzero(z2.grad) == 0
    if "gd" in out.stats:
        assert out.stats["gd"] == 0.0


@pytest.mark.parametrize("name", ["paradigm", "mmhe", "mmhs", "mbarlow", "mvicreg"])
def test_reference_forms_give_zero_gradient_when_no_anchor_passes_the_margin(name):
    # orthonormal sentences: every same-view and cross-view gap is 1, past m = 0.30, so the code gates every row
    z = torch.eye(8, 16)
    z1, z2 = z.clone().requires_grad_(), z.clone().requires_grad_()
    out = build(name, convention="reference")(z1, z2)
    out.loss.backward()
    # exact: every embedding is detached (structural zeros); the value keeps the code's ungated constants
    # (e.g. mmhe's log Σ e^{a_kl/τ}), and the code's sg loss would be NaN (a mean of no rows) where this is 0
    assert torch.isfinite(out.loss) and (name != "paradigm" or out.loss.item() == 0.0)
    assert torch.count_nonzero(z1.grad) == 0 and torch.count_nonzero(z2.grad) == 0
    assert out.stats["gd"] == 0.0


@pytest.mark.parametrize("name, convention", EVERY_FORM)
def test_every_loss_is_scale_invariant_and_reports_the_telemetry(name, convention):
    gen = torch.Generator().manual_seed(5)
    z1, z2 = torch.randn(8, 16, generator=gen), torch.randn(8, 16, generator=gen)
    loss = build(name, convention=convention)
    out = loss(z1, z2)
    # unit vectors differ in the last bit (~1e-7); 1/τ, arccos and the Barlow/VICReg sums amplify it to ~1e-5
    assert out.loss.item() == pytest.approx(loss(7.0 * z1, 0.1 * z2).loss.item(), rel=1e-4, abs=1e-6)
    # the telemetry it declares, exactly: a loss offers what it computes (Barlow's W is signed, its R a matrix)
    assert set(out.stats) == set(loss.offered_telemetry()), (name, sorted(out.stats))
    if "hardest_share" in out.stats:
        assert 0 < out.stats["hardest_share"] <= 1


def test_telemetry_values_are_the_batch_geometry():
    z1 = torch.eye(4, 8)
    z2 = torch.nn.functional.normalize(z1 + 0.5 * torch.eye(4, 8).roll(1, dims=1), dim=1)
    stats = build("mpt")(z1, z2).stats
    s = z1 @ z2.T
    theta_pos = torch.arccos(s.diagonal())
    # the loss's own float32 path (clamped arccos, its normalisation) vs this one: a few ulps, ~1e-7 relative
    assert stats["mu_pos"] == pytest.approx(theta_pos.mean().item(), rel=1e-5)
    assert stats["alignment"] == pytest.approx((z1 - z2).pow(2).sum(1).mean().item(), rel=1e-5)
    # orthonormal anchors: ‖h_i − h_j‖² = 2 for every pair, uniformity = −4
    assert stats["uniformity"] == pytest.approx(-4.0, rel=1e-5)
    # exact: MPT's W is one-hot (max / sum of one weight) and its R the constant 1
    assert stats["hardest_share"] == 1.0 and stats["ratio"] == 1.0


def test_build_takes_the_yaml_defaults_and_keyword_overrides():
    loss = build("mmhe", m=0.25, tau=0.03, r=1.5)
    assert (loss.m, loss.tau, loss.r, loss.margin_on) == (0.25, 0.03, 1.5, "cross")
    assert build("mbarlow").r == 1.5 and build("mmhs").r == 1.75  # Table 6
    with pytest.raises(SentembConfigError, match="no loss named 'nope'.*infonce"):
        build("nope")
    with pytest.raises(SentembConfigError, match="mmhe.yaml has no field temperature"):
        build("mmhe", temperature=0.05)
    with pytest.raises(SentembConfigError, match="loss.gd='sometimes'"):
        build("paradigm", gd="sometimes")
    with pytest.raises(SentembConfigError, match="loss.r='dynamic'"):
        build("paradigm", r="dynamic")


def test_weighted_sum_adds_the_weighted_terms_and_reports_each():
    gen = torch.Generator().manual_seed(6)
    z1, z2 = (
        torch.randn(8, 16, generator=gen, dtype=torch.float64),
        torch.randn(8, 16, generator=gen, dtype=torch.float64),
    )
    combined = build("sum", terms={"infonce": {"weight": 1.0}, "hard": {"loss": "mmhe", "weight": 0.5, "r": 1.5}})
    out = combined(z1, z2)
    parts = build("infonce")(z1, z2).loss + 0.5 * build("mmhe", r=1.5)(z1, z2).loss
    # float64, the same terms; only the order of the weighted additions may differ (~1e-16)
    assert out.loss.item() == pytest.approx(parts.item(), rel=1e-12)
    assert set(out.terms) == {"infonce", "hard"} and "hard/gd" in out.stats and "infonce/hardest_share" in out.stats
    with pytest.raises(SentembConfigError, match="loss.terms is empty"):
        build("sum")
    with pytest.raises(SentembConfigError, match="loss.terms.x.weight"):
        build("sum", terms={"x": {"loss": "infonce"}})
    with pytest.raises(SentembConfigError, match="loss.terms.bad: .*no field"):
        build("sum", terms={"bad": {"loss": "infonce", "weight": 1.0, "m": 0.3}})
