"""benchmarks/onnx_encode.py (issue 30's `make bench` rows): timing, ratios, sanity checks and rows.

The fast tests run the script's main() with stand-in encoders on a stand-in clock (no export, no model):
each encoder's seconds per round are set, so medians, per-round ratios and the target's verdict are known.
The slow one runs the real benchmark (the export command, MiniLM four ways) on a few sentences.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from tests.conftest import load_benchmark

N_SENTENCES = 6


@pytest.fixture
def script(monkeypatch, tmp_path):
    """The script with its rows written under tmp_path."""
    module = load_benchmark("onnx_encode")
    monkeypatch.setattr(sys.modules["rows"], "RESULTS", tmp_path / "results")
    return module


def stand_ins(script, monkeypatch, seconds: dict[str, list[float]], fp32_offset: float = 1e-7):
    """Encoders of a 6 x 8 embedding that take seconds[name][round] on a fake clock; the calls made, in order."""
    rng = np.random.default_rng(0)
    base = rng.normal(size=(N_SENTENCES, 8)).astype(np.float32)
    outputs = {
        script.ANCHOR: base / np.linalg.norm(base, axis=1, keepdims=True),  # sentence-transformers normalises
        script.SENTEMB: base,
        script.ONNX_FP32: base + fp32_offset,
        script.ONNX_INT8: base + 0.01 * rng.normal(size=base.shape).astype(np.float32),
    }
    clock, calls = [0.0], []

    def encoder(name):
        def encode(sentences):
            assert len(sentences) == N_SENTENCES
            timed = sum(1 for c in calls if c == name) - 1  # the first call is the warm-up
            calls.append(name)
            if timed >= 0:
                clock[0] += seconds[name][timed]
            return outputs[name]

        return encode

    monkeypatch.setattr(script, "time", SimpleNamespace(perf_counter=lambda: clock[0]))
    monkeypatch.setattr(script, "export_folder", lambda out: out)
    monkeypatch.setattr(script, "minilm_encoders", lambda folder, threads: {n: encoder(n) for n in script.NAMES})
    return calls


def rows_of(tmp_path: Path) -> list[dict]:
    return json.loads((tmp_path / "results" / "onnx_encode.json").read_text())


def test_ratios_are_medians_of_per_round_ratios_and_int8_at_2x_passes(script, monkeypatch, tmp_path, capsys):
    seconds = {
        script.ANCHOR: [1.0, 3.0, 2.0],
        script.SENTEMB: [1.0, 2.0, 2.0],
        script.ONNX_FP32: [1.0, 3.0, 1.0],
        script.ONNX_INT8: [0.4, 1.0, 1.0],  # per round 2.5, 3.0, 2.0: median 2.5 (medians' ratio: 2.0)
    }
    calls = stand_ins(script, monkeypatch, seconds)
    out = tmp_path / "onnx_encode.md"
    assert script.main(["--rounds", "3", "--sentences", str(N_SENTENCES), "--out", str(out)]) == 0

    names = list(script.NAMES)
    assert calls[:4] == names  # one warm-up of each, then rounds in rotating order
    assert calls[4:] == names + names[1:] + names[:1] + names[2:] + names[:2]
    rows = rows_of(tmp_path)
    assert [r["figure"].rsplit(": ", 1)[1] for r in rows] == [script.ONNX_INT8, script.ONNX_FP32, script.SENTEMB]
    int8, fp32, sentemb = rows
    assert int8["ratio"] == pytest.approx(2.5) and int8["target"] == ">= 2.0" and int8["passed"] is True
    assert int8["value"] == pytest.approx(N_SENTENCES / 1.0)  # median sentences/s: of 6/0.4, 6/1.0, 6/1.0
    assert all(r["anchor"] == script.ANCHOR for r in rows)
    assert all(r["anchor_value"] == pytest.approx(N_SENTENCES / 2.0) for r in rows)
    assert fp32["ratio"] == pytest.approx(1.0) and fp32["passed"] is None and fp32["target"] == "—"
    assert sentemb["ratio"] == pytest.approx(1.0) and sentemb["passed"] is None
    report = out.read_text()
    assert "**2.500** (target >= 2.0: ok)" in report and "2.50 / 3.00 / 2.00" in report
    assert re.search(r"max abs difference \(<= 0.0001\): 1\.\d+e-07 \(ok\)", report)  # the 1e-7 offset
    assert report.strip() in capsys.readouterr().out


def test_int8_under_2x_fails_the_target(script, monkeypatch, tmp_path):
    stand_ins(script, monkeypatch, {name: [1.0] for name in script.NAMES} | {script.ONNX_INT8: [0.6]})
    out = tmp_path / "onnx_encode.md"
    assert script.main(["--rounds", "1", "--sentences", str(N_SENTENCES), "--out", str(out)]) == 1
    int8 = rows_of(tmp_path)[0]
    assert int8["ratio"] == pytest.approx(1 / 0.6) and int8["passed"] is False
    assert "(target >= 2.0: FAILED)" in out.read_text()


def test_an_onnx_graph_that_disagrees_with_sentemb_gives_a_failed_row_not_throughputs(script, monkeypatch, tmp_path):
    stand_ins(script, monkeypatch, {name: [1.0] for name in script.NAMES} | {script.ONNX_INT8: [0.1]}, 1e-2)
    out = tmp_path / "onnx_encode.md"
    assert script.main(["--rounds", "1", "--sentences", str(N_SENTENCES), "--out", str(out)]) == 1
    (failed,) = rows_of(tmp_path)
    assert failed["figure"].startswith("ONNX fp32 vs sentemb encode(): max abs difference")
    assert failed["value"] == pytest.approx(1e-2) and failed["passed"] is False
    assert "(FAILED)" in out.read_text()


def test_the_sentences_are_the_distinct_sentences_of_stsb_test(script, data_root):
    lines = (data_root / "senteval/downstream/STS/STSBenchmark/sts-test.csv").read_text(encoding="utf-8").splitlines()
    fields = [line.strip().split("\t") for line in lines]
    first_seen = dict.fromkeys(" ".join(f[column].split()) for f in fields for column in (5, 6))
    sentences = script.stsb_sentences()
    assert set(sentences) == set(first_seen) and len(sentences) == len(first_seen) < 2 * len(lines)
    assert script.stsb_sentences(5) == sentences[:5]


def test_make_bench_runs_it_with_its_default_rounds_in_both_modes():
    report = load_benchmark("report")
    entries = [(job, quick, rows) for script, job, quick, rows, _ in report.SCRIPTS if script == "onnx_encode.py"]
    assert entries == [([], [], "onnx_encode")]  # int8's ratio is near its bound: one round could decide it


@pytest.mark.slow  # the export command and MiniLM four ways, ~40 s
def test_the_real_benchmark_runs_on_a_few_sentences(script, tmp_path):
    threads = torch.get_num_threads()
    try:
        code = script.main(["--rounds", "1", "--sentences", "40", "--out", str(tmp_path / "onnx_encode.md")])
    finally:
        torch.set_num_threads(threads)
    rows = rows_of(tmp_path)
    assert code in (0, 1) and len(rows) == 3  # the sanity checks held (else one failed row); the target may not
    assert all(r["value"] > 0 and r["anchor_value"] > 0 for r in rows)
    report = (tmp_path / "onnx_encode.md").read_text()
    assert report.count("(ok)") == 3
