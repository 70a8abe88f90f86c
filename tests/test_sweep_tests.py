"""sweep_tests.csv and sweep.md's "vs best": each configuration's paired t-test against the best over the seeds both
ran, recomputed here with scipy.stats.ttest_rel from the jobs' own metrics.json files, Holm by hand."""

from __future__ import annotations

import csv
import json
import math
import statistics
import time
from pathlib import Path

import numpy as np
import pytest
from scipy.stats import t as student_t
from scipy.stats import ttest_rel

from sentemb.common.metric_names import BEST_STEP, DEV_SPEARMAN_BEST_RESCORED, TEST_SPEARMAN, sts_test_metric
from sentemb.runs.record import write_record
from sentemb.runs.sweeps import TESTS_NAME, write_report
from tests.test_sweep import TINY_JOB, sweep

STS16 = "sts/STS16/spearman"
METRICS = (DEV_SPEARMAN_BEST_RESCORED, TEST_SPEARMAN, STS16)  # the ranked dev score, then Holm's family
TASKS = METRICS[1:]

# loss → seed → (best dev, STS-B test, STS16 test). infonce is best; mmhe (rank 2) is not separable on dev;
# focal (rank 4) is on dev (p ≈ 2e-4), its STS-B test p ≈ 0.038 is below 0.05 but Holm's 2 × 0.038 is not, STS16
# p ≈ 0.37; mbarlow (rank 3) ran one seed
SCORES = {
    "infonce": {1: (80.0, 75.0, 70.0), 2: (81.0, 76.5, 71.0), 3: (82.0, 77.0, 72.5)},
    "focal": {1: (76.0, 73.0, 69.0), 2: (77.1, 73.8, 71.5), 3: (77.9, 75.7, 70.5)},
    "mmhe": {1: (79.5, 75.2, 70.5), 2: (81.8, 75.9, 70.4), 3: (81.2, 77.5, 72.9)},
    "mbarlow": {1: (78.5, 74.0, 69.0)},
}


def fake_sweep(directory: Path, scores: dict[str, dict[int, tuple[float, float, float]]]) -> None:
    """A `loss=... seed=...` multirun's records as its jobs leave them, without training."""
    jobs = [(loss, seed, values) for loss, by_seed in scores.items() for seed, values in by_seed.items()]
    for number, (loss, seed, values) in enumerate(jobs):
        metrics = {**dict(zip(METRICS, values, strict=True)), BEST_STEP: 10}
        write_record(directory / str(number), {"status": "ok", "message": "", "metrics": metrics,
                     "overrides": [f"loss={loss}", f"seed={seed}"], "swept": {"loss": loss, "seed": str(seed)},
                     "seed": seed})  # fmt: skip


def recorded(directory: Path) -> dict[str, dict[int, dict[str, float]]]:
    """loss → seed → metrics, read back from every job's metrics.json."""
    out: dict[str, dict[int, dict[str, float]]] = {}
    for path in directory.glob("*/metrics.json"):
        record = json.loads(path.read_text())
        out.setdefault(record["swept"]["loss"], {})[record["seed"]] = record["metrics"]
    return out


def holm_by_hand(p_values: list[float]) -> list[float]:
    """Holm's step-down: the k-th smallest of m defined p's times (m − k + 1), running maximum, capped at 1."""
    order = sorted((p, i) for i, p in enumerate(p_values) if not math.isnan(p))
    adjusted, running = [math.nan] * len(p_values), 0.0
    for k, (p, i) in enumerate(order):
        running = max(running, min(1.0, (len(order) - k) * p))
        adjusted[i] = running
    return adjusted


