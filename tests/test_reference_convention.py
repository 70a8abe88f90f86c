"""`loss.convention=reference` against the paradigm paper's public code, gradient by gradient.

Source of the formulas: BDBC-KG-NLP/UnderstandingCSE, isotropy/models.py, `InitAndForward._i_forward`:
the `sg` branch (the paradigm loss), the non-contrastive branch (`mhe`, `mhs`, `vicreg`,
`barlowtwins` with the flags w_gd, w_w, w_r) and the `infonce`, `arccon`, `mpt`, `met`, `mat`
branches. Each `code_*` function below restates one branch from its formulas, naively (a
Python loop over rows and pairs), with the code's gating and detaching; none of it is
sentemb's implementation. Float64, N = 16 random unit embeddings in D = 32, margins chosen so
that indicators are mixed and the two views' same-view indicators disagree on some rows.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from sentemb.common.errors import SentembConfigError
from sentemb.losses import build

N, D = 16, 32
# float64 autograd of two computations of the same value in another order: ~1e-15 relative; the
# issue's bound is 1e-10 (a wrong gate, detach or constant moves a row by O(1) relative)
TOLERANCE = 1e-10


def views(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    h1 = F.normalize(torch.randn(N, D, generator=gen, dtype=torch.float64), dim=1)
    h1[1] = F.normalize(h1[0] + 0.3 * h1[1], dim=0)  # a close same-view pair: some rows pass a tight margin
    spread = torch.linspace(0.1, 1.2, N, dtype=torch.float64)[:, None]
    return h1, F.normalize(h1 + spread * torch.randn(N, D, generator=gen, dtype=torch.float64), dim=1)


def same_view_gap(h: torch.Tensor) -> list[float]:
    """a_ii − max_{j≠i} a_ij per row: the code's w_gd margin of one view."""
    a = (h @ h.T).tolist()
    return [a[i][i] - max(a[i][j] for j in range(N) if j != i) for i in range(N)]


def mixed_same_view_margin(h1: torch.Tensor, h2: torch.Tensor) -> float:
    """A margin at which both views have active and dissipated rows and the views disagree somewhere."""
    gaps1, gaps2 = same_view_gap(h1), same_view_gap(h2)
    m = sorted(gaps1 + gaps2)[N]  # the median of all 2N gaps
    d1, d2 = [g < m for g in gaps1], [g < m for g in gaps2]
    assert 0 < sum(d1) < N and 0 < sum(d2) < N, "the test needs mixed indicators"
    assert any(x != y for x, y in zip(d1, d2, strict=True)), "the test needs rows where d_i ≠ d'_i"
    return m


def gated(h: torch.Tensor, m: float) -> list[torch.Tensor]:
    """The code's w_gd: row i keeps its gradient only if a_ii − max_{j≠i} a_ij < m."""
    return [h[i] if gap < m else h[i].detach() for i, gap in enumerate(same_view_gap(h))]


