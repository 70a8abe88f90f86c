"""Each loss's gradient against the form its paper states for it (docs/objectives.md).

Float64, random unit embeddings, N = 12. Autograd is taken with respect to unit-norm inputs,
so the normalisation's Jacobian projects it onto the tangent space: it is exactly the
tangential part of ∂L/∂h_i, compared with the tangential part of the spec's form for every
anchor. The one positive constant a reduction introduces (1/N for a mean over anchors, 1 for
a sum) is checked as well, not just fitted.
"""

from __future__ import annotations

import math

import pytest
import torch

from sentemb.losses import build

N, D = 12, 10
# float64 autograd vs a float64 formula in another order: ~1e-15 apart; 1e-9 also covers arccos's 1/sin θ at
# small angles and stays far below any error in a form (those are O(1) relative)
FLOAT64_FORM = {"rtol": 1e-9, "atol": 1e-12}


def views(seed: int = 0, spread: tuple[float, float] = (0.05, 1.5)) -> tuple[torch.Tensor, torch.Tensor]:
    """h, h' unit vectors; positives range from near copies to unrelated so margins split anchors."""
    gen = torch.Generator().manual_seed(seed)
    h1 = torch.nn.functional.normalize(torch.randn(N, D, generator=gen, dtype=torch.float64), dim=1)
    noise = torch.linspace(*spread, N, dtype=torch.float64)[:, None] * torch.randn(
        N, D, generator=gen, dtype=torch.float64
    )
    return h1, torch.nn.functional.normalize(h1 + noise, dim=1)


def anchor_gradient(loss, h1: torch.Tensor, h2: torch.Tensor) -> torch.Tensor:
    z1 = h1.clone().requires_grad_()
    (grad,) = torch.autograd.grad(loss(z1, h2).loss, z1)
    return grad


