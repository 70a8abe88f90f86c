"""benchmarks/method_table.py (HiCL's Table 1 methods on MiniLM, run on a GPU by hand; `--table focal`: Focal-InfoNCE's
Table 3): its --dry-run trains every method in this process on a tiny BERT, and the report has a row per method; the
step figures, alignment and uniformity, `--limit-lines` and the method configs.
"""

from __future__ import annotations

import json
import math

import pytest
import torch

from tests.conftest import compose_train, load_benchmark

script = load_benchmark("method_table")


def finite(value) -> bool:
    return isinstance(value, float) and math.isfinite(value)


def run_dry(tmp_path, data_root, capsys, *extra: str) -> tuple[dict, str]:
    threads = torch.get_num_threads()
    try:
        code = script.main(["--dry-run", "--out", str(tmp_path / "out"), "--data", str(data_root), *extra])
    finally:
        torch.set_num_threads(threads)
    assert code == 0
    return json.loads((tmp_path / "out" / "method_table.json").read_text()), capsys.readouterr().out


def check_rows(document: dict, output: str, seeds: list[int], methods: dict = script.METHODS) -> None:
    rows = {r["method"]: r for r in document["rows"]}
    assert list(rows) == list(methods)
    assert [(r["method"], r["seed"]) for r in document["runs"]] == [(m, s) for s in seeds for m in methods]
    assert all(r["status"] == "ok" for r in document["runs"])
    for row in rows.values():
        assert row["seeds"] == seeds
        for key in ("dev", "test"):
            assert finite(row[key]["mean"]) and -100 <= row[key]["mean"] <= 100  # Spearman x100
            for seed in seeds:
                scored = row[key]["per_seed"][str(seed)]
                low, high = scored["bootstrap_ci"]
                assert low <= scored["score"] <= high
        assert finite(row["step_ms"]) and row["step_ms"] > 0 and finite(row["step_ratio"]) and row["step_ratio"] > 0
    assert (document["runs_done"], document["runs_planned"]) == (len(seeds) * 6, len(seeds) * 6)
    assert rows["simcse"]["step_ratio"] == 1.0 and rows["simcse"]["step_ratio_per_seed"] == [1.0] * len(seeds)
    # the compact markdown table is printed last, one line per method
    table = output.strip().splitlines()[-len(methods) :]
    assert [line.split(" | ")[0].lstrip("| ") for line in table] == list(methods)


def test_the_dry_run_trains_every_method_and_reports_a_row_each(tmp_path, data_root, capsys):
    document, output = run_dry(tmp_path, data_root, capsys, "--seeds", "1")
    check_rows(document, output, [1])
    assert not list((tmp_path / "out").rglob("*.ckpt"))  # the best checkpoints are deleted after their runs
    assert "DRY RUN" in (tmp_path / "out" / "method_table.md").read_text()
    assert document["table"] == "hicl" and document["corpus_lines"] == script.DRY_LINES
    assert all("alignment" not in r for r in [*document["runs"], *document["rows"]]), "the HiCL table is unchanged"


def test_the_focal_dry_run_trains_table_3s_methods_with_alignment_and_uniformity(tmp_path, data_root, capsys):
    document, output = run_dry(tmp_path, data_root, capsys, "--table", "focal", "--seeds", "1", "--limit-lines", "40")
    check_rows(document, output, [1], script.FOCAL_METHODS)
    assert document["table"] == "focal" and document["corpus_lines"] == 40
    assert {r["method"]: r["overrides"] for r in document["rows"]} == script.FOCAL_METHODS
    for run in document["runs"]:
        assert finite(run["alignment"]) and 0 <= run["alignment"] <= 4  # squared distances of unit vectors
        assert finite(run["uniformity"]) and run["uniformity"] <= 0
        assert math.isfinite(run["alignment"]) and math.isfinite(run["uniformity"])
    for row in document["rows"][1:]:
        for key in ("alignment", "uniformity"):
            assert row[key]["per_seed"]["1"]["score"] == next(
                r[key] for r in document["runs"] if r["method"] == row["method"]
            )
            assert row[key]["vs_simcse"]["seeds"] == [1]
    report = (tmp_path / "out" / "method_table.md").read_text()
    assert "Focal-InfoNCE Table 3" in report and "corpus: 40 non-empty lines (--limit-lines 40)" in report
    assert "head.generator=uniform" in report and "negatives.complementary=initial" in report  # the fallbacks, said
    assert output.strip().splitlines()[-len(script.FOCAL_METHODS) - 2].endswith("| align | unif |")
    assert not list((tmp_path / "out").rglob("*.ckpt"))


