"""benchmarks/decoder_step.py (issue 29's `make bench` rows) runs end to end on a tiny decoder.

Each configuration's child runs in this process (the script's own `--child` command line, through a
stand-in for `subprocess.run`): a fresh interpreter per child would add ~10 s of imports each.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import load_benchmark

TINY = ["--hidden=32", "--layers=2", "--heads=2", "--kv-heads=1", "--intermediate=64", "--batch=4"]


@pytest.fixture
def script(monkeypatch, tmp_path):
    """The script, its rows written under tmp_path and its children run in-process (their results kept)."""
    module = load_benchmark("decoder_step")
    monkeypatch.setattr(sys.modules["rows"], "RESULTS", tmp_path / "results")
    children: list[dict[str, Any]] = []

    def run(command: list[str], **kwargs: Any) -> subprocess.CompletedProcess:
        assert command[:2] == [sys.executable, module.__file__]  # the child is this script, as make bench runs it
        assert module.main(command[2:]) == 0
        children.append(json.loads(Path(command[command.index("--result") + 1]).read_text()))
        return subprocess.CompletedProcess(command, 0, "", "")

    monkeypatch.setattr(module.subprocess, "run", run)
    module.children = children
    return module


@pytest.mark.slow  # the whole benchmark on a tiny decoder, ~6 s
def test_the_benchmark_writes_ratio_rows_against_full_fine_tuning_padded(script, tmp_path, capsys):
    out = tmp_path / "decoder_step.md"
    argv = [*TINY, "--rounds=1", "--steps=1", "--warmup=1", "--configs=full_padded,lora_gc", f"--out={out}"]
    assert script.main(argv) == 0

    burn_in, *timed = script.children
    assert burn_in["config"] == "full_padded" and [c["config"] for c in timed] == ["full_padded", "lora_gc"]
    full, lora = timed
    assert full["trainable"] == full["parameters"] and 0 < lora["trainable"] < full["parameters"] / 2
    assert lora["adapter"] and lora["gradient_checkpointing"] and lora["padding_free"] and not full["padding_free"]
    assert full["optimizer_state_mib"] > lora["optimizer_state_mib"] > 0  # AdamW's moments of the trained weights
    # children run in this (xdist worker's) process here: its earlier tests' freed memory can leave the peak at or
    # under the baseline, so only the time is checked for sign; the real runs each get a fresh process
    assert all(c["seconds_per_step"] > 0 and math.isfinite(c["increase_mib"]) for c in timed)

    rows = json.loads((tmp_path / "results" / "decoder_step.json").read_text())
    assert [r["figure"].rsplit(", ", 1)[1] for r in rows] == ["s/step", "peak memory MiB (RSS increase)"]
    for r in rows:
        assert r["anchor"] == "full fine-tuning, padded, same run" and r["passed"] is None
        if r["anchor_value"] > 0:  # one round: the median is that ratio
            assert r["ratio"] == pytest.approx(r["value"] / r["anchor_value"])
        else:  # a memory anchor at or under the baseline has no ratio (in-process children only)
            assert math.isnan(r["ratio"])
    report = out.read_text()
    assert "Tokens/s and MFU on a GPU: not measured here" in report
    assert report.strip() in capsys.readouterr().out


def test_a_configuration_that_did_not_take_effect_stops_the_benchmark():
    script = load_benchmark("decoder_step")
    result = {"config": "lora", "padding_free": True, "gradient_checkpointing": False, "adapter": False}
    with pytest.raises(RuntimeError, match="lora: asked"):
        script.check_configuration({**result, "losses_finite": True})
    script.check_configuration({**result, "adapter": True, "losses_finite": True})
    with pytest.raises(RuntimeError, match="non-finite"):
        script.check_configuration({**result, "adapter": True, "losses_finite": False})


def test_make_bench_runs_it_at_max_length_32_and_padded_vs_padding_free_at_64():
    report = load_benchmark("report")
    entries = {rows: job for script, job, _, rows, _ in report.SCRIPTS if script == "decoder_step.py"}
    assert entries == {
        "decoder_step": [],
        "decoder_step64": ["--max-length", "64", "--configs", "full_padded,full_padding_free"],
    }