def expected_tests(jobs: dict[str, dict[int, dict[str, float]]], best: str) -> dict[tuple[str, str], dict]:
    """(loss, metric) → what sweep_tests.csv should say, from the records alone."""
    out = {}
    for loss, by_seed in jobs.items():
        for metric in METRICS:
            scores = {seed: m[metric] for seed, m in by_seed.items()}
            reference = {seed: m[metric] for seed, m in jobs[best].items()}
            shared = sorted(set(scores) & set(reference)) if loss != best else sorted(scores)
            a, b = [scores[s] for s in shared], [reference[s] for s in shared]
            if loss == best:
                difference, t, p = 0.0, math.nan, math.nan
            elif len(shared) < 2:
                difference = float((np.array(a) - np.array(b)).mean()) if shared else math.nan
                t, p = math.nan, math.nan
            else:
                equal = a == b  # paired_t_test's rule for ttest_rel's 0/0: no difference, p = 1
                difference = float((np.array(a) - np.array(b)).mean())
                result = None if equal else ttest_rel(a, b)
                t, p = (0.0, 1.0) if result is None else (float(result.statistic), float(result.pvalue))
            out[loss, metric] = {"scores": scores, "difference": difference, "shared": len(shared), "t": t, "p": p}
        family = [out[loss, metric] for metric in TASKS]
        for row, adjusted in zip(family, holm_by_hand([row["p"] for row in family]), strict=True):
            row["p_holm"] = adjusted
        out[loss, METRICS[0]]["p_holm"] = out[loss, METRICS[0]]["p"]  # the ranked score: a family of its own
        for metric in METRICS:
            row = out[loss, metric]
            verdict = "" if math.isnan(row["p_holm"]) else str(row["p_holm"] < 0.05)  # "": no test
            row["separable"] = "best" if loss == best else verdict
    return out


def same(value: str, expected: float) -> bool:
    """A CSV float (written with repr) against the same computation's float: equal, or both nan."""
    return (math.isnan(float(value)) and math.isnan(expected)) or float(value) == expected


def check_tests_csv(sweep_dir: Path, best: str) -> dict[tuple[str, str], dict]:
    """Every row of sweep_tests.csv against the records' own numbers; returns what was expected."""
    expected = expected_tests(recorded(sweep_dir), best)
    rows = list(csv.DictReader((sweep_dir / TESTS_NAME).open(newline="")))
    assert {(r["loss"], r["metric"]) for r in rows} == set(expected) and len(rows) == len(expected)
    for row in rows:
        want = expected[row["loss"], row["metric"]]
        values = list(want["scores"].values())
        where = (row["loss"], row["metric"])
        assert (int(row["n"]), row["seeds"]) == (len(values), " ".join(map(str, sorted(want["scores"])))), where
        # fmean against numpy's mean, and statistics.stdev over another order of the seeds: last-bit differences
        assert float(row["mean"]) == pytest.approx(statistics.fmean(values), rel=1e-12), where
        if len(values) > 1:
            assert float(row["std"]) == pytest.approx(statistics.stdev(values), rel=1e-12), where
            # scipy's t.interval against the mean ± t·s/√n the report computes: the same formula, another order
            sem = statistics.stdev(values) / math.sqrt(len(values))
            low, high = student_t.interval(0.95, len(values) - 1, np.mean(values), sem)
            assert (float(row["ci_low"]), float(row["ci_high"])) == pytest.approx((low, high), rel=1e-12), where
        else:
            assert [row[c] for c in ("std", "ci_low", "ci_high")] == ["nan"] * 3, where
        assert int(row["shared_seeds"]) == want["shared"], where
        # the same numpy and scipy computations on the same floats (JSON and CSV keep every bit), and Holm's same
        # products (m − k + 1)·p and maxima as statsmodels': exactly equal
        assert same(row["difference_to_best"], want["difference"]), (where, row["difference_to_best"])
        assert same(row["t"], want["t"]), (where, row["t"], want["t"])
        assert same(row["p"], want["p"]), (where, row["p"], want["p"])
        assert same(row["p_holm"], want["p_holm"]), (where, row["p_holm"], want["p_holm"])
        assert row["separable"] == want["separable"], (where, row)
        assert (int(row["rank"]) == 1) == (row["loss"] == best), where
    return expected