def test_limit_lines_trains_on_the_corpus_first_lines(tmp_path):
    source = tmp_path / "source.txt"
    source.write_text("a\n\nb\n  \nc\nd\n", encoding="utf-8")
    assert script.limited_corpus(source, tmp_path, None) == (source, 4)
    assert script.limited_corpus(source, tmp_path, 9) == (source, 4)
    corpus, lines = script.limited_corpus(source, tmp_path, 3)
    assert lines == 3 and corpus.read_text(encoding="utf-8") == "a\nb\nc\n"
    with pytest.raises(SystemExit):
        script.parse(["--limit-lines", "0"])
    with pytest.raises(SystemExit):
        script.parse(["--table", "focal", "--methods", "esimcse"])  # not a Table 3 method
    assert script.parse(["--table", "focal"]).out.name == "method_table_focal"
    assert script.parse([]).out.name == "method_table" and script.parse([]).methods == ",".join(script.METHODS)


@pytest.mark.slow  # all six methods over two seeds, ~45 s on 2 cores
def test_the_two_seed_dry_run_tests_each_method_against_simcse(tmp_path, data_root, capsys):
    document, output = run_dry(tmp_path, data_root, capsys)
    check_rows(document, output, [1, 2])
    for row in document["rows"][1:]:
        for key in ("dev", "test"):
            versus = row[key]["vs_simcse"]
            assert versus["seeds"] == [1, 2]
            assert math.isnan(versus["p"]) or versus["p"] <= versus["p_holm"] <= 1  # Holm never lowers a p


def test_step_figures_leave_out_the_first_steps_and_the_dev_evaluations():
    ends = [1.0, 2.0, 2.5, 4.0, 4.3, 5.0, 5.2]
    steps = [
        {"step": i + 1, "seconds": s, "end": end, "dev_eval": i == 4}
        for i, (s, end) in enumerate(zip([0.9, 0.4, 0.3, 0.2, 0.5, 0.1, 0.15], ends, strict=True))
    ]
    figures = script.step_figures(steps, skip=2)
    assert figures["step_ms"] == pytest.approx(1000 * 0.175)  # steps 3, 4, 6, 7: 0.3, 0.2, 0.1, 0.15
    # intervals 3→4 (1.5) and 6→7 (0.2); 4→5 and 5→6 touch the evaluation
    assert figures["iteration_ms"] == pytest.approx(1000 * 0.85)
    assert figures["timed_steps"] == 4 and figures["steps"] == 7
    assert math.isnan(script.step_figures(steps[:2], skip=2)["step_ms"])


def test_the_holm_correction_is_over_the_five_comparisons_with_simcse():
    records = [
        {"method": m, "seed": s, "status": "ok", "dev": d + s, "dev_ci": [0, 100], "test": d + s * s,
         "test_ci": [0, 100], "step_ms": 10.0 * (i + 1), "iteration_ms": 12.0}
        for i, (m, d) in enumerate(zip(script.METHODS, [70, 71, 72, 73, 74, 75], strict=True))
        for s in (1, 2, 3)
    ]  # fmt: skip
    records[3]["test"] += 0.5  # esimcse seed 1: a difference that varies over seeds
    rows = script.aggregate(records, list(script.METHODS))
    assert rows[0]["step_ratio"] == 1.0 and "vs_simcse" not in rows[0]["test"]
    assert [r["step_ratio"] for r in rows] == pytest.approx([1, 2, 3, 4, 5, 6])
    assert rows[1]["test"]["vs_simcse"]["difference"] == pytest.approx(1 + 0.5 / 3)
    # the other four differ by a constant: no test (nan) and not counted in the family, so esimcse's p stands alone
    assert all(math.isnan(r["test"]["vs_simcse"]["p"]) for r in rows[2:])
    assert rows[1]["test"]["vs_simcse"]["p_holm"] == pytest.approx(rows[1]["test"]["vs_simcse"]["p"])
    assert rows[1]["dev"]["mean"] == pytest.approx(73) and rows[1]["dev"]["std"] == pytest.approx(1)


