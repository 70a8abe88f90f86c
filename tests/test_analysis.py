"""`python -m sentemb.analysis simulate`: the paradigm paper's Figures 2–4 from sampled angles."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from sentemb.analysis import cell_means, dynamic_ratios, gradient_dissipations, main, softmax_share


def test_simulate_writes_the_three_figures_and_the_arrays(tmp_path, capsys):
    main(["simulate", "--out", str(tmp_path), "--grid", "6", "--batches", "20"])
    for name in ("figure2_gradient_dissipation.png", "figure3_hardest_negative_share.png", "figure4_dynamic_ratio.png"):
        assert (tmp_path / name).stat().st_size > 10_000
    arrays = np.load(tmp_path / "simulation.npz")
    # linspace's last point is start + 5·step, not π itself: float64 rounding, ~1e-16
    assert arrays["mu_pos"].shape == (6,) and arrays["mu_neg"][-1] == pytest.approx(math.pi, rel=1e-12)
    assert all(arrays[k].shape == (6, 6) for k in arrays.files if k.startswith(("gd:", "ratio:")))
    assert "figure4" in capsys.readouterr().out


def test_gradient_dissipation_is_one_for_close_means_and_zero_for_distant_negatives():
    mu = torch.tensor([math.pi / 6], dtype=torch.float64)
    close_and_far = torch.tensor([math.pi / 6 + 0.05, math.pi], dtype=torch.float64)
    for name, values in cell_means(gradient_dissipations(), mu, close_and_far, 200, 0).items():
        assert values[0, 0] > 0.95, name  # negatives as close as the positive: full gradient
        if not name.startswith("Focal"):  # s(s+m)/τ grows again for cos → −1 (see the figure)
            assert values[0, 1] < 0.01, name


def test_hardest_share_grows_as_the_temperature_falls():
    gen = torch.Generator().manual_seed(0)
    neg = torch.cos(math.pi / 2 + 0.1 * torch.randn(500, 127, generator=gen, dtype=torch.float64))
    shares = [softmax_share(neg / tau).mean().item() for tau in (0.01, 0.05, 0.3, 1.0)]
    assert shares == sorted(shares, reverse=True) and shares[0] > 0.5 and shares[-1] < 2 / 127


def test_dynamic_ratios_exceed_one_where_training_lives():
    mu_pos = torch.tensor([0.3], dtype=torch.float64)
    mu_neg = torch.tensor([1.0], dtype=torch.float64)  # μ_neg > μ_pos within the margin band
    for name, values in cell_means(dynamic_ratios(), mu_pos, mu_neg, 200, 0).items():
        assert 1.0 < values[0, 0] < 3.5, name
