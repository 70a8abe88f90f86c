"""loss=rank_consistency (sentemb/losses/consistency.py), RankCSE's ranking-consistency term: `form: released` against
a loop transcribed from the community release (perceptiveshawty/RankCSE at 17c5226, rankcse/models.py), `form: js`
against scipy's Jensen-Shannon distance and the closed form, the finding that the released arithmetic is an entropy
term, finiteness and precision, refusals before any model loads, and the term inside loss=sum in a real run."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy.spatial.distance import jensenshannon
from torch import nn

from sentemb.common.errors import SentembConfigError
from sentemb.losses import build
from sentemb.losses.inputs import LossInputs
from sentemb.training.checks import prepare_run
from tests.conftest import compose_train
from tests.test_train import run

TOLERANCE = 1e-9
TEMP = 0.05  # run_rankcse.sh: --temp 0.05
N, D = 8, 16


# ---- the release, transcribed (rankcse/models.py at 17c5226)


class Similarity(nn.Module):
    """rankcse/models.py lines 35-46: cosine over the last axis, divided by the temperature."""

    def __init__(self, temp: float) -> None:
        super().__init__()
        self.temp = temp
        self.cos = nn.CosineSimilarity(dim=-1)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return self.cos(x, y) / self.temp


class Divergence(nn.Module):
    """rankcse/models.py lines 48-61: "Jensen-Shannon divergence" as released (beta_ stored, line 56, never read)."""

    def __init__(self, beta_: float) -> None:
        super().__init__()
        self.kl = nn.KLDivLoss(reduction="batchmean", log_target=True)
        self.eps = 1e-7
        self.beta_ = beta_

    def forward(self, p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
        p, q = p.view(-1, p.size(-1)), q.view(-1, q.size(-1))
        m = (0.5 * (p + q)).log().clamp(min=self.eps)
        return 0.5 * (self.kl(m, p.log()) + self.kl(m, q.log()))


def released_sd_loss(z1: torch.Tensor, z2: torch.Tensor) -> torch.Tensor:
    """rankcse/models.py lines 264 and 289-291 (cl_forward, no hard negative): the two views' lists and sd_loss."""
    sim, div = Similarity(TEMP), Divergence(beta_=1.0)
    cos_sim = sim(z1.unsqueeze(1), z2.unsqueeze(0))
    z1_z2_cos = cos_sim.clone()
    z2_z1_cos = sim(z2.unsqueeze(1), z1.unsqueeze(0))
    return div(z1_z2_cos.softmax(dim=-1).clamp(min=1e-7), z2_z1_cos.softmax(dim=-1).clamp(min=1e-7))


# ---- helpers


def views(seed: int = 0, spread: float = 1.0, n: int = N) -> tuple[torch.Tensor, torch.Tensor]:
    """Two float64 views with gradients; `spread` < 1 pulls every row towards one direction (cosines close)."""
    gen = torch.Generator().manual_seed(seed)
    base = torch.randn(1, D, generator=gen, dtype=torch.float64)
    z1 = base + spread * torch.randn(n, D, generator=gen, dtype=torch.float64)
    z2 = z1 + 0.3 * spread * torch.randn(n, D, generator=gen, dtype=torch.float64)
    return z1.requires_grad_(), z2.detach().requires_grad_()


