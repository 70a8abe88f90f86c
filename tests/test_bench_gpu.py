"""The GPU benchmark's dry run (benchmarks/gpu/run.sh --dry-run: the CPU, toy sizes) and its arithmetic, so the one
prepared script a GPU call runs cannot rot; the bundle it needs (make gpu-bundle) in the slow tests (PyPI)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks" / "gpu"))
sys.path.insert(0, str(ROOT / "benchmarks"))
import encoders  # noqa: E402

from tests import test_gpu  # noqa: E402


def dry_run(
    tmp_path: Path, *args: str, script: str = "run.sh", record: str = "gpu_encoders/encoders.json", **env: str
) -> tuple[subprocess.CompletedProcess, dict]:
    """benchmarks/gpu/`script` --dry-run `args` as a GPU call runs it (no bundle): its output and its JSON `record`."""
    settings = {**os.environ, "OUT": str(tmp_path / "out"), "WORK": str(tmp_path / "work"), "NO_BUNDLE": "1"}
    settings.pop("SENTEMB_GPU_TESTS_ON_CPU", None)
    settings |= {"PYTHON": sys.executable, **env}
    command = ["bash", f"benchmarks/gpu/{script}", "--dry-run", *args]
    done = subprocess.run(command, cwd=ROOT, env=settings, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    return done, json.loads((tmp_path / "out" / record).read_text())


def test_the_dry_run_times_every_configuration_and_prints_the_short_table_last(tmp_path: Path):
    # the test phase (a pytest subprocess that here would only skip, ~8 s) runs in the slow test below
    done, record = dry_run(tmp_path, "--skip-tests")
    runs = {run["name"]: run for run in record["runs"]}
    anchors = [encoders.BARE_FP32, encoders.BARE_BF16, encoders.ST_FP32, encoders.ST_BF16]
    sentemb = [name for name in runs if name.startswith("sentemb")]
    assert set(runs) == {*anchors, *sentemb} and len(sentemb) == 12, "3 presets x padding-free or not x compiled or not"
    for name, run in runs.items():
        if run.get("compile"):
            assert run["status"] == "skipped (dry run)", name
            continue
        assert run["status"] == "ok", (name, run.get("traceback"))
        assert run["s_per_step"] > 0 and run["steps_timed"] == 2 and run["mfu"] > 0, name
        assert run[f"x {encoders.BARE_FP32}"] == pytest.approx(
            runs[encoders.BARE_FP32]["s_per_step"] / run["s_per_step"]
        )
    assert record["ceilings"]["bf16_matmul_flops"] > 0 and record["ceilings"]["copy_bytes_per_s"] > 0
    assert "tests" not in record
    assert record["profile"]["top"], "the profile ran (CPU ops only: no GPU)"
    assert record["imported_unasked"] == [], "nothing on the training path imports wandb or optuna"
    printed = done.stdout.splitlines()
    table = printed.index("| batch | run | ms/step | ×bare fp32 | ×ST | MFU | peak GiB |")
    assert all(line.startswith("| 8 |") for line in printed[table + 2 : table + 2 + len(runs)]), "one row per run"
    assert (tmp_path / "out" / "environment.txt").is_file() and (tmp_path / "out" / "encoders.log").is_file()
    assert (tmp_path / "out" / "gpu_encoders" / "encoders.md").read_text().count("\n| 8 |") == len(runs)


@pytest.mark.slow
def test_the_dry_run_runs_the_gpu_tests_on_the_cpu(tmp_path: Path):
    _, record = dry_run(tmp_path, SENTEMB_GPU_TESTS_ON_CPU="1")
    tests = record["tests"]
    assert tests["failed"] == 0 and tests["passed"] >= 5, tests["failures"] or tests["output_tail"]
    assert set(tests["tests"]) == {name for name in dir(test_gpu) if name.startswith("test_")}, "each one reported"


@pytest.mark.slow
def test_without_cuda_the_gpu_tests_are_skipped_and_counted(tmp_path: Path):
    _, record = dry_run(tmp_path)
    assert record["tests"]["failed"] == 0 and record["tests"]["passed"] == 0 and record["tests"]["skipped"] >= 6


def test_mfu_and_the_speed_ups_follow_from_the_step_times():
    def run(name: str, kind: str, seconds: float, batch: int = 512) -> encoders.Run:
        timed = {"status": "ok", "s_per_step": seconds, "sentences": 512, "real_tokens": 20_000, "mean_length": 20}
        return encoders.Run(batch, name, kind, go=lambda: ([], []), figures=timed)

    runs = [
        run(encoders.BARE_FP32, "anchor", 0.4),
        run(encoders.ST_FP32, "sentence-transformers", 0.3),
        run(encoders.ST_BF16, "sentence-transformers", 0.2),
        run("sentemb fast", "sentemb", 0.1),
        run("sentemb other batch", "sentemb", 0.05, batch=64),
    ]
    flops_per_token = lambda length: 6 * 85e6 + 12 * 12 * 768 * length  # noqa: E731 (bert-base's layers)
    encoders.derive(runs, flops_per_token, peak=800e12)
    fast = runs[3].figures
    assert fast["real_tokens_per_s"] == pytest.approx(200_000)
    assert fast["mfu"] == pytest.approx((6 * 85e6 + 12 * 12 * 768 * 20) * 200_000 / 800e12)
    assert fast[f"x {encoders.BARE_FP32}"] == pytest.approx(4.0)
    assert fast["x sentence-transformers (faster)"] == pytest.approx(2.0), "against sentence-transformers' faster run"
    assert "x sentence-transformers (faster)" not in runs[4].figures, "anchors come from the same batch size only"
    goal = encoders.targets(runs, 512)
    assert goal["fastest"] == "sentemb fast" and goal["vs_st_held"] and not goal["mfu_held"]


@pytest.mark.slow
def test_make_gpu_bundle_builds_a_folder_that_can_travel(tmp_path: Path):
    out = tmp_path / "bundle"
    done = subprocess.run(
        ["make", "gpu-bundle", f"ARGS=--out {out}"], cwd=ROOT, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    manifest = json.loads((out / "manifest.json").read_text())
    assert set(manifest["versions"]) >= {"hydra-core", "omegaconf", "antlr4-python3-runtime", "torchdata", "datasets"}
    size = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
    assert size < 60 * 2**20
    assert (out / "minilm" / "tokenizer.json").is_file() and (out / "data" / "wiki" / "wiki1m_head.txt").is_file()
