"""InfoNCE against a naive loop over its definition, and its numerics."""

from __future__ import annotations

import math

import pytest
import torch

from sentemb.errors import SentembConfigError
from sentemb.losses import InfoNCE


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
    assert InfoNCE(temperature=tau)(z1, z2).loss.item() == pytest.approx(naive_infonce(z1, z2, tau), rel=1e-5)


def test_symmetric_averages_both_directions():
    gen = torch.Generator().manual_seed(1)
    z1, z2 = torch.randn(8, 16, generator=gen), torch.randn(8, 16, generator=gen)
    expected = 0.5 * (naive_infonce(z1, z2, 0.05) + naive_infonce(z2, z1, 0.05))
    assert InfoNCE(symmetric=True)(z1, z2).loss.item() == pytest.approx(expected, rel=1e-5)


def test_scale_invariant_because_it_normalises():
    z1, z2 = torch.randn(8, 16), torch.randn(8, 16)
    loss = InfoNCE()
    assert loss(z1, z2).loss.item() == pytest.approx(loss(7.0 * z1, 0.1 * z2).loss.item(), rel=1e-5)


def test_duplicated_sentences_and_identical_views_stay_finite():
    # four orthogonal sentences, each twice in the batch; both views identical (cos = 1)
    z = (3.0 * torch.eye(16)[:4]).repeat(2, 1).requires_grad_()
    out = InfoNCE()(z, z)
    out.loss.backward()
    assert torch.isfinite(out.loss) and torch.isfinite(z.grad).all()
    # each anchor ties with its duplicate; the other six add 6·e^{−1/τ} ≈ 1e-8
    assert out.loss.item() == pytest.approx(math.log(2), rel=1e-6)


def test_similarities_in_float32_under_bf16_autocast():
    z1, z2 = torch.randn(8, 16), torch.randn(8, 16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = InfoNCE()(z1.bfloat16(), z2.bfloat16())
    assert out.loss.dtype == torch.float32 and torch.isfinite(out.loss)


def test_stats_report_positive_and_negative_cosines():
    z = torch.eye(4)
    stats = InfoNCE()(z, z).stats
    assert stats["cos_pos"] == pytest.approx(1.0) and stats["cos_neg"] == pytest.approx(0.0)


@pytest.mark.parametrize("tau", [0.0, -1.0])
def test_rejects_non_positive_temperature(tau):
    with pytest.raises(SentembConfigError, match="loss.temperature"):
        InfoNCE(temperature=tau)
