"""eval.select=sickr_dev: SICK-R dev (SICK's trial split) scored beside STS-B dev, and the kept checkpoint its best."""

from __future__ import annotations

import csv
import json
import os
import re
from pathlib import Path

import pytest
import torch
from hydra.utils import instantiate

from sentemb.common.errors import SentembConfigError
from sentemb.common.metric_names import (
    BEST_STEP,
    DEV_SPEARMAN,
    DEV_SPEARMAN_BEST_LOGGED,
    DEV_SPEARMAN_BEST_RESCORED,
    DEV_SPEARMAN_INITIAL,
    SICKR_DEV_PEARSON,
    SICKR_DEV_SPEARMAN,
    SICKR_DEV_SPEARMAN_BEST_LOGGED,
    SICKR_DEV_SPEARMAN_BEST_RESCORED,
    SICKR_DEV_SPEARMAN_FINAL,
    SICKR_DEV_SPEARMAN_INITIAL,
    TEST_SPEARMAN,
    check_metric_name,
    interval_names,
)
from sentemb.train import train
from sentemb.training.callbacks import read_sickr_dev
from tests.conftest import compose_train

SICKR = ["eval.select=sickr_dev"]


@pytest.mark.skipif(not os.environ.get("SENTEMB_DATA"), reason="SENTEMB_DATA is not set: no SICK file to read")
def test_sickr_dev_is_the_trial_split_of_the_real_file():
    folder = Path(os.environ["SENTEMB_DATA"]) / "senteval" / "downstream"
    pairs = read_sickr_dev(folder)
    lines = (folder / "SICK" / "SICK_trial.txt").read_text(encoding="utf-8").splitlines()
    assert lines[0].split("\t")[:4] == ["pair_ID", "sentence_A", "sentence_B", "relatedness_score"]
    assert len(pairs.gold) == len(pairs.first) == len(pairs.second) == len(lines) - 1 == 500
    assert 1.0 <= pairs.gold.min() and pairs.gold.max() <= 5.0  # SICK's relatedness scale


def test_the_monitor_follows_eval_select(tmp_path):
    assert instantiate(compose_train([], tmp_path).callbacks.model_checkpoint).monitor == DEV_SPEARMAN
    cfg = compose_train([*SICKR, f"optimized_metric={SICKR_DEV_SPEARMAN_BEST_LOGGED}"], tmp_path)
    assert instantiate(cfg.callbacks.model_checkpoint).monitor == SICKR_DEV_SPEARMAN
    assert check_metric_name(cfg.optimized_metric) == SICKR_DEV_SPEARMAN_BEST_LOGGED, "a sweep may optimise it"
    # a metric's own name still monitors that metric
    cfg = compose_train(["callbacks.model_checkpoint.monitor=stsb/dev/pearson"], tmp_path)
    assert instantiate(cfg.callbacks.model_checkpoint).monitor == "stsb/dev/pearson"


def refused(overrides: list[str], tmp_path: Path) -> str:
    with pytest.raises(SentembConfigError) as err:
        train(compose_train(["model=tiny", "logger=csv", *overrides], output_dir=tmp_path))
    return str(err.value)


@pytest.mark.usefixtures("forbid_model_loading")
@pytest.mark.parametrize("value", ["sick_dev", "stsb_test"])
def test_a_bad_select_is_refused_before_any_model_loads(value, tmp_path):
    message = refused([f"eval.select={value}"], tmp_path)
    assert f"eval.select={value}" in message and "Fix: eval.select=stsb_dev" in message
    assert "eval.select=sickr_dev" in message


@pytest.mark.usefixtures("forbid_model_loading")
@pytest.mark.parametrize("content", [None, "", "pair_ID\tsentence_A\tsentence_B\trelatedness_score\n"])
def test_a_missing_or_empty_trial_file_is_refused_before_any_model_loads(content, tmp_path):
    senteval = tmp_path / "senteval"
    trial = senteval / "SICK" / "SICK_trial.txt"
    if content is not None:
        trial.parent.mkdir(parents=True)
        trial.write_text(content, encoding="utf-8")
    message = refused([*SICKR, f"eval.senteval_dir={senteval}"], tmp_path)
    prefix = f"eval.select=sickr_dev (or eval.score_sickr_dev=true) scores SICK-R dev, {trial}:"
    assert message.startswith(prefix) and "Fix:" in message
    assert ("does not exist" if content is None else "no scored sentence pair") in message
    assert "eval.select=stsb_dev" in message