def test_alignment_and_uniformity_are_tested_against_simcse_like_the_scores():
    records = [
        {"method": m, "seed": s, "status": "ok", "dev": 80.0 + s, "dev_ci": [0, 100], "test": 75.0 + s,
         "test_ci": [0, 100], "step_ms": 10.0 * (i + 1), "iteration_ms": 12.0, "alignment": 0.2 - 0.01 * i + 0.001 * s,
         "uniformity": -2.0 - 0.1 * i - 0.01 * s * s}
        for i, m in enumerate(script.FOCAL_METHODS)
        for s in (1, 2, 3)
    ]  # fmt: skip
    records[3]["alignment"] += 0.006  # focal seed 1: an alignment difference that varies over seeds
    rows = script.aggregate(records, list(script.FOCAL_METHODS), "focal")
    assert rows[2]["overrides"] == script.FOCAL_METHODS["diffcse"]
    assert rows[2]["alignment"]["mean"] == pytest.approx(0.182) and rows[0]["uniformity"]["std"] > 0
    assert rows[2]["alignment"]["vs_simcse"]["difference"] == pytest.approx(-0.02)
    assert math.isnan(rows[2]["alignment"]["vs_simcse"]["p"])  # a constant difference: no test
    focal = rows[1]["alignment"]["vs_simcse"]
    assert focal["difference"] == pytest.approx(-0.008) and 0 < focal["p"] < 1
    assert focal["p_holm"] == pytest.approx(focal["p"])  # the only alignment test in its family
    assert "vs_simcse" not in rows[0]["alignment"] and [r["step_ratio"] for r in rows] == pytest.approx(range(1, 7))
    table = script.compact_table(rows)
    assert table[0].endswith("| align | unif |") and table[4].endswith("| 0.182 ± 0.001 | -2.247 ± 0.040 |")
    assert "| focal_dclr | 0.152 ± 0.001 | -0.050, p –, p_holm – | -2.547 ± 0.040 |" in "\n".join(
        script.geometry_table(rows)
    )


@pytest.mark.parametrize("method", list(script.METHODS))
def test_each_method_composes_with_its_own_settings_and_the_shared_ones(method, tmp_path, data_root):
    settings = {
        "data_root": data_root, "corpus": data_root / "wiki" / "wiki1m_head.txt", "precision": "32-true",
        "deterministic": "warn", "model": None, "extra": [],
    }  # fmt: skip
    cfg = script.composed(script.run_overrides(method, 1, settings), tmp_path)
    assert (cfg.data.batch_size, cfg.optimizer.lr, cfg.loss.tau, cfg.seed) == (64, 3e-5, 0.05, 1)
    assert cfg.data.max_length == (512 if method.startswith("hicl") else 32)
    assert cfg.pooling.name == ("hicl" if method.startswith("hicl") else "prompt" if method == "sncse" else "cls")
    assert (cfg.get("negatives") or {}).get("queue_size") == (160 if "esimcse" in method else None)
    assert cfg.data.dup_rate == (0.32 if "esimcse" in method else 0.0)
    if "sncse" in method:
        assert cfg.auxiliary.sncse.source == "rule" and cfg.auxiliary.sncse.weight == 1e-3
        assert cfg.pooling.positive_template == script.SNCSE_TEMPLATE
    else:
        assert cfg.get("auxiliary") is None
    assert list(cfg.callbacks)[0] == "step_clock" and cfg.callbacks.get("last_checkpoint") is None
    assert compose_train(["experiment=simcse/minilm", "pooling=hicl"]).data.max_length == 32  # why HiCL's is set


@pytest.mark.parametrize("method", list(script.FOCAL_METHODS))
def test_each_table_3_method_composes_with_its_own_settings_and_the_shared_ones(method, tmp_path, data_root):
    settings = {
        "table": "focal", "data_root": data_root, "corpus": data_root / "wiki" / "wiki1m_head.txt",
        "precision": "32-true", "deterministic": "warn", "model": None, "extra": [],
    }  # fmt: skip
    cfg = script.composed(script.run_overrides(method, 1, settings), tmp_path)
    assert (cfg.data.batch_size, cfg.optimizer.lr, cfg.data.max_length, cfg.seed) == (64, 3e-5, 32, 1)
    assert cfg.trainer.max_epochs == 1 and cfg.pooling.name == "cls"
    if "focal" in method:
        assert (cfg.loss.name, cfg.loss.tau, cfg.loss.m) == ("focal", 0.07, 0.3)  # Focal-InfoNCE Table 1, BERT-base
    else:
        assert (cfg.loss.name, cfg.loss.tau) == ("infonce", 0.05)
    if "diffcse" in method:
        assert cfg.head.name == "diffcse" and cfg.pooling.mlp == "none"
        assert (cfg.head.generator, cfg.head.masking_ratio, cfg.head.weight) == ("uniform", 0.3, 0.005)
    else:
        assert cfg.get("head") is None and cfg.pooling.mlp == "train"
    if "dclr" in method:
        assert cfg.negatives.name == "dclr" and cfg.negatives.complementary == "initial"
        assert (cfg.negatives.phi, cfg.negatives.noise_times) == (0.9, 1)
    else:
        assert cfg.get("negatives") is None
    assert list(cfg.callbacks)[0] == "step_clock" and cfg.callbacks.get("last_checkpoint") is None