def lists(z1: torch.Tensor, z2: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """p_i = softmax_j(cos(z1_i, z2_j)/τ), q_i = softmax_j(cos(z2_i, z1_j)/τ), (N, N) each."""
    sim = Similarity(TEMP)
    return sim(z1.unsqueeze(1), z2.unsqueeze(0)).softmax(-1), sim(z2.unsqueeze(1), z1.unsqueeze(0)).softmax(-1)


def max_difference(ours: torch.Tensor, theirs: torch.Tensor, leaves: list[torch.Tensor]) -> float:
    """The largest difference of the values and of every leaf's gradient."""
    mine = torch.autograd.grad(ours, leaves, retain_graph=True)
    reference = torch.autograd.grad(theirs, leaves, retain_graph=True)
    worst = abs(float(ours.detach()) - float(theirs.detach()))
    return max([worst, *(float((a - b).abs().max()) for a, b in zip(mine, reference, strict=True))])


def entropy(p: torch.Tensor) -> torch.Tensor:
    return -(p * p.log()).sum(dim=1)


# ---- (1) released, (2) js


@pytest.mark.parametrize("seed", [0, 1])
def test_released_form_is_the_release_loop(seed):
    z1, z2 = views(seed)
    ours = build("rank_consistency", form="released")(z1, z2).loss
    worst = max_difference(ours, released_sd_loss(z1, z2), [z1, z2])
    print(f"released vs rankcse/models.py: max |difference| {worst:.2e}")
    assert worst < TOLERANCE


def test_js_form_is_scipys_jensen_shannon_and_the_closed_form():
    z1, z2 = views(2)
    ours = build("rank_consistency")(z1, z2).loss.detach()
    p, q = (t.detach().numpy() for t in lists(z1, z2))
    # scipy returns the distance, the square root of the divergence (natural log with base=e)
    scipy_js = np.mean([jensenshannon(p[i], q[i], base=math.e) ** 2 for i in range(N)])
    m = 0.5 * (p + q)
    closed = np.mean(0.5 * (p * np.log(p / m)).sum(1) + 0.5 * (q * np.log(q / m)).sum(1))
    print(f"js vs scipy: {abs(float(ours) - scipy_js):.2e}, vs closed form: {abs(float(ours) - closed):.2e}")
    assert abs(float(ours) - scipy_js) < TOLERANCE and abs(float(ours) - closed) < TOLERANCE
    assert 0 < float(ours) < math.log(2)


def test_js_form_gradient_passes_gradcheck():
    z1, z2 = views(3, n=4)
    loss = build("rank_consistency")
    # fast mode: finite differences along random directions u, v against autograd's vᵀJu (a full Jacobian is ~3 s here)
    assert torch.autograd.gradcheck(lambda a, b: loss(a, b).loss, (z1, z2), eps=1e-6, atol=1e-8, fast_mode=True)


# ---- (3) the finding


def test_the_released_form_is_minus_the_mean_entropy_and_no_divergence():
    # cosines close together: no softmax entry below 1e-7, so the release's clamp of p and q changes nothing
    z1, z2 = views(4, spread=0.3)
    p, q = lists(z1, z2)
    assert float(torch.minimum(p, q).detach().min()) > 1e-7
    released = build("rank_consistency", form="released")(z1, z2).loss
    # m ≡ 1e-7 (a clamped log): Σ p (log p − 1e-7)/N per side, i.e. −½ mean(H(p) + H(q)) − 1e-7
    minus_entropy = -0.5 * (entropy(p) + entropy(q)).mean() - 1e-7
    worst = max_difference(released, minus_entropy, [z1, z2])
    print(f"released vs −½·mean(H(p)+H(q)) − 1e-7: max |difference| {worst:.2e}")
    assert worst < TOLERANCE
    # where the softmax clamp acts (spread-out cosines at τ = 0.05) the same holds of the clamped lists
    z1, z2 = views(5, spread=10.0)
    p, q = (t.clamp(min=1e-7) for t in lists(z1, z2))
    assert float(torch.minimum(p, q).detach().min()) == pytest.approx(1e-7)
    clamped = -0.5 * (entropy(p) + entropy(q)).mean() - 0.5e-7 * (p.sum() + q.sum()) / N
    assert max_difference(build("rank_consistency", form="released")(z1, z2).loss, clamped, [z1, z2]) < TOLERANCE


def test_js_is_zero_for_equal_views_and_the_released_form_is_not():
    z1, _ = views(6)
    same = z1.detach().clone().requires_grad_()
    js = build("rank_consistency")(z1, same)
    released = build("rank_consistency", form="released")(z1, same).loss
    assert abs(js.loss.item()) < 1e-12  # p_i = q_i: cos(z1, z2ᵀ) is symmetric
    grads = torch.autograd.grad(js.loss, [z1, same])
    assert max(float(g.abs().max()) for g in grads) < 1e-12
    # the released value is minus the lists' mean entropy, far from 0, and it still pushes the views
    assert released.item() == pytest.approx(-js.stats["entropy"] - 1e-7, abs=1e-6)
    assert released.item() < -0.1
    assert float(torch.autograd.grad(released, [z1])[0].abs().max()) > 1e-3


# ---- (4) finiteness, precision, what it reads


@pytest.mark.parametrize("form", ["js", "released"])
def test_finite_for_duplicates_identical_views_and_cos_one(form):
    base = 3.0 * torch.eye(16)[:4]
    cases = {
        "duplicated rows": (base.repeat(2, 1), base.repeat(2, 1) + 0.01),
        "identical views (cos = 1)": (base.repeat(2, 1), base.repeat(2, 1)),
        "opposite views (cos = -1)": (base.repeat(2, 1), -base.repeat(2, 1)),
        "every row the same": (torch.ones(8, 16), torch.ones(8, 16)),
        "one-hot lists (τ = 1e-3)": (torch.eye(8, 16), torch.eye(8, 16)),
    }
    for case, (z1, z2) in cases.items():
        z1, z2 = z1.clone().requires_grad_(), z2.clone().requires_grad_()
        loss = build("rank_consistency", form=form, tau=1e-3 if "τ" in case else 0.05)
        out = loss(z1, z2)
        out.loss.backward()
        assert torch.isfinite(out.loss), case
        assert torch.isfinite(z1.grad).all() and torch.isfinite(z2.grad).all(), case
        assert all(math.isfinite(v) for v in out.stats.values()), case


@pytest.mark.parametrize("form", ["js", "released"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_autocast_gives_a_float32_loss(form, dtype):
    gen = torch.Generator().manual_seed(7)
    z1 = torch.randn(8, 16, generator=gen).to(dtype).requires_grad_()
    z2 = torch.randn(8, 16, generator=gen).to(dtype)
    with torch.autocast("cpu", dtype=dtype):
        out = build("rank_consistency", form=form)(z1, z2)
    out.loss.backward()
    assert out.loss.dtype == torch.float32 and torch.isfinite(out.loss) and torch.isfinite(z1.grad.float()).all()
    exact = build("rank_consistency", form=form)(z1.detach().float(), z2.float()).loss
    assert out.loss.item() == pytest.approx(float(exact), abs=1e-6)


def test_it_reads_anchors_and_positives_only():
    z1, z2 = views(8)
    loss = build("rank_consistency")
    plain = loss(z1, z2).loss
    hard = torch.randn(N, D, dtype=torch.float64)
    with_hard = loss(LossInputs(anchors=z1, positives=z2, hard_negatives=(hard,), absent=torch.zeros(N, 1).bool()))
    assert with_hard.loss.item() == plain.item()  # the hard negatives are in neither list
    one = loss(z1[:1], z2[:1]).loss  # a trailing batch of one row: nothing to rank
    assert one.item() == 0.0
    with pytest.raises(SentembConfigError, match="takes no extra negatives.*neither view"):
        loss(z1, z2, torch.randn(3, D, dtype=torch.float64))


# ---- (5) refusals


@pytest.mark.parametrize("field, value", [("tau", 0), ("tau", -0.05), ("form", "jsd"), ("convention", "reference")])
def test_bad_options_are_refused_naming_the_key(field, value):
    with pytest.raises(SentembConfigError, match=rf"loss\.{field}.*Fix"):
        build("rank_consistency", **{field: value})


@pytest.mark.parametrize(
    "overrides, key",
    [
        (["loss=rank_consistency", "loss.tau=0"], r"loss\.tau"),
        (["loss=rank_consistency", "loss.form=paper"], r"loss\.form"),
        (
            ["loss=sum", "loss.terms={infonce: {weight: 1.0}, rank_consistency: {weight: 1.0, form: jsd}}"],
            r"loss\.terms\.rank_consistency: loss\.form",
        ),
        (["loss=rank_consistency", "negatives=momentum"], r"loss=rank_consistency takes no extra negatives"),
    ],
)
def test_bad_options_are_refused_before_any_model_loads(overrides, key, forbid_model_loading, tmp_path):
    with pytest.raises(SentembConfigError, match=rf"{key}.*Fix"):
        prepare_run(compose_train(["model=tiny", *overrides], tmp_path))


# ---- (6) in a sum, in a real run


def test_it_trains_beside_infonce_in_a_sum(tiny_overrides, tmp_path):
    terms = "loss.terms={infonce: {weight: 1.0}, rank_consistency: {weight: 1.0}}"
    run([*tiny_overrides, "loss=sum", terms, "trainer.max_steps=2", "eval.every_n_steps=2"], tmp_path)
    header = next((tmp_path / "csv").rglob("metrics.csv")).read_text().splitlines()[0].split(",")
    assert {"train/loss/infonce", "train/loss/rank_consistency", "paradigm/rank_consistency/jsd"} <= set(header)


RANKCSE_TINY = "experiment=rankcse/listnet_tiny"
RELEASED = "loss.terms.rank_consistency.form=released"  # the community release's arithmetic instead of the paper's


def test_the_rankcse_presets_carry_the_term_and_take_the_released_form(tmp_path, forbid_model_loading):
    preset = compose_train([RANKCSE_TINY], tmp_path)
    term = preset.loss.terms.rank_consistency
    assert (term.weight, term.tau, term.form) == (1.0, 0.05, "js")  # --beta_ 1.0, --temp 0.05, the paper's JSD
    assert "rank_consistency" in preset.loss.terms and len(preset.loss.terms) == 3  # beside infonce and distill_kl
    cfg = compose_train([RANKCSE_TINY, RELEASED], tmp_path)
    assert cfg.loss.terms.rank_consistency.form == "released"
    prepare_run(cfg)


@pytest.mark.slow  # two MiniLM teachers
def test_it_trains_beside_infonce_and_distill_kl_in_the_rankcse_preset(tiny_overrides, tmp_path):
    overrides = [*tiny_overrides, RANKCSE_TINY, RELEASED, "trainer.max_steps=2", "eval.every_n_steps=2"]
    terms = compose_train(overrides, tmp_path).loss.terms  # infonce, rank_consistency and distill_kl
    run(overrides, tmp_path)
    header = next((tmp_path / "csv").rglob("metrics.csv")).read_text().splitlines()[0].split(",")
    assert len(terms) == 3 and {f"train/loss/{term}" for term in terms} <= set(header)
