"""The loss study's seed table: each loss against InfoNCE by the paired t-test over shared seeds, Holm over losses."""

from __future__ import annotations

from scipy.stats import ttest_rel

from tests.conftest import load_benchmark

study = load_benchmark("loss_study")


def runs(name: str, dev: list[float], test: list[float]) -> dict:
    return study.aggregate([
        {"loss": name, "seed": seed, "dev": d, "test": t, "telemetry": {}, "seconds": 1.0}
        for seed, d, t in zip([1, 2, 3], dev, test, strict=True)
    ])  # fmt: skip


def test_each_loss_is_tested_against_infonce_over_the_seeds():
    results = {
        "infonce": runs("infonce", [84.6, 84.5, 84.7], [79.0, 79.1, 78.9]),
        "focal": runs("focal", [85.6, 85.4, 85.7], [80.4, 80.2, 80.5]),
        "paradigm": runs("paradigm", [84.7, 84.4, 84.9], [79.0, 79.3, 78.9]),
    }
    table = "\n".join(study.versus_anchor(results))
    p_focal = ttest_rel([85.6, 85.4, 85.7], [84.6, 84.5, 84.7]).pvalue
    p_paradigm = ttest_rel([84.7, 84.4, 84.9], [84.6, 84.5, 84.7]).pvalue
    # Holm over the two losses: the smaller p doubled, the larger kept (it is not below the running maximum)
    holm_focal, holm_paradigm = min(1, 2 * p_focal), max(min(1, 2 * p_focal), p_paradigm)
    assert f"p {p_focal:.3g} (Holm {holm_focal:.3g}): separable" in table
    assert f"p {p_paradigm:.3g} (Holm {holm_paradigm:.3g}): not separable" in table
    assert "| infonce | 3 | 84.60 [" in table
    assert study.versus_anchor({"infonce": runs("infonce", [1, 2, 3], [1, 2, 3])}) == []