def vs_best_column(markdown: str) -> dict[str, str]:
    """sweep.md's table: loss → its "vs best" cell."""
    table = [line for line in markdown.splitlines() if line.startswith("| ") and line.split("|")[1].strip().isdigit()]
    return {cells[2].strip(): cells[-2].strip() for cells in (line.split("|") for line in table)}


def test_sweep_tests_csv_and_vs_best_match_ttest_rel_and_holm_recomputed_from_the_records(tmp_path):
    """Guards every number of sweep_tests.csv, the separable verdicts and sweep.md's "vs best" column and notes."""
    fake_sweep(tmp_path, SCORES)
    markdown = write_report(tmp_path)["markdown"]
    assert markdown == (tmp_path / "sweep.md").read_text()
    expected = check_tests_csv(tmp_path, best="infonce")

    ranks = {r["loss"]: int(r["rank"]) for r in csv.DictReader((tmp_path / TESTS_NAME).open(newline=""))}
    assert ranks == {"infonce": 1, "mmhe": 2, "mbarlow": 3, "focal": 4}
    # the verdicts the numbers were chosen for
    dev, test, sts16 = (expected["focal", m] for m in METRICS)
    assert dev["separable"] == "True" and dev["p_holm"] == dev["p"] and dev["p"] < 1e-3
    assert test["p"] < 0.05 < test["p_holm"] and test["separable"] == "False", "Holm over 2 tasks undoes it"
    assert sts16["separable"] == "False" and expected["mmhe", METRICS[0]]["separable"] == "False"
    assert all(expected["mbarlow", m]["separable"] == "" for m in METRICS), "one seed: no test"

    p = {loss: expected[loss, METRICS[0]]["p"] for loss in ("focal", "mmhe")}
    assert vs_best_column(markdown) == {
        "infonce": "best",
        "mmhe": f"**not separable** (p {p['mmhe']:.3g})",
        "mbarlow": "single seed: no test",
        "focal": f"separable (p {p['focal']:.3g})",
    }
    lines = markdown.splitlines()
    assert "Not separable from the best: rank 2." in lines
    assert any(line.startswith("Single seed (no test, no seed noise): rank 3. Fix:") for line in lines)


def test_a_configuration_is_tested_on_the_seeds_it_shares_with_the_best_only(tmp_path):
    """Guards the pairing by seed: seeds 2,3,4 against the best's 1,2,3 test seeds 2 and 3; one shared seed: no test."""
    scores = {
        "infonce": {1: (82.0, 77.0, 71.0), 2: (83.0, 78.5, 72.0), 3: (84.0, 78.0, 73.5)},
        "focal": {2: (80.0, 76.0, 70.0), 3: (81.5, 77.2, 72.0), 4: (79.0, 74.0, 69.0)},
        "mmhe": {3: (78.0, 75.0, 70.0), 4: (79.0, 75.5, 70.5), 5: (77.0, 74.5, 69.5)},
    }
    fake_sweep(tmp_path, scores)
    markdown = write_report(tmp_path)["markdown"]
    expected = check_tests_csv(tmp_path, best="infonce")
    focal = expected["focal", METRICS[0]]
    assert (focal["shared"], focal["p"]) == (2, float(ttest_rel([80.0, 81.5], [83.0, 84.0]).pvalue))
    assert focal["difference"] == pytest.approx(-2.75, rel=1e-12)  # (−3 − 2.5)/2 in floats: exact up to rounding
    assert expected["mmhe", METRICS[0]]["shared"] == 1 and math.isnan(expected["mmhe", METRICS[0]]["p"])
    column = vs_best_column(markdown)
    assert column["mmhe"] == "1 shared seed(s): no test"
    assert column["focal"].endswith(f"(p {focal['p']:.3g})")


