"""`python -m sentemb.analysis simulate`: the paradigm paper's Figures 2–4 from sampled angles."""

from __future__ import annotations

import io
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from tqdm import tqdm

import sentemb.analysis
from sentemb.analysis import OUTPUTS, cell_means, dynamic_ratios, gradient_dissipations, main, softmax_share


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


def test_without_out_each_run_writes_a_new_folder(tmp_path, monkeypatch, capsys):
    written = []

    def fake_simulate(out_dir, grid, batches, seed, overwrite):  # the folder main chose; no minutes of sampling
        sentemb.analysis.check_out_dir(out_dir, overwrite)
        out_dir.mkdir(parents=True)
        for name in OUTPUTS:
            (out_dir / name).write_text(f"run {len(written)}")
        written.append(out_dir)
        return {}

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sentemb.analysis, "simulate", fake_simulate)
    main(["simulate", "--grid", "2"])
    main(["simulate", "--grid", "2"])
    assert written[0] != written[1] and written[0].parent == written[1].parent == Path("outputs/analysis/simulate")
    assert [(written[0] / name).read_text() for name in OUTPUTS] == ["run 0"] * len(OUTPUTS), "not replaced"
    assert f"simulating Figures 2–4 into {written[1]}" in capsys.readouterr().out


def test_an_out_folder_with_earlier_outputs_is_refused_before_any_sampling(tmp_path, capsys):
    earlier = tmp_path / "figure3_hardest_negative_share.png"
    earlier.write_bytes(b"an earlier figure")
    with pytest.raises(SystemExit, match=r"--out .* already holds figure3_hardest_negative_share.png.*--overwrite"):
        main(["simulate", "--out", str(tmp_path), "--grid", "2", "--batches", "1"])
    assert [p.name for p in tmp_path.iterdir()] == [earlier.name] and earlier.read_bytes() == b"an earlier figure"
    assert "simulate:" not in capsys.readouterr().err, "no progress bar: refused before any sampling"


def test_the_progress_bar_counts_every_cell_of_every_quantity():
    bar = tqdm(total=None, file=io.StringIO())
    quantities = gradient_dissipations()
    mu_pos, mu_neg = torch.tensor([0.3, 0.4], dtype=torch.float64), torch.tensor([1.0, 1.1, 1.2], dtype=torch.float64)
    cell_means(quantities, mu_pos, mu_neg, 2, 0, bar)
    assert bar.n == len(quantities) * 2 * 3


@pytest.mark.slow
def test_overwrite_replaces_the_figures_with_a_progress_bar_to_100_percent(tmp_path, capsys):
    earlier = tmp_path / "figure3_hardest_negative_share.png"
    earlier.write_bytes(b"an earlier figure")
    main(["simulate", "--out", str(tmp_path), "--grid", "2", "--batches", "1", "--overwrite"])
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(OUTPUTS)
    assert earlier.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", "replaced by the new figure"
    out = capsys.readouterr()
    assert f"--overwrite: replacing {earlier.name} in {tmp_path}" in out.out
    assert "simulate: 100%" in out.err, "the bar's total is every cell the simulation computes"