def dot(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return (a * b).sum()


def number(x: torch.Tensor) -> float:
    """A detached value: what the code computes under no gradient (weights, coefficients)."""
    return x.detach().item()


# --------------------------------------------------------------------------- the code's branches, naively
def code_sg(h1, h2, gd: bool, m: float, tau: float, r: float, power: float | None = None) -> torch.Tensor:
    s = (h1 @ h2.T).tolist()
    rows_pass = [s[i][i] - max(s[i][j] for j in range(N) if j != i) < m for i in range(N)]
    cols_pass = [s[j][j] - max(s[i][j] for i in range(N) if i != j) < m for j in range(N)]
    align = [dot(h1[i], h2[i]) for i in range(N)]

    def direction(anchors, candidates, active) -> torch.Tensor:
        total, rows = 0.0, 0
        for i in range(N):
            sims = [align[i] if j == i else dot(anchors[i], candidates[j].detach()) for j in range(N)]
            values = [number(x) for x in sims]
            if power is None:
                raw = [0.0 if j == i else math.exp(values[j] / tau) for j in range(N)]
            else:
                raw = [
                    0.0 if j == i else (1.0 if int(power) == 0 else max(values[j], 1e-4) ** int(power))
                    for j in range(N)
                ]
            weights = [x / sum(raw) for x in raw]
            if not gd or active[i]:
                total = total + sum(weights[j] * (sims[j] - r * align[i]) for j in range(N))
                rows += 1
        return total / (rows * N)

    return direction(h1, h2, rows_pass) + direction(h2, h1, cols_pass)


def code_mhe(h1, h2, gd: bool, w_w: bool, w_r: bool, m: float, tau: float, lam: float, r: float) -> torch.Tensor:
    g1, g2 = (gated(h1, m), gated(h2, m)) if gd else (list(h1), list(h2))
    scale = 1 / tau if w_w else 1.0
    pairs = [(k, q) for k in range(N) for q in range(k)]

    def uniformity(g) -> torch.Tensor:
        return torch.log(sum(torch.exp(scale * dot(g[k], g[q])) for k, q in pairs))

    def coefficient(g) -> list[float]:
        if not w_w:
            return [1 / N] * N
        pair_sum = sum(math.exp(scale * number(dot(g[k], g[q]))) for k, q in pairs)
        return [
            sum(math.exp(scale * number(dot(g[i], g[j]))) for j in range(N) if j != i) / pair_sum / tau
            for i in range(N)
        ]

    factor = r if w_r else 1.0
    c1, c2 = coefficient(g1), coefficient(g2)
    align = [2 - 2 * dot(g1[i], g2[i]) for i in range(N)]
    value = lam * (uniformity(g1) + uniformity(g2))
    return value + sum(align[i] * (c1[i] + c2[i]) / 2 * factor for i in range(N))


def code_mhs(h1, h2, gd: bool, w_r: bool, m: float, lam: float, r: float) -> torch.Tensor:
    g1, g2 = (gated(h1, m), gated(h2, m)) if gd else (list(h1), list(h2))

    def nearest(g, other) -> list[torch.Tensor]:
        out = []
        for i in range(N):
            distances = [torch.sqrt(((g[i] - other[j].detach()) ** 2).sum() + 1e-4) for j in range(N) if j != i]
            out.append(min(distances, key=number))
        return out

    n1, n2 = nearest(g1, g2), nearest(g2, g1)
    align = [2 - 2 * dot(g1[i], g2[i]) for i in range(N)]
    c1 = [r / number(n1[i]) / 2 if w_r else 0.5 for i in range(N)]
    c2 = [r / number(n2[i]) / 2 if w_r else 0.5 for i in range(N)]
    value = lam * (sum(-x for x in n1) / N + sum(-x for x in n2) / N)
    return value + sum(align[i] * c1[i] for i in range(N)) / N + sum(align[i] * c2[i] for i in range(N)) / N


def code_decorrelation(
    h1, h2, kind: str, gd: bool, w_w: str | None, w_r: bool, m: float, tau: float, power: float, lam: float, r: float
) -> torch.Tensor:
    g1, g2 = (gated(h1, m), gated(h2, m)) if gd else (list(h1), list(h2))

    def one(u, other) -> torch.Tensor:
        basis = u if kind == "vicreg" else other
        raw = [[number(dot(basis[i], basis[j])) for j in range(N)] for i in range(N)]
        if w_w is None:
            w = [[raw[i][j] / N * 2 / N for j in range(N)] for i in range(N)]
        else:
            e = [[math.exp(x / tau) if w_w == "exp" else max(x, 1e-4) ** power for x in row] for row in raw]
            normaliser = sum(e[k][q] for k in range(N) for q in range(N) if k != q)
            w = [[x / normaliser for x in row] for row in e]
        total = 0.0
        for i in range(N):
            negative = sum(w[i][j] * dot(u[i], u[j].detach()) for j in range(N))
            if w_r:
                positive = lam * r * sum(w[i][j] for j in range(N) if j != i) * -dot(u[i], other[i])
            elif kind == "vicreg":
                positive = -dot(u[i], other[i].detach()) * 2 / N
            else:
                correlation = [sum(number(u[q][k]) * number(other[q][k]) for q in range(N)) / N for k in range(D)]
                positive = sum(
                    (1 - (1 - lam) * correlation[k]) * 2 / N * -(u[i][k] * other[i][k].detach()) for k in range(D)
                )
            total = total + positive + lam * negative
        return total

    return one(g1, g2) + one(g2, g1)


def code_triplet(h1, h2, kind: str, m: float) -> torch.Tensor:
    total = 0.0
    for i in range(N):
        if kind == "met":
            d = [torch.sqrt(torch.clamp_min(2 - 2 * dot(h1[i], h2[j]), 1e-4)) for j in range(N)]
        elif kind == "mat":
            d = [torch.arccos(dot(h1[i], h2[j])) for j in range(N)]
        else:  # mpt: −s
            d = [-dot(h1[i], h2[j]) for j in range(N)]
        margin = m * math.pi if kind == "mat" else m
        total = total + torch.relu(d[i] - min((d[j] for j in range(N) if j != i), key=number) + margin)
    return total / N


def code_infonce(h1, h2, tau: float, u: float | None = None) -> torch.Tensor:
    total = 0.0
    for i in range(N):
        logits = [dot(h1[i], h2[j]) / tau for j in range(N)]
        if u is not None:  # arccon: cos(θ_ii + u) on the diagonal
            logits[i] = torch.cos(torch.arccos(dot(h1[i], h2[i])) + u) / tau
        total = total - (logits[i] - torch.logsumexp(torch.stack(logits), dim=0))
    return total / N


# --------------------------------------------------------------------------- the comparison
def gradients(value_of, z1: torch.Tensor, z2: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    x1, x2 = z1.clone().requires_grad_(), z2.clone().requires_grad_()
    value = value_of(x1, x2)
    g1, g2 = torch.autograd.grad(value, (x1, x2))
    return value.detach(), g1, g2


def assert_same_gradient(name: str, fields: dict, code, h1: torch.Tensor, h2: torch.Tensor) -> None:
    """Autograd of sentemb's reference form and of the code's computation (on the normalised inputs) agree on
    every row of both views, up to one positive constant shared by all rows, which must be 1."""
    loss = build(name, convention="reference", **fields)
    ours = gradients(lambda a, b: loss(a, b).loss, h1, h2)
    theirs = gradients(lambda a, b: code(F.normalize(a, dim=1), F.normalize(b, dim=1)), h1, h2)
    ours_grad, theirs_grad = torch.cat(ours[1:]), torch.cat(theirs[1:])
    assert theirs_grad.abs().max() > 1e-6, "degenerate test case: the gradient vanishes"
    constant = float((ours_grad * theirs_grad).sum() / (theirs_grad * theirs_grad).sum())
    assert constant == pytest.approx(1.0, abs=TOLERANCE)
    torch.testing.assert_close(
        ours_grad, constant * theirs_grad, rtol=TOLERANCE, atol=TOLERANCE * theirs_grad.abs().max()
    )
    # the values too: the same sums in another order
    assert float(ours[0]) == pytest.approx(float(theirs[0]), rel=TOLERANCE, abs=TOLERANCE)


@pytest.mark.parametrize(
    "flags, fields, code_kwargs",
    [
        ("mhe", {"gd": "none", "nu": 10.0}, {"gd": False, "w_w": False, "w_r": False, "lam": 10.0}),
        ("mhe.w_gd", {"gd": "margin", "nu": 1.0}, {"gd": True, "w_w": False, "w_r": False, "lam": 1.0}),
    ],
)
def test_align_mhe_is_the_codes_mhe(flags, fields, code_kwargs):
    h1, h2 = views(1)
    m = mixed_same_view_margin(h1, h2)
    code = lambda a, b: code_mhe(a, b, m=m, tau=1.0, r=1.0, **code_kwargs)  # noqa: E731
    assert_same_gradient("align_mhe", {**fields, "m": m}, code, h1, h2)


@pytest.mark.parametrize(
    "flags, fields, code_kwargs",
    [
        ("mhe.w_gd.w_w.w_r", {"r": 1.75}, {"gd": True, "w_r": True}),
        ("mhe.w_gd.w_w", {"r": "original"}, {"gd": True, "w_r": False}),
        ("mhe.w_w.w_r", {"r": 1.25, "gd": "none"}, {"gd": False, "w_r": True}),
    ],
)
def test_mmhe_is_the_codes_mhe(flags, fields, code_kwargs):
    h1, h2 = views(2)
    m = mixed_same_view_margin(h1, h2)
    r = fields["r"] if isinstance(fields["r"], float) else 1.0
    code = lambda a, b: code_mhe(a, b, w_w=True, m=m, tau=0.05, lam=1.0, r=r, **code_kwargs)  # noqa: E731
    assert_same_gradient("mmhe", {**fields, "m": m, "tau": 0.05}, code, h1, h2)


@pytest.mark.parametrize(
    "name, fields, code_kwargs",
    [
        ("align_mhs", {"gd": "none"}, {"gd": False, "w_r": False}),  # mhs
        ("align_mhs", {"gd": "margin", "nu": 2.0}, {"gd": True, "w_r": False, "lam": 2.0}),  # mhs.w_gd
        ("mmhs", {"r": 1.75}, {"gd": True, "w_r": True}),  # mhs.w_gd.w_w.w_r (w_w has no effect on mhs)
        ("mmhs", {"r": "original"}, {"gd": True, "w_r": False}),  # mhs.w_gd
    ],
)
def test_mhs_losses_are_the_codes_mhs(name, fields, code_kwargs):
    h1, h2 = views(3)
    m = mixed_same_view_margin(h1, h2)
    r = fields.get("r") if isinstance(fields.get("r"), float) else 1.0
    code = lambda a, b: code_mhs(a, b, m=m, r=r, **{"lam": 1.0, **code_kwargs})  # noqa: E731
    assert_same_gradient(name, {**fields, "m": m}, code, h1, h2)


@pytest.mark.parametrize("name, kind", [("mvicreg", "vicreg"), ("mbarlow", "barlow")])
@pytest.mark.parametrize(
    "flags, fields, code_kwargs",
    [
        ("w_gd.w_w.w_r", {"r": 1.5}, {"gd": True, "w_w": "exp", "w_r": True}),
        ("w_gd.w_w.w_r power=4", {"r": 1.25, "w": "power", "power": 4.0}, {"gd": True, "w_w": "power", "w_r": True}),
        ("w_gd.w_w", {"r": "original"}, {"gd": True, "w_w": "exp", "w_r": False}),
        ("w_w.w_r lambda=2", {"r": 1.5, "gd": "none", "nu": 2.0}, {"gd": False, "w_w": "exp", "w_r": True, "lam": 2.0}),
    ],
)
def test_mbarlow_mvicreg_are_the_codes_decorrelation(name, kind, flags, fields, code_kwargs):
    h1, h2 = views(4)
    m = mixed_same_view_margin(h1, h2)
    r = fields["r"] if isinstance(fields["r"], float) else 1.0
    kwargs = {"lam": 1.0, "power": fields.get("power", 4.0), **code_kwargs}
    code = lambda a, b: code_decorrelation(a, b, kind, m=m, tau=0.05, r=r, **kwargs)  # noqa: E731
    assert_same_gradient(name, {**fields, "m": m, "tau": 0.05}, code, h1, h2)


@pytest.mark.parametrize("name, kind, nu_field", [("vicreg", "vicreg", "nu1"), ("barlow", "barlow", "nu")])
@pytest.mark.parametrize("gd", ["none", "margin"])
def test_original_barlow_vicreg_are_the_codes_gradient_surrogates(name, kind, nu_field, gd):
    h1, h2 = views(5)
    m = mixed_same_view_margin(h1, h2)
    lam = 30.0  # the scripts' lambda for both
    code = lambda a, b: code_decorrelation(  # noqa: E731
        a, b, kind, gd == "margin", None, False, m=m, tau=1.0, power=4.0, lam=lam, r=1.0
    )
    assert_same_gradient(name, {nu_field: lam, "gd": gd, "m": m}, code, h1, h2)


def cross_view_margin(h1: torch.Tensor, h2: torch.Tensor) -> float:
    """A margin at which rows and columns (the two directions' anchors) are mixed and disagree somewhere."""
    s = (h1 @ h2.T).tolist()
    rows = [s[i][i] - max(s[i][j] for j in range(N) if j != i) for i in range(N)]
    cols = [s[j][j] - max(s[i][j] for i in range(N) if i != j) for j in range(N)]
    m = sorted(rows + cols)[N]
    d1, d2 = [g < m for g in rows], [g < m for g in cols]
    assert 0 < sum(d1) < N and 0 < sum(d2) < N and d1 != d2
    return m


@pytest.mark.parametrize(
    "flags, fields, code_kwargs",
    [
        ("sg.w_gd", {"r": 1.0}, {"gd": True, "r": 1.0}),
        ("sg.w_gd ratio=2", {"r": 2.0}, {"gd": True, "r": 2.0}),
        ("sg", {"gd": "none", "r": 1.5}, {"gd": False, "r": 1.5}),
        ("sg.w_gd power=2", {"w": "power", "power": 2.0, "r": 1.5}, {"gd": True, "r": 1.5, "power": 2.0}),
        ("sg.w_gd power=0", {"w": "uniform", "r": 1.0}, {"gd": True, "r": 1.0, "power": 0.0}),
    ],
)
def test_paradigm_is_the_codes_sg_loss(flags, fields, code_kwargs):
    h1, h2 = views(6)
    m = cross_view_margin(h1, h2)
    code = lambda a, b: code_sg(a, b, m=m, tau=0.05, **code_kwargs)  # noqa: E731
    assert_same_gradient("paradigm", {**fields, "m": m, "tau": 0.05}, code, h1, h2)


@pytest.mark.parametrize(
    "name, fields, code",
    [
        ("infonce", {}, lambda a, b: code_infonce(a, b, 0.05)),
        ("arccon", {}, lambda a, b: code_infonce(a, b, 0.05, u=math.pi / 18)),
        ("mpt", {"m": 0.23}, lambda a, b: code_triplet(a, b, "mpt", 0.23)),
        ("met", {"m": 0.45}, lambda a, b: code_triplet(a, b, "met", 0.45)),
        ("mat", {"m": 0.15}, lambda a, b: code_triplet(a, b, "mat", 0.15)),
    ],
)
def test_one_direction_losses_are_the_codes(name, fields, code):
    h1, h2 = views(7)
    assert_same_gradient(name, fields, code, h1, h2)


def test_met_reference_takes_the_codes_clamp_near_duplicates():
    # a positive pair 0.005 apart: inside the code's clamp (2 − 2s < 1e-4) but not inside the paper form's 1e-6
    h1, h2 = views(8)
    h2[0] = F.normalize(h1[0] + 0.005 * h2[0], dim=0)
    assert 2 - 2 * float(h1[0] @ h2[0]) < 1e-4
    m = 1.5  # every triplet active, the near-duplicate's too
    assert_same_gradient("met", {"m": m}, lambda a, b: code_triplet(a, b, "met", m), h1, h2)
    paper = gradients(lambda a, b: build("met", m=m)(a, b).loss, h1, h2)
    reference = gradients(lambda a, b: build("met", m=m, convention="reference")(a, b).loss, h1, h2)
    assert float(paper[0]) != float(reference[0]) and not torch.allclose(paper[1][0], reference[1][0])


def test_reference_forms_differ_from_the_paper_text_where_the_issue_says():
    # the rows where d_i ≠ d'_i: the paper gates h'_i through anchor i's positive term by d_i, the code by d'_i
    h1, h2 = views(2)
    m = mixed_same_view_margin(h1, h2)
    paper = gradients(lambda a, b: build("mmhe", m=m, margin_on="same", symmetric=True)(a, b).loss, h1, h2)
    ours = gradients(lambda a, b: build("mmhe", m=m, convention="reference")(a, b).loss, h1, h2)
    assert not torch.allclose(paper[2], ours[2], rtol=1e-3)


@pytest.mark.parametrize(
    "name, fields, message",
    [
        ("focal", {}, "has no Focal-InfoNCE"),
        ("paradigm", {"gd": "infonce"}, "loss.gd='infonce' has no counterpart"),
        ("paradigm", {"w": "hardest"}, "loss.w='hardest' has no counterpart"),
        ("paradigm", {"r": "arccon"}, "loss.r='arccon' has no counterpart"),
        ("mbarlow", {"w_norm": "row"}, "loss.w_norm='row' has no counterpart"),
        ("barlow", {"standardize": True}, "no batch standardisation"),
        ("vicreg", {"nu2": 2.0}, "no variance hinge"),
        ("mmhe", {"symmetric": True}, "loss.symmetric=true with loss.convention=reference"),
    ],
)
def test_settings_the_code_does_not_have_are_refused_under_reference(name, fields, message):
    with pytest.raises(SentembConfigError, match=message):
        build(name, convention="reference", **fields)


def test_nu_belongs_to_the_reference_convention_of_the_modified_losses():
    with pytest.raises(SentembConfigError, match="loss.nu=2.0: nu is the public code's lambda"):
        build("mmhe", nu=2.0)
    with pytest.raises(SentembConfigError, match="loss.convention='code' is not one of paper, reference"):
        build("mmhe", convention="code")
