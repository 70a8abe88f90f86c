"""The decoder GPU benchmark's dry run (benchmarks/gpu/run_decoders.sh --dry-run: the CPU, toy decoders), its FLOP
count, its batch search and its projection, so the one prepared script a GPU call runs cannot rot."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks" / "gpu"))
sys.path.insert(0, str(ROOT / "benchmarks"))
import decoders  # noqa: E402

from sentemb.encoders.models.decoders import tiny_decoder  # noqa: E402
from tests import test_bench_gpu, test_gpu_decoders  # noqa: E402


def dry_run(tmp_path: Path, *args: str, **env: str) -> tuple[subprocess.CompletedProcess, dict]:
    return test_bench_gpu.dry_run(tmp_path, *args, script="run_decoders.sh", record="gpu_decoders/decoders.json", **env)


def test_the_dry_run_times_every_configuration_searches_and_projects(tmp_path: Path):
    # the test phase (a pytest subprocess that here would only skip) runs in the slow test below
    done, record = dry_run(tmp_path, "--skip-tests")
    runs = record["runs"]
    assert all(run["status"] in ("ok", "out of memory") for run in runs), [r.get("traceback") for r in runs]
    compare = {(r["shape"], r["method"], r["padding_free"]): r for r in runs if r["kind"] == "compare"}
    expected = {("qwen3-0.6b", m, p) for m in ("full", "lora", "lora_gc") for p in (False, True)}
    assert set(compare) == expected | {("mistral-7b", m, p) for m in ("lora", "lora_gc") for p in (False, True)}
    for (shape, method, padding_free), run in compare.items():
        # what ran is what the row says: a switch that did not take effect would have failed the run
        assert run["adapter"] == (method != "full") and run["padding_free"] == padding_free, run["label"]
        assert run["gradient_checkpointing"] == (method == "lora_gc") and run["steps_timed"] == 1
        assert run["base_dtype"] == ("float32" if method == "full" else "bfloat16")
        assert run["layer_parameters"] > 0 and run["mfu"] > 0 and run["flops_per_step"] > 0
        anchor = compare[(shape, "full" if shape == "qwen3-0.6b" else "lora", False)]
        assert run["x_anchor_same_batch"] == pytest.approx(anchor["s_per_step"] / run["s_per_step"]), run["label"]
        assert (run["adapter_parameters"] > 0) == (method != "full")
    recipe = {(r["shape"], r["kind"]) for r in runs if r["kind"] in ("mntp", "simcse", "grad_cache")}
    assert recipe == {
        ("qwen3-0.6b", "mntp"),
        ("mistral-7b", "mntp"),
        ("mistral-7b", "simcse"),
        ("mistral-7b", "grad_cache"),
    }
    mntp = next(r for r in runs if r["kind"] == "mntp")
    assert mntp["encoded_tokens"] == mntp["real_tokens_per_view"], "MNTP alone encodes the masked copies only"

    searches = {(s["shape"], s["method"], s["padding_free"]): s for s in record["searches"]}
    # the Mistral family's probe above the dry run's limit is refused as out of memory; the Qwen family's hits the cap
    assert searches[("mistral-7b", "lora_gc", True)]["largest"] == 4
    assert searches[("mistral-7b", "lora_gc", True)]["stopped"] == "out of memory at batch 8"
    anchor = searches[("qwen3-0.6b", "full", False)]  # the 0.6B anchor's search: every "at its largest" ratio reads it
    assert anchor["largest"] == 8 and anchor["stopped"].startswith("the cap (8") and anchor["x_anchor_at_largest"] == 1
    refused = [r for r in runs if r["kind"] == "search" and r["status"] == "out of memory"]
    assert [r["batch"] for r in refused] == [8]

    assert record["encode"]["mistral-7b"]["status"] == "ok"
    projected = record["projection"]["mistral-7b"]
    assert projected["status"] == "projected"
    # the arithmetic: each stage's steps at its measured step time plus its dev evaluations at encode()'s rate
    per_s = record["encode"]["mistral-7b"]["per_s"]
    stages = {r["kind"]: r for r in runs if r["shape"] == "mistral-7b" and r["kind"] in ("mntp", "simcse")}
    total = 0.0
    for term in projected["terms"]:
        assert term["steps"] == 1000 and term["evaluations"] == 9, "the presets: 1000 steps, dev at 0, 125, ..., 1000"
        assert term["train_s"] == pytest.approx(1000 * stages[term["stage"]]["s_per_step"])
        assert term["dev_s"] == pytest.approx(9 * 3000 / per_s)
        total += term["train_s"] + term["dev_s"] + term["report_s"]
    assert projected["total_min"] == pytest.approx(total / 60)
    scale = projected["length_scale"]  # Mistral-7B's own tokenizer's lengths: the bundle's, where one was built
    assert scale == record["length_scales"]["mistral"]
    if scale["scale"] is None:
        assert scale["why"] and projected["scaled_total_min"] is None
    else:
        assert projected["scaled_total_min"] == pytest.approx(total / 60 * scale["scale"])
    assert projected["largest_batch_without_grad_cache"] == 4

    assert record["imported_unasked"] == [], "nothing on the training path imports wandb or optuna"
    printed = done.stdout
    assert "LLM2Vec's MNTP then SimCSE stage on one card: projected" in printed
    assert (tmp_path / "out" / "decoders.log").is_file() and (tmp_path / "out" / "environment.txt").is_file()
    assert (tmp_path / "out" / "gpu_decoders" / "decoders.md").read_text().count("| qwen3-0.6b |") >= 7


def test_the_length_scale_counts_both_tokenizers_on_the_same_lines(tmp_path: Path):
    sentencepiece = pytest.importorskip("sentencepiece")  # a dev dependency (pyproject.toml)
    lines = [line for line in (ROOT / "README.md").read_text(encoding="utf-8").splitlines() if line.strip()]
    model = tmp_path / "reference.model"
    with model.open("wb") as out:  # a small SentencePiece model trained here, in Mistral's tokenizer's place
        sentencepiece.SentencePieceTrainer.train(sentence_iterator=iter(lines), model_writer=out, vocab_size=300)
    decoders.decoder_tokenizer("mistral", None).save_pretrained(tmp_path / "ours")
    found = decoders.length_scale(model, tmp_path / "ours", lines)
    pieces = sentencepiece.SentencePieceProcessor(model_file=str(model))
    real = sum(min(len(pieces.encode(line)) + 1, 128) for line in lines) / len(lines)  # <s> first, as Mistral's
    ours = decoders.pretrained_decoder_tokenizer(str(tmp_path / "ours"))(lines)["input_ids"]
    ours_mean = sum(min(len(ids), 128) for ids in ours) / len(lines)
    assert found["reference_tokens_per_line"] == pytest.approx(real) and found["tokens_per_line"] == pytest.approx(
        ours_mean
    )
    assert found["scale"] == pytest.approx(real / ours_mean) and found["lines"] == len(lines)
    assert decoders.length_scale(None, tmp_path / "ours", lines) == {
        "scale": None,
        "why": "no reference tokenizer (None)",
    }


def test_the_flop_count_of_full_fine_tuning_lora_and_mntp():
    dims = {"num_hidden_layers": 2, "num_attention_heads": 4, "head_dim": 8, "vocab_size": 100, "hidden_size": 16}
    f = {
        "real_tokens_per_view": 10.0,
        "squared_lengths_per_view": 50.0,
        "layer_parameters": 1000,
        "adapter_parameters": 10,
    }
    attention = 12 * 2 * 4 * 8 * 2 * 50.0  # 12·layers·heads·head_dim·Σs², both views
    assert decoders.flops_per_step(f, dims, "full", 2, 0.0) == 6 * 1000 * 20 + attention
    assert decoders.flops_per_step(f, dims, "lora", 2, 0.0) == 4 * 1000 * 20 + 6 * 10 * 20 + attention
    # MNTP alone: one view (the masked copies), the lm_head's 4·V·H at each scored token under LoRA
    mntp = 4 * 1000 * 10 + 6 * 10 * 10 + attention / 2 + 4 * 100 * 16 * 2.0
    assert decoders.flops_per_step(f, dims, "lora_gc", 1, 2.0) == mntp


def test_rates_mfu_and_the_ratio_against_the_anchor_at_the_same_batch():
    def run(method: str, padding_free: bool, seconds: float, batch: int = 128) -> decoders.Run:
        figures = {"status": "ok", "s_per_step": seconds, "sentences": batch, "real_tokens_per_view": 4000.0,
                   "encoded_tokens": 8000.0, "flops_per_step": 2e12}  # fmt: skip
        return decoders.Run("qwen3-0.6b", "compare", method, padding_free, batch, [], figures)

    anchor, lora = run("full", False, 0.5), run("lora", True, 0.25)
    other_batch = run("lora", True, 0.4, batch=256)
    decoders.derive([anchor, lora, other_batch], peak_flops=1e13)
    assert lora.figures["x_anchor_same_batch"] == 2.0 and anchor.figures["x_anchor_same_batch"] == 1.0
    assert "x_anchor_same_batch" not in other_batch.figures, "no anchor row at batch 256"
    assert lora.figures["real_tokens_per_s"] == 32_000 and lora.figures["samples_per_s"] == 512
    assert lora.figures["mfu"] == pytest.approx(2e12 / 0.25 / 1e13)


@pytest.fixture
def fake_measure(monkeypatch: pytest.MonkeyPatch):
    """measure() replaced: a batch above `fits` is out of memory; a step takes 1 ms per sentence."""
    limits = {"fits": 64}

    def measure(run: decoders.Run, ctx, steps: int) -> None:
        fits = run.batch <= limits["fits"]
        status = "ok" if fits else "out of memory"
        run.figures |= {"status": status, "s_per_step": run.batch / 1000, "wall_s": 1.0}

    monkeypatch.setattr(decoders, "measure", measure)
    return limits


def context(budget_s: float = 1e9) -> decoders.Context:
    return decoders.Context(torch.device("cpu"), Path("."), True, 1, 1, 1, decoders.time.perf_counter(), budget_s)


def first_run(batch: int, status: str) -> decoders.Run:
    run = decoders.Run("mistral-7b", "compare", "lora_gc", True, batch, [f"data.batch_size={batch}"])
    run.figures |= {"status": status, "s_per_step": batch / 1000, "wall_s": 1.0}
    return run


@pytest.mark.parametrize(
    ("start", "fits", "cap", "largest", "stopped", "probed"),
    [
        (16, 64, 2048, 64, "out of memory at batch 128", [32, 64, 128]),
        (16, 64, 32, 32, "the cap (32; batch 64 not tried)", [32]),
        (16, 4, 2048, 4, "out of memory at batch 8", [8, 4]),  # the comparison batch does not fit: halving
        (16, 0, 2048, None, "no batch fits (out of memory at batch 16)", [8, 4, 2, 1]),
    ],
)
def test_the_search_doubles_until_out_of_memory_or_the_cap_and_halves_below(
    fake_measure, start, fits, cap, largest, stopped, probed
):
    fake_measure["fits"] = fits
    runs: list[decoders.Run] = []
    shape = decoders.replace(decoders.SHAPES["mistral-7b"], cap=cap)
    found = decoders.search(first_run(start, "ok" if start <= fits else "out of memory"), context(), shape, runs)
    assert (found["largest"], found["stopped"]) == (largest, stopped)
    assert [run.batch for run in runs] == probed
    assert all(run.overrides == [f"data.batch_size={run.batch}"] for run in runs)


def test_the_search_stops_before_a_probe_that_would_end_past_the_budget(fake_measure):
    runs: list[decoders.Run] = []
    found = decoders.search(first_run(16, "ok"), context(budget_s=1.0), decoders.SHAPES["mistral-7b"], runs)
    # the next probe: its build and teardown again (1 s) and 2 steps twice as long (2 × 2 × 16 ms): past 1 s from now
    assert found["largest"] == 16 and found["stopped"].startswith("the budget (batch 32 would take ~1 s)") and not runs


@pytest.mark.parametrize(("name", "layers", "total"), [("qwen3-0.6b", 0.440, 0.596), ("mistral-7b", 6.98, 7.11)])
def test_the_shapes_have_the_published_parameter_counts(name: str, layers: float, total: float):
    # Qwen3-0.6B's card: 0.44 B parameters besides the (tied) embeddings; Mistral-7B: 7.24 B with its untied lm_head
    # (32000 × 4096 = 0.13 B), which an encoder does not load. Built on the meta device: shapes, no memory
    shape = decoders.SHAPES[name]
    with torch.device("meta"):
        model = tiny_decoder(shape.family, **shape.dims, torch_dtype="bfloat16", attn_implementation=None)
    named = list(model.named_parameters())
    assert sum(p.numel() for n, p in named if n.startswith("layers.")) / 1e9 == pytest.approx(layers, abs=5e-3)
    assert sum(p.numel() for _, p in named) / 1e9 == pytest.approx(total, abs=5e-3)


@pytest.mark.slow
def test_the_dry_run_runs_the_gpu_decoder_tests_on_the_cpu(tmp_path: Path):
    _, record = dry_run(tmp_path, SENTEMB_GPU_TESTS_ON_CPU="1")
    tests = record["tests"]
    assert tests["failed"] == 0 and tests["passed"] >= 3, tests["failures"] or tests["output_tail"]
    names = {name for name in dir(test_gpu_decoders) if name.startswith("test_")}
    assert {name.split("[")[0] for name in tests["tests"]} == names, "each one reported"