def test_a_repeated_seed_or_a_constant_offset_gets_no_test_and_says_why(tmp_path):
    """Guards two cases ttest_rel would get wrong: a seed run twice (no pairing) and no seed variance (t = ±inf)."""
    scores = {
        "infonce": {1: (82.0, 77.0, 71.0), 2: (83.0, 78.5, 72.0), 3: (84.0, 78.0, 73.5)},
        "paradigm": {1: (81.0, 76.0, 70.0), 2: (82.0, 77.4, 71.0), 3: (83.0, 77.1, 72.6)},  # dev: 1.0 below, each seed
    }
    fake_sweep(tmp_path, scores)
    focal = [(1, 80.0), (1, 80.5), (2, 79.0)]  # seed 1 twice: two jobs of the same values and seed
    for number, (seed, dev) in enumerate(focal, start=10):
        write_record(tmp_path / str(number), {"status": "ok", "message": "",
                     "metrics": {METRICS[0]: dev, METRICS[1]: dev - 5, METRICS[2]: dev - 10, BEST_STEP: 10},
                     "overrides": ["loss=focal", f"seed={seed}"], "swept": {"loss": "focal", "seed": str(seed)},
                     "seed": seed})  # fmt: skip
    result = write_report(tmp_path)
    rows = {(r["loss"], r["metric"]): r for r in csv.DictReader((tmp_path / TESTS_NAME).open())}
    constant = rows["paradigm", METRICS[0]]
    assert (constant["p"], constant["separable"]) == ("nan", "") and float(constant["difference_to_best"]) == -1.0
    assert constant["note"] == "the same difference on every seed: no seed variance, no t-test"
    assert rows["paradigm", METRICS[1]]["note"] == ""  # test scores vary: tested
    repeated = rows["focal", METRICS[0]]
    assert (repeated["n"], repeated["p"], repeated["note"]) == ("3", "nan", "seed 1 ran twice in one configuration: "
                                                                "no paired test")  # fmt: skip
    column = vs_best_column(result["markdown"])
    assert column["focal"] == "seed 1 ran twice in one configuration: no paired test"


@pytest.mark.slow  # multi-process run (CLI subprocesses, sweeps): make test-slow
def test_a_real_two_by_three_seed_sweep_writes_the_paired_tests_scipy_gives(
    small_corpus, small_stsb, data_root, tmp_path
):
    """Guards the report a user gets after `-m loss=infonce,focal seed=1,2,3` with STS16 scored: every p and Holm."""
    sweep_dir = tmp_path / "seeds"
    args = [*TINY_JOB, f"data.corpus={small_corpus}", "logger=csv", "loss=infonce,focal", "seed=1,2,3",
            f"eval.stsb_dir={small_stsb}", f"eval.senteval_dir={data_root}/senteval/downstream",
            "eval.test_tasks=[STSBenchmark,STS16]"]  # fmt: skip
    started = time.monotonic()
    result = sweep(args, sweep_dir)
    print(f"2 x 3-seed tiny sweep: {time.monotonic() - started:.1f} s")
    assert "(sweep report in" in result.stdout, "the report ran by itself at the end of the multirun"
    jobs = recorded(sweep_dir)
    assert {loss: sorted(by_seed) for loss, by_seed in jobs.items()} == {"infonce": [1, 2, 3], "focal": [1, 2, 3]}
    assert all(set(METRICS) <= set(m) for by_seed in jobs.values() for m in by_seed.values())
    assert sts_test_metric("STS16") == STS16
    mean_dev = {loss: statistics.fmean(m[METRICS[0]] for m in by_seed.values()) for loss, by_seed in jobs.items()}
    best = max(mean_dev, key=mean_dev.get)
    expected = check_tests_csv(sweep_dir, best=best)
    other = "focal" if best == "infonce" else "infonce"
    assert all(expected[other, m]["shared"] == 3 and not math.isnan(expected[other, m]["p"]) for m in METRICS)
    assert vs_best_column((sweep_dir / "sweep.md").read_text())[best] == "best"