def tangential(h: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    return v - (v * h).sum(dim=1, keepdim=True) * h


def assert_gradient_form(grad: torch.Tensor, form: torch.Tensor, h1: torch.Tensor, constant: float) -> None:
    expected = constant * tangential(h1, form)
    assert expected.abs().max() > 1e-6, "degenerate test case: the expected gradient vanishes"
    torch.testing.assert_close(grad, expected, **FLOAT64_FORM)


def margin_d(s: torch.Tensor, m: float) -> torch.Tensor:
    negatives = s.masked_fill(torch.eye(N, dtype=torch.bool), -math.inf)
    return (s.diagonal() - negatives.max(dim=1).values < m).double()


# --------------------------------------------------------------------------- effective losses
def test_infonce_gradient_is_eq1():
    h1, h2 = views()
    tau = 0.05
    s = h1 @ h2.T
    e = torch.exp(s / tau)
    form = torch.stack(
        [sum(e[i, j] * (h2[j] - h2[i]) for j in range(N) if j != i) / (tau * e[i].sum()) for i in range(N)]
    )
    assert_gradient_form(anchor_gradient(build("infonce"), h1, h2), form, h1, 1 / N)


def test_arccon_gradient_is_eq2():
    h1, h2 = views(1)
    tau, u = 0.05, math.pi / 18
    s = h1 @ h2.T
    theta = torch.arccos(s.diagonal())
    ratio = torch.sin(theta + u) / torch.sin(theta)
    rows = []
    for i in range(N):
        denominator = tau * (
            torch.exp(torch.cos(theta[i] + u) / tau) + sum(torch.exp(s[i, k] / tau) for k in range(N) if k != i)
        )
        rows.append(
            sum(torch.exp(s[i, j] / tau) * (h2[j] - ratio[i] * h2[i]) for j in range(N) if j != i) / denominator
        )
    assert_gradient_form(anchor_gradient(build("arccon"), h1, h2), torch.stack(rows), h1, 1 / N)


def test_mpt_and_met_gradients_are_eq3():
    h1, h2 = views(2)
    s = h1 @ h2.T
    hardest = s.masked_fill(torch.eye(N, dtype=torch.bool), -math.inf).argmax(dim=1)
    mpt_active = margin_d(s, 0.23)
    assert 0 < mpt_active.sum() < N, "the test should cover active and dissipated anchors"
    mpt_form = torch.stack([mpt_active[i] * (h2[hardest[i]] - h2[i]) for i in range(N)])
    assert_gradient_form(anchor_gradient(build("mpt"), h1, h2), mpt_form, h1, 1 / N)

    distance = torch.sqrt(2 - 2 * s)
    met_active = torch.tensor(
        [float(distance[i, hardest[i]] - distance[i, i] < 0.45) for i in range(N)], dtype=torch.float64
    )
    assert 0 < met_active.sum() < N
    met_form = torch.stack(
        [met_active[i] * (h2[hardest[i]] / distance[i, hardest[i]] - h2[i] / distance[i, i]) for i in range(N)]
    )
    assert_gradient_form(anchor_gradient(build("met"), h1, h2), met_form, h1, 1 / N)


def test_focal_gradient_is_focal_eq4_eq5():
    h1, h2 = views(3)
    tau, m = 0.05, 0.3
    s = h1 @ h2.T
    rows = []
    for i in range(N):
        logits = [(s[i, j] ** 2 if j == i else s[i, j] * (s[i, j] + m)) / tau for j in range(N)]
        z = sum(torch.exp(x) for x in logits)
        p = [torch.exp(x) / z for x in logits]
        negatives = sum(p[j] * (2 * s[i, j] + m) / tau * h2[j] for j in range(N) if j != i)  # Eq. 4 (d/ds of s(s+m))
        positive = (2 / tau) * (p[i] - 1) * s[i, i] * h2[i]  # Eq. 5
        rows.append(negatives + positive)
    assert_gradient_form(anchor_gradient(build("focal"), h1, h2), torch.stack(rows), h1, 1 / N)


# --------------------------------------------------------------------------- the paradigm loss, per component
def table_components(s: torch.Tensor, gd: str, w: str, r, m=0.30, tau=0.05, u=math.pi / 18):
    """GD_i, W_ij, R_ij straight from the spec's component table, one entry at a time."""
    f64 = torch.float64
    gd_values, weights, ratios = torch.zeros(N, dtype=f64), torch.zeros(N, N, dtype=f64), torch.zeros(N, N, dtype=f64)
    for i in range(N):
        others = [k for k in range(N) if k != i]
        hardest = max(others, key=lambda k: s[i, k])
        if gd == "margin":
            gd_values[i] = float(s[i, i] - s[i, hardest] < m)
        elif gd == "infonce":
            gd_values[i] = 1 / (1 + math.exp(s[i, i] / tau) / sum(math.exp(s[i, k] / tau) for k in others))
        else:
            gd_values[i] = 1.0
        for j in others:
            if w == "softmax":
                weights[i, j] = math.exp(s[i, j] / tau) / sum(math.exp(s[i, k] / tau) for k in others)
            elif w == "hardest":
                weights[i, j] = float(j == hardest)
            else:
                weights[i, j] = 1 / (N - 1)
            if r == "arccon":
                theta = math.acos(s[i, i])
                ratios[i, j] = math.sin(theta + u) / math.sin(theta)
            elif r == "met":
                ratios[i, j] = math.sqrt((1 - s[i, j]) / (1 - s[i, i]))
            else:
                ratios[i, j] = r
    return gd_values.double(), weights.double(), ratios.double()


@pytest.mark.parametrize("gd", ["margin", "infonce", "none"])
@pytest.mark.parametrize("w", ["softmax", "hardest", "uniform"])
@pytest.mark.parametrize("r", [1.0, 1.5, "arccon", "met"])
def test_paradigm_components_match_the_table(gd, w, r):
    h1, h2 = views(4)
    s = h1 @ h2.T
    gd_values, weights, ratios = table_components(s, gd, w, r)
    form = torch.stack(
        [
            gd_values[i] * sum(weights[i, j] * (h2[j] - ratios[i, j] * h2[i]) for j in range(N) if j != i)
            for i in range(N)
        ]
    )
    if gd == "margin":
        assert 0 < gd_values.sum() < N
    assert_gradient_form(anchor_gradient(build("paradigm", gd=gd, w=w, r=r), h1, h2), form, h1, 1 / N)


def test_paradigm_reproduces_infonce_and_mpt():
    h1, h2 = views(5)
    infonce = anchor_gradient(build("infonce"), h1, h2)
    paradigm = anchor_gradient(build("paradigm", gd="infonce", w="softmax", r=1.0), h1, h2)
    torch.testing.assert_close(paradigm / 0.05, infonce, **FLOAT64_FORM)  # Table 1's W carries 1/τ
    mpt = anchor_gradient(build("mpt", m=0.3), h1, h2)
    torch.testing.assert_close(anchor_gradient(build("paradigm", w="hardest"), h1, h2), mpt, **FLOAT64_FORM)


# --------------------------------------------------------------------------- non-contrastive, original form
def test_align_mhe_gradient_is_table2():
    h1, h2 = views(6)
    a = h1 @ h1.T
    pair_sum = sum(math.exp(2 * a[k, q]) for k in range(N) for q in range(k + 1, N))
    rows = []
    for i in range(N):
        weights = {j: 2 * math.exp(2 * a[i, j]) / pair_sum for j in range(N) if j != i}  # Table 2, ν = 1
        ratio = pair_sum / (N * sum(math.exp(2 * a[i, k]) for k in range(N) if k != i))
        rows.append(sum(weights[j] * (h1[j] - ratio * h2[i]) for j in weights))
    assert_gradient_form(anchor_gradient(build("align_mhe"), h1, h2), torch.stack(rows), h1, 1.0)


def test_align_mhs_gradient_is_eq7_eq9_plus_reverse_neighbours():
    # Eq. 9 differentiates an anchor's own −min‖h_i−h_j‖; the batch total also moves h_i where it is
    # another anchor's nearest neighbour, which is the same form with more negatives
    h1, h2 = views(7)
    a = h1 @ h1.T
    nearest = a.masked_fill(torch.eye(N, dtype=torch.bool), -math.inf).argmax(dim=1)
    distance = torch.sqrt(2 - 2 * a)
    rows = []
    for i in range(N):
        neighbours = [int(nearest[i])] + [k for k in range(N) if int(nearest[k]) == i]
        rows.append(sum(h1[k] / distance[i, k] for k in neighbours) - 2 * h2[i])
    assert_gradient_form(anchor_gradient(build("align_mhs"), h1, h2), torch.stack(rows), h1, 1 / N)


def test_barlow_gradient_is_table2_form():
    h1, h2 = views(8)
    nu = 5e-3
    cross = h1.T @ h2 / N
    a_matrix = torch.eye(D, dtype=torch.float64) - (1 - nu) * torch.diag(cross.diagonal())
    rows = [
        (2 / N) * (-a_matrix @ h2[i] + nu * sum((h2[i] @ h2[j]) / N * h1[j] for j in range(N) if j != i))
        for i in range(N)
    ]
    assert_gradient_form(anchor_gradient(build("barlow"), h1, h2), torch.stack(rows), h1, 1.0)


def test_vicreg_gradient_is_eq11_exactly():
    # Eq. 11 (Tao et al.) without its approximations: centred vectors, the k ≠ l diagonal and the variance hinge
    h1, h2 = views(9)
    nu1, nu2, gamma = 1.0, 1.0, 1.0
    centred = h1 - h1.mean(dim=0)
    cov = centred.T @ centred / (N - 1)
    std = torch.sqrt(centred.pow(2).sum(dim=0) / (N - 1) + 1e-4)
    rows = []
    for i in range(N):
        covariance = (4 / (D * (N - 1) ** 2)) * sum((centred[i] @ centred[j]) * centred[j] for j in range(N))
        covariance = covariance - (4 / (D * (N - 1))) * cov.diagonal() * centred[i]
        variance = -(1 / D) * (std < gamma).double() * centred[i] / ((N - 1) * std)
        rows.append(-(2 / N) * h2[i] + nu1 * covariance + nu2 * variance)
    assert_gradient_form(anchor_gradient(build("vicreg"), h1, h2), torch.stack(rows), h1, 1.0)


@pytest.mark.parametrize("name", ["align_mhe", "barlow", "vicreg"])
def test_gd_margin_on_an_original_dissipates_exactly_the_inactive_anchors(name):
    h1, h2 = views(10)
    d = margin_d(h1 @ h2.T, 0.30)
    assert 0 < d.sum() < N
    original = anchor_gradient(build(name), h1, h2)
    gated = anchor_gradient(build(name, gd="margin"), h1, h2)
    torch.testing.assert_close(gated, d[:, None] * original, **FLOAT64_FORM)


# --------------------------------------------------------------------------- modified losses
def test_mmhe_gradient_is_eq16():
    h1, h2 = views(11)
    tau, r = 0.05, 1.75
    d = margin_d(h1 @ h2.T, 0.30)
    assert 0 < d.sum() < N
    a = h1 @ h1.T
    pair_sum = sum(math.exp(a[k, q] / tau) for k in range(N) for q in range(k + 1, N))
    form = torch.stack(
        [
            d[i] * sum(math.exp(a[i, j] / tau) * (h1[j] - r * h2[i]) for j in range(N) if j != i) / (tau * pair_sum)
            for i in range(N)
        ]
    )
    assert_gradient_form(anchor_gradient(build("mmhe"), h1, h2), form, h1, 1.0)


def test_mmhs_gradient_is_eq17_with_the_nearest_neighbour():
    h1, h2 = views(12)
    r = 1.75
    d = margin_d(h1 @ h2.T, 0.30)
    a = h1 @ h1.T
    nearest = a.masked_fill(torch.eye(N, dtype=torch.bool), -math.inf).argmax(dim=1)
    form = torch.stack(
        [d[i] * (h1[nearest[i]] - r * h2[i]) / torch.linalg.norm(h1[i] - h1[nearest[i]]) for i in range(N)]
    )
    assert_gradient_form(anchor_gradient(build("mmhs"), h1, h2), form, h1, 1 / N)


@pytest.mark.parametrize("name", ["mbarlow", "mvicreg"])
@pytest.mark.parametrize("w_norm", ["global", "row"])
def test_mbarlow_mvicreg_gradients_are_their_weighted_form(name, w_norm):
    h1, h2 = views(13)
    tau, r = 0.05, 1.5
    d = margin_d(h1 @ h2.T, 0.30)
    base = h2 @ h2.T if name == "mbarlow" else h1 @ h1.T  # mB: h'_i·h'_j; mV: h_i·h_j
    pairs = [(k, q) for k in range(N) for q in range(N) if k != q]
    rows = []
    for i in range(N):
        if w_norm == "global":
            normaliser = sum(math.exp(base[k, q] / tau) for k, q in pairs)
        else:
            normaliser = sum(math.exp(base[i, k] / tau) for k in range(N) if k != i)
        rows.append(
            d[i] * sum(math.exp(base[i, j] / tau) / normaliser * (h1[j] - r * h2[i]) for j in range(N) if j != i)
        )
    constant = 1.0 if w_norm == "global" else 1 / N
    assert_gradient_form(anchor_gradient(build(name, w_norm=w_norm), h1, h2), torch.stack(rows), h1, constant)


def test_original_ratio_keeps_the_unmodified_alignment_coefficient():
    # Table 5's "+W" step: exponential weights, but the original alignment gradient −(2/N) h'_i
    h1, h2 = views(14)
    tau = 0.05
    d = margin_d(h1 @ h2.T, 0.30)
    a, b = h1 @ h1.T, h2 @ h2.T
    pair_sum = sum(math.exp(a[k, q] / tau) for k in range(N) for q in range(k + 1, N))
    mmhe_form = torch.stack(
        [
            d[i]
            * (sum(math.exp(a[i, j] / tau) * h1[j] for j in range(N) if j != i) / (tau * pair_sum) - (2 / N) * h2[i])
            for i in range(N)
        ]
    )
    assert_gradient_form(anchor_gradient(build("mmhe", r="original"), h1, h2), mmhe_form, h1, 1.0)
    global_sum = sum(math.exp(b[k, q] / tau) for k in range(N) for q in range(N) if k != q)
    mbarlow_form = torch.stack(
        [
            d[i] * (sum(math.exp(b[i, j] / tau) / global_sum * h1[j] for j in range(N) if j != i) - (2 / N) * h2[i])
            for i in range(N)
        ]
    )
    assert_gradient_form(anchor_gradient(build("mbarlow", r="original"), h1, h2), mbarlow_form, h1, 1.0)


def test_same_view_margin_option_reads_d_off_the_same_view():
    h1, h2 = views(15)
    a = h1 @ h1.T
    d_same = (1 - a.masked_fill(torch.eye(N, dtype=torch.bool), -math.inf).max(dim=1).values < 0.6).double()
    assert 0 < d_same.sum() < N
    ungated = anchor_gradient(build("mvicreg", gd="none"), h1, h2)
    gated = anchor_gradient(build("mvicreg", m=0.6, margin_on="same"), h1, h2)
    torch.testing.assert_close(gated, d_same[:, None] * ungated, **FLOAT64_FORM)


# --------------------------------------------------------------------------- power weights (the public code's W)
@pytest.mark.parametrize("power", [0.0, 2.0, 4.0])
def test_paradigm_power_weights_give_the_paradigm_form(power):
    h1, h2 = views(16)
    s = h1 @ h2.T
    d = margin_d(s, 0.30)
    assert 0 < d.sum() < N
    rows = []
    for i in range(N):
        raw = {j: max(float(s[i, j]), 1e-4) ** power for j in range(N) if j != i}  # power 0: uniform
        rows.append(d[i] * sum(raw[j] / sum(raw.values()) * (h2[j] - 1.5 * h2[i]) for j in raw))
    loss = build("paradigm", w="power", power=power, r=1.5)
    assert_gradient_form(anchor_gradient(loss, h1, h2), torch.stack(rows), h1, 1 / N)


@pytest.mark.parametrize("name", ["mbarlow", "mvicreg"])
def test_mbarlow_mvicreg_power_weights_give_their_weighted_form(name):
    h1, h2 = views(17)
    power, r = 4.0, 1.5
    d = margin_d(h1 @ h2.T, 0.30)
    base = h2 @ h2.T if name == "mbarlow" else h1 @ h1.T
    raw = {(k, q): max(float(base[k, q]), 1e-4) ** power for k in range(N) for q in range(N) if k != q}
    total = sum(raw.values())  # the global normalisation over k ≠ l
    rows = [d[i] * sum(raw[i, j] / total * (h1[j] - r * h2[i]) for j in range(N) if j != i) for i in range(N)]
    loss = build(name, w="power", power=power, r=r)
    assert_gradient_form(anchor_gradient(loss, h1, h2), torch.stack(rows), h1, 1.0)