def test_selecting_on_sickr_dev_keeps_its_best_and_reports_it(cli, tiny_overrides, tmp_path, capsys):
    cli([*tiny_overrides, *SICKR, "eval.at_start=true", f"hydra.run.dir={tmp_path}"])
    record = json.loads((tmp_path / "metrics.json").read_text(encoding="utf-8"))
    assert record["status"] == "ok"
    metrics = record["metrics"]
    rows = list(csv.DictReader((tmp_path / "csv" / "version_0" / "metrics.csv").open()))

    def logged(name: str) -> dict[int, float]:
        return {int(r["step"]): float(r[name]) for r in rows if r.get(name)}

    # both dev sets at every evaluation (and before the first step), each with its running best
    sickr, stsb = logged(SICKR_DEV_SPEARMAN), logged(DEV_SPEARMAN)
    assert sorted(sickr) == sorted(stsb) == [2, 4]
    assert sorted(logged(SICKR_DEV_PEARSON)) == [2, 4]
    assert sorted(logged(SICKR_DEV_SPEARMAN_INITIAL)) == sorted(logged(DEV_SPEARMAN_INITIAL)) == [0]
    assert logged(SICKR_DEV_SPEARMAN_BEST_LOGGED) == {2: sickr[2], 4: max(sickr.values())}

    # the kept checkpoint is SICK-R dev's best: ModelCheckpoint monitored it, and its rescoring repeats the log
    best_step = max(sickr, key=sickr.get)
    assert metrics[BEST_STEP] == best_step and metrics["selected_on"] == "sickr_dev"
    assert Path(metrics["best_checkpoint"]) == tmp_path / "checkpoints" / f"best-step{best_step}.ckpt"
    states = torch.load(metrics["best_checkpoint"], weights_only=True)["callbacks"]
    kept = next(state for key, state in states.items() if key.startswith("ModelCheckpoint"))
    assert kept["monitor"] == SICKR_DEV_SPEARMAN and float(kept["best_model_score"]) == sickr[best_step]
    assert metrics[SICKR_DEV_SPEARMAN_BEST_RESCORED] == metrics[SICKR_DEV_SPEARMAN_BEST_LOGGED] == sickr[best_step]
    assert metrics[DEV_SPEARMAN_BEST_LOGGED] == max(stsb.values())
    # STS-B dev and test of the kept weights, SICK-R dev's, each with its interval
    for name in (SICKR_DEV_SPEARMAN_BEST_RESCORED, DEV_SPEARMAN_BEST_RESCORED, TEST_SPEARMAN):
        low, high = (metrics[bound] for bound in interval_names(name))
        assert low < metrics[name] < high, name
    assert metrics[DEV_SPEARMAN_BEST_RESCORED] == stsb[best_step], "STS-B dev of the kept weights, as logged"

    out = capsys.readouterr().out
    printed = re.search(
        r"SICK-R dev Spearman \(best, step (\d+)\): (\S+) \[(\S+), (\S+)\]   \(logged during training: (\S+)\)", out
    )
    assert printed and int(printed[1]) == best_step and printed[2] == printed[5] == f"{sickr[best_step]:.4f}"
    low, high = (metrics[bound] for bound in interval_names(SICKR_DEV_SPEARMAN_BEST_RESCORED))
    assert (printed[3], printed[4]) == (f"{low:.2f}", f"{high:.2f}")
    assert f"STS-B dev Spearman (step {best_step}): {stsb[best_step]:.4f}" in out
    assert "(selected on SICK-R dev: eval.select=sickr_dev)" in out


def test_on_stsb_dev_nothing_of_sickr_is_read_scored_or_recorded(tiny_overrides, tmp_path, capsys, monkeypatch):
    import sentemb.training.callbacks

    def unread(*args):
        raise AssertionError("SICK-R dev was read under eval.select=stsb_dev")

    monkeypatch.setattr(sentemb.training.callbacks, "read_sickr_dev", unread)
    metrics = train(compose_train(tiny_overrides, output_dir=tmp_path))
    assert metrics["selected_on"] == "stsb_dev" and not [name for name in metrics if name.startswith("sickr/")]
    assert metrics[DEV_SPEARMAN_BEST_RESCORED] == metrics[DEV_SPEARMAN_BEST_LOGGED]
    out = capsys.readouterr().out
    assert f"STS-B dev Spearman (best, step {metrics[BEST_STEP]}): " in out and "SICK-R" not in out
    assert "(selected on STS-B dev: eval.select=stsb_dev)" in out


@pytest.mark.slow  # a training run (make test-slow)
def test_without_a_kept_checkpoint_both_dev_sets_of_the_final_weights_are_scored(tiny_overrides, tmp_path, capsys):
    metrics = train(compose_train([*tiny_overrides, *SICKR, "callbacks=none"], output_dir=tmp_path))
    rows = list(csv.DictReader((tmp_path / "csv" / "version_0" / "metrics.csv").open()))
    sickr = {int(r["step"]): float(r[SICKR_DEV_SPEARMAN]) for r in rows if r.get(SICKR_DEV_SPEARMAN)}
    assert metrics["scored_weights"] == "final" and metrics[SICKR_DEV_SPEARMAN_FINAL] == sickr[4]
    assert metrics[SICKR_DEV_SPEARMAN_BEST_LOGGED] == max(sickr.values())
    assert all(bound in metrics for bound in interval_names(SICKR_DEV_SPEARMAN_FINAL))
    out = capsys.readouterr().out
    assert f"SICK-R dev Spearman (final weights, step 4): {sickr[4]:.4f}" in out
    assert f"no ModelCheckpoint monitors {SICKR_DEV_SPEARMAN}" in out


def test_scoring_sickr_dev_beside_stsb_dev_keeps_the_stsb_checkpoint_and_scores_it_on_sickr(tiny_overrides, tmp_path):
    """HiCL A.4's footnote: each run's checkpoint picked on STS-B dev, its SICK-R dev score ranking the sweep."""
    metrics = train(compose_train([*tiny_overrides, "eval.score_sickr_dev=true"], output_dir=tmp_path))
    rows = list(csv.DictReader((tmp_path / "csv" / "version_0" / "metrics.csv").open()))
    stsb = {int(r["step"]): float(r[DEV_SPEARMAN]) for r in rows if r.get(DEV_SPEARMAN)}
    sickr = {int(r["step"]): float(r[SICKR_DEV_SPEARMAN]) for r in rows if r.get(SICKR_DEV_SPEARMAN)}
    assert sorted(sickr) == sorted(stsb), "SICK-R dev is scored at every evaluation"
    assert metrics["selected_on"] == "stsb_dev" and metrics[BEST_STEP] == max(stsb, key=stsb.get)
    # the kept (STS-B dev) checkpoint rescored on SICK-R dev: the same weights and pairs as the logged evaluation
    assert metrics[SICKR_DEV_SPEARMAN_BEST_RESCORED] == sickr[metrics[BEST_STEP]]
    check_metric_name(SICKR_DEV_SPEARMAN_BEST_RESCORED)  # a sweep may rank on it (hparams_search=hicl_table13)


SICK_HEADER = "pair_ID\tsentence_A\tsentence_B\trelatedness_score\tentailment_judgment\n"
NO_SPEARMAN = [([3.2], "1 scored sentence pair(s); a correlation needs at least 2"), ([3.2] * 5, "gold scores is 3.2")]


@pytest.mark.usefixtures("forbid_model_loading")
@pytest.mark.parametrize(("golds", "why"), NO_SPEARMAN)
def test_a_trial_split_without_a_spearman_is_refused_before_any_model_loads(golds, why, tmp_path):
    """Issue 51, findings 5 (a constant gold: every SICK-R dev score NaN, a checkpoint "selected" at -inf, status ok)
    and 12 (one pair: past the start check, then scipy's error at the first dev evaluation)."""
    senteval = tmp_path / "senteval"
    trial = senteval / "SICK" / "SICK_trial.txt"
    trial.parent.mkdir(parents=True)
    rows = "".join(f"{i}\tA man plays {i}\tA woman sings {i}\t{gold}\tNEUTRAL\n" for i, gold in enumerate(golds))
    trial.write_text(SICK_HEADER + rows, encoding="utf-8")
    message = refused([*SICKR, f"eval.senteval_dir={senteval}"], tmp_path)
    prefix = f"eval.select=sickr_dev (or eval.score_sickr_dev=true) scores SICK-R dev, {trial}:"
    assert message.startswith(prefix) and why in message and "Fix:" in message


@pytest.mark.usefixtures("forbid_model_loading")
@pytest.mark.parametrize(("golds", "why"), NO_SPEARMAN)
def test_an_stsb_dev_split_without_a_spearman_is_refused_before_any_model_loads(golds, why, small_stsb, tmp_path):
    """The dev set that selects by default, under the same rule as SICK-R dev."""
    dev = small_stsb / "sts-dev.csv"
    dev.write_text("".join(f"g\tf\ty\t{i}\t{gold}\ta {i}\tb {i}\n" for i, gold in enumerate(golds)), encoding="utf-8")
    message = refused([f"eval.stsb_dir={small_stsb}"], tmp_path)
    assert message.startswith(f"{dev}: ") and why in message and "Fix:" in message
