"""`python -m sentemb.compare A B [C ...]`: the paired bootstrap of two models, the paired t-test over seeds, the
reuse of kept cosines (similarities.npz), and the refusals before any model loads."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest
from scipy.stats import ttest_rel

import sentemb.compare
import sentemb.eval.bootstrap
import sentemb.st_modules
from sentemb.common.errors import SentembConfigError
from sentemb.common.metric_names import TEST_SPEARMAN, interval_names, sts_test_metric
from sentemb.eval.similarities import SIMILARITIES_NAME, pairs_digest, write_similarities
from sentemb.eval.sts import load_sts_task
from sentemb.runs.contenders import contender
from sentemb.runs.record import write_record
from sentemb.train import train
from tests.conftest import compose_train, tree

STSB_TEST = "cosine/STSBenchmark/test"


@pytest.fixture
def small_data(tmp_path: Path, small_stsb: Path, data_root: Path) -> Path:
    """A data root compare reads as it reads the shared one, cheap to encode: the small STS-B (200 test pairs) and
    the first 400 lines of each STS16 subset (327 scored pairs, in its five subsets)."""
    sts = tmp_path / "data" / "senteval" / "downstream" / "STS"
    sts.mkdir(parents=True)
    (sts / "STSBenchmark").symlink_to(small_stsb)
    (sts / "STS16-en-test").mkdir()
    for source in (data_root / "senteval" / "downstream" / "STS" / "STS16-en-test").glob("STS.*.txt"):
        lines = source.read_text(encoding="utf-8").splitlines(keepends=True)[:400]
        (sts / "STS16-en-test" / source.name).write_text("".join(lines), encoding="utf-8")
    return tmp_path / "data"


@pytest.fixture
def no_model_loads(monkeypatch, forbid_model_loading) -> None:
    """compare's own loader (and every backbone loader) fails the test: nothing may be encoded."""

    def load_model(*args, **kwargs):
        raise AssertionError("compare loaded a model")

    monkeypatch.setattr(sentemb.compare, "load_model", load_model)


def compare(argv: list[str], out: Path) -> dict:
    """`python -m sentemb.compare <argv> --out <out>` in this process: its compare.json (exit status 0 asserted)."""
    assert sentemb.compare.main([*argv, "--out", str(out), "--device", "cpu"]) == 0
    return json.loads((out / "compare.json").read_text())


def refused(argv: list[str], capsys) -> str:
    """The message of a comparison refused with exit status 1 (and no traceback)."""
    assert sentemb.compare.main([*argv, "--device", "cpu"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("sentemb: ") and "Traceback" not in err, err
    return err


def trained_run(tiny_overrides: list[str], small_stsb: Path, folder: Path) -> dict:
    """A tiny training run scored on the small STS-B, with the record its job wrapper would write."""
    overrides = [*tiny_overrides, f"eval.stsb_dir={small_stsb}"]
    cfg = compose_train(overrides, output_dir=folder)
    metrics = train(cfg)
    write_record(folder, {"status": "ok", "message": "", "metrics": metrics, "overrides": overrides, "swept": {},
                          "seed": cfg.seed, "job": None})  # fmt: skip
    return metrics


def zero_difference(row: dict) -> bool:
    return (
        row["difference"] == {"estimate": 0.0, "low": 0.0, "high": 0.0}
        and row["p"] == 1.0
        and row["p_holm"] == 1.0
        and row["separable"] is False
    )


def test_identical_checkpoints_differ_by_exactly_zero(tiny_overrides, small_stsb, small_data, tmp_path, capsys):
    """The same weights (one path twice, and a copy elsewhere) are encoded alike: difference 0 [0, 0], p = 1."""
    metrics = train(compose_train([*tiny_overrides, f"eval.stsb_dir={small_stsb}"], output_dir=tmp_path / "run"))
    best = Path(metrics["best_checkpoint"])
    copy = tmp_path / "elsewhere" / "copy.ckpt"
    copy.parent.mkdir()
    shutil.copy(best, copy)
    capsys.readouterr()
    argv = [str(best), str(best), str(copy), "--tasks", "STSBenchmark,STS16", "--data-dir", str(small_data)]
    result = compare(argv, tmp_path / "cmp")

    printed = capsys.readouterr()
    assert printed.err.count("compare: encoding STSBenchmark, STS16 with") == 3, "no record: each one encoded"
    assert [c["b"] for c in result["comparisons"]] == [str(best), str(copy)]
    for comparison in result["comparisons"]:
        assert [row["task"] for row in comparison["rows"]] == ["STSBenchmark", "STS16"]
        for row in comparison["rows"]:
            assert zero_difference(row), row
            assert row["a"] == row["b"]
    markdown = (tmp_path / "cmp" / "compare.md").read_text()
    assert markdown.strip() in printed.out
    assert markdown.count("| 0.00 [0.00, 0.00] | 1 | 1 | no |") == 4


def test_an_exported_folder_is_compared_as_the_checkpoint_it_came_from(
    tiny_overrides, small_stsb, small_data, tmp_path
):
    """The exported-folder branch: sentence-transformers encodes the same weights (in its own batches), so the
    difference is ~0 and not separable."""
    from sentemb.common.hydra_plumbing import compose_config
    from sentemb.common.paths import CONF_DIR
    from sentemb.export import export

    metrics = train(compose_train([*tiny_overrides, f"eval.stsb_dir={small_stsb}"], output_dir=tmp_path / "run"))
    folder = export(compose_config(CONF_DIR, "export", [f"checkpoint={metrics['best_checkpoint']}",
                                                        f"out={tmp_path / 'st'}"]))  # fmt: skip
    argv = [metrics["best_checkpoint"], str(folder), "--tasks", "STSBenchmark", "--data-dir", str(small_data)]
    result = compare(argv, tmp_path / "cmp")
    assert result["contenders"][1]["model"] == ["exported", str(folder)]
    [row] = result["comparisons"][0]["rows"]
    # other batches and padding (sentence-transformers' own): float32 last bits, ~1e-4 points of Spearman at most
    assert abs(row["difference"]["estimate"]) < 0.01 and row["separable"] is False


def test_a_run_folder_reuses_the_cosines_its_closing_report_kept(
    tiny_overrides, small_stsb, small_data, tmp_path, monkeypatch, capsys
):
    """A run folder (and its best checkpoint) is scored from similarities.npz, the very numbers of metrics.json;
    only a task it was not scored on is encoded."""
    run = tmp_path / "run"
    metrics = trained_run(tiny_overrides, small_stsb, run)
    assert (run / SIMILARITIES_NAME).is_file()
    real_load_model = sentemb.compare.load_model

    def load_model(*args, **kwargs):
        raise AssertionError("encoded although the run kept its cosines")

    monkeypatch.setattr(sentemb.compare, "load_model", load_model)
    data = ["--data-dir", str(small_data)]
    result = compare([str(run), str(run), "--tasks", "STSBenchmark", *data], tmp_path / "same")
    [row] = result["comparisons"][0]["rows"]
    low, high = interval_names(TEST_SPEARMAN)
    # the training report and compare score the same stored cosines with the same resamples: the same floats
    assert row["a"] == row["b"] == {"estimate": metrics[TEST_SPEARMAN], "low": metrics[low], "high": metrics[high]}
    assert zero_difference(row)
    # the best checkpoint of a run that scored it is read from the run's cosines too
    result = compare([metrics["best_checkpoint"], str(run), "--tasks", "STSBenchmark", *data], tmp_path / "ckpt")
    assert result["comparisons"][0]["rows"][0]["a"]["estimate"] == metrics[TEST_SPEARMAN]

    loaded = []

    def counted(*args, **kwargs):
        loaded.append(args[0].label)
        return real_load_model(*args, **kwargs)

    monkeypatch.setattr(sentemb.compare, "load_model", counted)
    capsys.readouterr()
    result = compare([str(run), str(run), "--tasks", "STSBenchmark,STS16", *data], tmp_path / "more")
    assert loaded == [str(run), str(run)], "STS16 is not in the run's cosines: encoded for each contender"
    err = capsys.readouterr().err
    assert err.count(f"compare: encoding STS16 with {run}") == 2 and "encoding STSBenchmark" not in err
    stsb, sts16 = result["comparisons"][0]["rows"]
    assert (stsb["task"], sts16["task"]) == ("STSBenchmark", "STS16")
    assert stsb["a"]["estimate"] == metrics[TEST_SPEARMAN]
    assert zero_difference(stsb) and zero_difference(sts16)


def fake_run(folder: Path) -> Path:
    """A finished run's folder without weights: compare must refuse its cosines before it would load any."""
    write_record(folder, {"status": "ok", "message": "", "seed": 42, "overrides": [],
                          "metrics": {"best_checkpoint": str(folder / "checkpoints" / "best-step4.ckpt"),
                                      TEST_SPEARMAN: 50.0}})  # fmt: skip
    return folder / SIMILARITIES_NAME


def tamper(kind: str, path: Path, small_data: Path) -> None:
    data = {"STSBenchmark": load_sts_task(small_data / "senteval" / "downstream", "STSBenchmark", ("test",))}
    pairs = data["STSBenchmark"]["test"]
    cosines = np.linspace(-0.5, 0.9, len(pairs.gold))
    if kind == "wrong length":
        np.savez(path, **{STSB_TEST: cosines[:-1], "pairs/STSBenchmark/test": np.asarray(pairs_digest(pairs))})
    elif kind == "a cosine of 7.0":
        cosines[17] = 7.0
        write_similarities(path, data, {"STSBenchmark": {"test": cosines}})
    elif kind == "float32":
        np.savez(path, **{STSB_TEST: cosines.astype(np.float32), "pairs/STSBenchmark/test": pairs_digest(pairs)})
    elif kind == "not a zip":
        path.write_text("cosines, as I remember them\n")
    elif kind == "one .npy array":
        with open(path, "wb") as handle:
            np.save(handle, cosines)
    elif kind == "a member not an array":
        with zipfile.ZipFile(path, "w") as archive:
            archive.writestr(f"{STSB_TEST}.npy", b"not the .npy format")
            archive.writestr("pairs/STSBenchmark/test.npy", b"nor this")


TAMPERED = ["wrong length", "a cosine of 7.0", "float32", "not a zip", "one .npy array", "a member not an array"]


@pytest.mark.parametrize("kind", TAMPERED)
def test_a_tampered_similarities_file_is_refused_by_name(kind, small_data, tmp_path, capsys, no_model_loads):
    """similarities.npz is input: a file that is not what compare wrote is refused, naming it, before any encoding
    (of either contender) and before the --out folder is made."""
    stored = fake_run(tmp_path / "run")
    tamper(kind, stored, small_data)
    model = tmp_path / "other" / "model.ckpt"  # A needs encoding: B's file is still read first
    model.parent.mkdir()
    model.write_bytes(b"weights")
    out = tmp_path / "cmp"
    err = refused([str(model), str(tmp_path / "run"), "--tasks", "STSBenchmark", "--data-dir", str(small_data),
                   "--out", str(out)], capsys)  # fmt: skip
    assert str(stored) in err and "Fix:" in err
    assert not out.exists()
    # the same refusal is the SentembConfigError `compare` raises, whichever side holds the file
    args = argparse.Namespace(
        contenders=[str(tmp_path / "run"), str(model)],
        tasks="STSBenchmark",
        out=out,
        resamples=10,
        seed=1,
        level=0.95,
        batch_size=8,
        device="cpu",
        data_dir=str(small_data),
    )
    with pytest.raises(SentembConfigError, match="Fix:") as refusal:
        sentemb.compare.compare(args)
    assert str(stored) in str(refusal.value) and not out.exists()


SEED_SCORES = {  # {configuration: {seed: (STS-B test, STS16)}}; focal alone ran seed 5, infonce's seed 6 failed
    "infonce": {1: (80.1, 75.0), 2: (80.6, 76.2), 3: (79.9, 74.1), 4: (80.4, 75.5)},
    "focal": {1: (81.3, 75.3), 2: (81.5, 75.8), 3: (81.0, 74.9), 4: (81.6, 75.2), 5: (90.0, 60.0)},
}


def fake_seed_sweep(folder: Path) -> Path:
    """A sweep's job records (as tests/test_sweep.py's fake_sweep writes them), scored on STS-B and STS16 test."""
    jobs = [(loss, seed, scores) for loss, runs in SEED_SCORES.items() for seed, scores in runs.items()]
    for number, (loss, seed, (stsb, sts16)) in enumerate(jobs):
        write_record(folder / str(number), {"status": "ok", "message": "", "overrides": [f"loss={loss}",
                     f"seed={seed}"], "swept": {}, "seed": seed,
                     "metrics": {TEST_SPEARMAN: stsb, sts_test_metric("STS16"): sts16}})  # fmt: skip
    write_record(folder / str(len(jobs)), {"status": "failed", "message": "boom", "overrides": ["loss=infonce",
                 "seed=6"], "swept": {}, "seed": 6, "metrics": {}})  # fmt: skip
    return folder


def test_sweep_configurations_are_compared_by_the_paired_t_test_over_shared_seeds(tmp_path, capsys, no_model_loads):
    """Several seeds each: scipy's ttest_rel over the seeds both ran, Holm over the two tasks, separable at 0.05."""
    sweep = fake_seed_sweep(tmp_path / "sweep")
    result = compare([f"{sweep}:loss=infonce", f"{sweep}:loss=focal"], tmp_path / "cmp")
    assert [c["kind"] for c in result["contenders"]] == ["seeds", "seeds"]
    assert len(result["contenders"][0]["jobs"]) == 4 and len(result["contenders"][1]["jobs"]) == 5
    rows = {row["task"]: row for row in result["comparisons"][0]["rows"]}
    assert list(rows) == ["STS16", "STSBenchmark"], "the tasks every job was scored on, in STS_TASKS' order"
    shared = [1, 2, 3, 4]
    p = {}
    for index, task in enumerate(("STSBenchmark", "STS16")):
        a = [SEED_SCORES["infonce"][seed][index] for seed in shared]
        b = [SEED_SCORES["focal"][seed][index] for seed in shared]
        p[task] = float(ttest_rel(a, b).pvalue)
        row = rows[task]
        assert row["seeds"] == shared and row["n"] == 4
        assert row["p"] == p[task], "the same scipy call on the same numbers"
        assert row["difference"]["estimate"] == float(np.mean(np.subtract(a, b))), "the same subtraction and mean"
        every_b = [scores[index] for scores in SEED_SCORES["focal"].values()]
        assert row["b"]["estimate"] == float(np.mean(every_b)), "each side's mean is over all of its own seeds"
    # Holm over two tests by hand: the smaller p doubled, the larger one at least that, both at most 1
    low, high = sorted(p, key=p.get)
    holm = {low: min(1.0, 2 * p[low])}
    holm[high] = min(1.0, max(holm[low], p[high]))
    for task, row in rows.items():
        assert row["p_holm"] == holm[task], "the same two products and a max"
        assert row["separable"] is (holm[task] < 0.05)
    assert rows["STSBenchmark"]["separable"] is True and rows["STS16"]["separable"] is False
    assert result["procedure"]["test"].startswith("paired t-test over shared seeds")
    printed = capsys.readouterr().out
    assert "| STS-B |" in printed and "| yes |" in printed and "| no |" in printed
    assert (tmp_path / "cmp" / "compare.md").read_text().strip() in printed


def refusal_inputs(tmp_path: Path) -> dict[str, Path]:
    model = tmp_path / "a" / "model.ckpt"
    model.parent.mkdir()
    model.write_bytes(b"weights")
    other = tmp_path / "b" / "model.ckpt"
    other.parent.mkdir()
    other.write_bytes(b"weights")
    notes = tmp_path / "notes.txt"
    notes.write_text("not a checkpoint\n")
    return {"model": model, "other": other, "notes": notes, "sweep": fake_seed_sweep(tmp_path / "sweep")}


REFUSALS = {  # name: (arguments, what the message names)
    "a model and seeds": (["{model}", "{sweep}:loss=focal"], ["{model} is one model", "{sweep}:loss=focal is 5 runs"]),
    "a file that is not a checkpoint": (["{model}", "{notes}"], ["{notes} is a file but not a checkpoint"]),
    "a path that does not exist": (["{model}", "{tmp}/missing"], ["{tmp}/missing does not exist"]),
    "a configuration with no job": (["{sweep}:loss=mmhe", "{sweep}:loss=focal"], ["{sweep}:loss=mmhe: no finished"]),
    "jobs that differ in more than the seed": (["{sweep}", "{sweep}:loss=focal"], ["differ in loss, not only"]),
    "an unknown task": (["{model}", "{other}", "--tasks", "STSBenchmark,STS17"], ["unknown STS task(s) ['STS17']"]),
    "one contender": (["{model}"], ["only {model} given"]),
}


@pytest.mark.parametrize("case", REFUSALS)
def test_bad_input_is_refused_before_any_model_loads(case, tmp_path, small_data, capsys, no_model_loads):
    """Each refusal names the input and the fix, exits 1, and leaves no --out folder behind."""
    names = {**{key: str(value) for key, value in refusal_inputs(tmp_path).items()}, "tmp": str(tmp_path)}
    arguments, expected = REFUSALS[case]
    out = tmp_path / "cmp"
    err = refused([a.format(**names) for a in arguments] + ["--data-dir", str(small_data), "--out", str(out)], capsys)
    for text in expected:
        assert text.format(**names) in err, err
    assert "Fix:" in err
    assert not out.exists()


def test_an_existing_out_folder_is_refused_and_left_as_it_was(tmp_path, small_data, capsys, no_model_loads):
    """A comparison writes into a new folder: an existing one is named, refused and untouched."""
    inputs = refusal_inputs(tmp_path)
    out = tmp_path / "cmp"
    (out / "inner").mkdir(parents=True)
    (out / "compare.json").write_text('{"earlier": true}\n')
    before = tree(out)
    argv = [str(inputs["model"]), str(inputs["other"]), "--tasks", "STSBenchmark", "--data-dir", str(small_data)]
    argv += ["--out", str(out)]
    err = refused(argv, capsys)
    assert f"--out {out} exists" in err and "Fix: name a new --out folder" in err
    assert tree(out) == before
    # over seeds too
    sweep = inputs["sweep"]
    err = refused([f"{sweep}:loss=infonce", f"{sweep}:loss=focal", "--out", str(out)], capsys)
    assert f"--out {out} exists" in err and tree(out) == before


def evaluation(pooling: str, folder: Path, data_root: Path) -> dict:
    """`python -m sentemb.evaluate model=minilm pooling=<pooling>` on STS-B test, as a user runs it."""
    command = [sys.executable, "-m", "sentemb.evaluate", "model=minilm", f"pooling={pooling}", "tasks=STSBenchmark",
               "sts_splits=[test]", f"hydra.run.dir={folder}"]  # fmt: skip
    env = {**os.environ, "SENTEMB_DATA": str(data_root)}
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads((folder / "results.json").read_text())


@pytest.mark.slow  # real-model encoding of STS-B test twice, in subprocesses (~60-90 s on 2 cores)
def test_minilm_mean_pooling_is_told_apart_from_cls_pooling_on_stsb_test(
    tmp_path, data_root, capsys, no_model_loads
):  # fmt: skip
    """Two evaluation folders of model= sources (no checkpoint) are compared from their kept cosines alone: MiniLM
    mean pooling 82.03 vs CLS 73.50 on STS-B test, a difference the test pairs separate."""
    mean, cls = tmp_path / "mean", tmp_path / "cls"
    scored = {name: evaluation(name, folder, data_root) for name, folder in (("mean", mean), ("cls", cls))}
    for folder in (mean, cls):
        found = contender(str(folder))
        assert (found.model, found.cached) == (None, [folder / SIMILARITIES_NAME]), "a model= source: cosines only"

    result = compare([str(mean), str(cls), "--tasks", "STSBenchmark", "--data-dir", str(data_root)], tmp_path / "cmp")
    [row] = result["comparisons"][0]["rows"]
    assert row["n"] == 1379
    # the expected scores as printed, to 2 decimals: abs=0.01 covers that rounding
    assert row["a"]["estimate"] == pytest.approx(82.03, abs=0.01)
    assert row["b"]["estimate"] == pytest.approx(73.50, abs=0.01)
    for side, name in (("a", "mean"), ("b", "cls")):  # the same cosines, resamples and calls: the same floats
        assert row[side] == scored[name]["sts"]["STSBenchmark"]["intervals"]["test"]
    assert row["difference"]["low"] > 0, row["difference"]
    assert row["p"] < 0.05 and row["p_holm"] == row["p"] and row["separable"] is True

    # a task the folders hold no cosines for: refused by name, since a model= source names no weights to encode
    err = refused([str(mean), str(cls), "--tasks", "STSBenchmark,STS16", "--data-dir", str(data_root)], capsys)
    assert f"compare: {mean} holds no cosines for STS16 and names no model to encode them" in err and "Fix:" in err


# ---- written whole or not at all; inputs that are no score refused by file and key ----


class StoppedMidWrite(str):
    """The markdown of a comparison stopped (Ctrl-C, SIGTERM) once compare.json is written, before compare.md."""

    def __add__(self, other: str) -> str:
        raise KeyboardInterrupt


def test_a_comparison_stopped_part_way_leaves_no_folder_and_the_same_command_runs_again(
    tmp_path, capsys, monkeypatch, no_model_loads
):
    sweep = fake_seed_sweep(tmp_path / "sweep")
    argv = [f"{sweep}:loss=infonce", f"{sweep}:loss=focal"]
    real_markdown = sentemb.compare.comparison_markdown
    monkeypatch.setattr(sentemb.compare, "comparison_markdown", lambda result: StoppedMidWrite(real_markdown(result)))
    with pytest.raises(KeyboardInterrupt):
        sentemb.compare.main([*argv, "--out", str(tmp_path / "cmp")])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["sweep"], "no half folder (compare.json alone), no staging"
    monkeypatch.setattr(sentemb.compare, "comparison_markdown", real_markdown)
    result = compare(argv, tmp_path / "cmp")  # not refused as "exists"
    assert sorted(p.name for p in (tmp_path / "cmp").iterdir()) == ["compare.json", "compare.md"]
    assert result["comparisons"][0]["rows"]


def test_the_staging_folder_of_a_killed_comparison_goes_with_the_next_one(tmp_path, no_model_loads):
    from sentemb.common.published_files import HOST

    sweep = fake_seed_sweep(tmp_path / "sweep")
    dead = int(subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True).stdout)
    staged = tmp_path / f".cmp.{HOST}-{dead}-0123abcd.staging"  # what SIGKILL left of a comparison into cmp
    staged.mkdir()
    (staged / "compare.json").write_text("{}\n")
    compare([f"{sweep}:loss=infonce", f"{sweep}:loss=focal"], tmp_path / "cmp")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cmp", "sweep"]


@pytest.mark.parametrize("value", [True, None, "80.1"], ids=["true", "null", "a string"])
def test_a_recorded_test_score_that_is_no_number_is_refused_naming_the_file_and_key(
    value, tmp_path, capsys, no_model_loads
):
    sweep = fake_seed_sweep(tmp_path / "sweep")
    record = sweep / "2" / "metrics.json"  # infonce's seed 3
    written = json.loads(record.read_text())
    written["metrics"][sts_test_metric("STS16")] = value
    record.write_text(json.dumps(written))
    argv = [f"{sweep}:loss=infonce", f"{sweep}:loss=focal", "--out", str(tmp_path / "cmp")]
    err = refused(argv, capsys)
    assert f"{record}: metrics.{sts_test_metric('STS16')} is " in err and "a test score is a finite number" in err
    assert "Fix: leave STS16 out (--tasks)" in err and not (tmp_path / "cmp").exists()
    result = compare([*argv[:2], "--tasks", "STSBenchmark"], tmp_path / "cmp")  # the other task: compared
    assert [row["task"] for row in result["comparisons"][0]["rows"]] == ["STSBenchmark"]


def copied_run(tmp_path: Path) -> tuple[Path, Path]:
    """A finished run folder and its copy elsewhere (`cp -a`): the copy's record names the original's checkpoint."""
    original = tmp_path / "run"
    fake_run(original)
    (original / "checkpoints").mkdir()
    (original / "checkpoints" / "best-step4.ckpt").write_bytes(b"the original's weights")
    copy = tmp_path / "elsewhere" / "run2"
    shutil.copytree(original, copy, symlinks=True)
    return original, copy


def test_a_copied_run_folder_is_compared_with_its_own_checkpoint(tmp_path):
    original, copy = copied_run(tmp_path)
    assert json.loads((copy / "metrics.json").read_text())["metrics"]["best_checkpoint"].startswith(str(original))
    assert contender(str(copy)).model == ("checkpoint", copy / "checkpoints" / "best-step4.ckpt")
    assert contender(str(original)).model == ("checkpoint", original / "checkpoints" / "best-step4.ckpt")


def test_a_copied_run_folder_without_its_checkpoint_never_reads_the_originals(
    tmp_path, small_data, capsys, no_model_loads
):
    original, copy = copied_run(tmp_path)
    (copy / "checkpoints" / "best-step4.ckpt").unlink()  # the original's file still exists: never read in its place
    assert contender(str(copy)).model == ("checkpoint", copy / "checkpoints" / "best-step4.ckpt")
    argv = ["--tasks", "STSBenchmark", "--data-dir", str(small_data), "--out", str(tmp_path / "cmp")]
    err = refused([str(copy), str(original), *argv], capsys)  # no cosines kept: its weights must be encoded
    assert f"{copy}/checkpoints/best-step4.ckpt does not exist, and STSBenchmark must be encoded with it" in err
    record = json.loads((copy / "metrics.json").read_text())
    record["metrics"]["best_checkpoint"] = str(tmp_path / "weights" / "model.ckpt")  # not a run's checkpoints/
    (copy / "metrics.json").write_text(json.dumps(record))
    with pytest.raises(SentembConfigError, match=r"metrics\.json: metrics\.best_checkpoint=.*model\.ckpt is not a file "
                       r"of a run folder's checkpoints/"):  # fmt: skip
        contender(str(copy))


def test_resamples_beyond_what_memory_allows_are_refused_before_anything_is_allocated(
    tmp_path, small_data, capsys, monkeypatch, no_model_loads
):
    inputs = refusal_inputs(tmp_path)
    argv = [str(inputs["model"]), str(inputs["other"]), "--tasks", "STSBenchmark", "--data-dir", str(small_data)]
    err = refused([*argv, "--resamples", "100000000", "--out", str(tmp_path / "cmp")], capsys)
    assert "--resamples=100000000: the bootstrap of 200 pairs would need" in err
    assert "nothing was allocated. Fix: --resamples=1000 (the default" in err and not (tmp_path / "cmp").exists()
    monkeypatch.setattr(sentemb.eval.bootstrap, "allowed_bytes", lambda: 10 * 2**20)  # a machine with 20 MiB free
    err = refused([*argv, "--resamples", "5000", "--out", str(tmp_path / "cmp")], capsys)
    assert f"at most {10 * 2**20 // (16 * 200 + 32)} here" in err


def test_similarities_that_cannot_be_scored_are_refused_naming_the_file_or_the_model(
    tmp_path, small_data, capsys, monkeypatch
):
    # what `evaluate whitening=<identical lines>` kept: every cosine 0, so no Spearman (it printed "nan / no test")
    stored = fake_run(tmp_path / "run")
    data = {"STSBenchmark": load_sts_task(small_data / "senteval" / "downstream", "STSBenchmark", ("test",))}
    write_similarities(stored, data, {"STSBenchmark": {"test": np.zeros(len(data["STSBenchmark"]["test"].gold))}})
    model = tmp_path / "other" / "model.ckpt"
    model.parent.mkdir()
    model.write_bytes(b"weights")
    argv = ["--tasks", "STSBenchmark", "--data-dir", str(small_data), "--out", str(tmp_path / "cmp")]
    err = refused([str(tmp_path / "run"), str(model), *argv], capsys)
    assert f"{stored}: cosine/STSBenchmark/test" in err and "the same similarity" in err and "Fix:" in err

    class Collapsed:  # a model whose embeddings are all one vector
        def encode(self, sentences, batch_size=128, max_length=None, show_progress=False):
            return np.ones((len(sentences), 4), dtype=np.float32)

    monkeypatch.setattr(sentemb.compare, "load_model", lambda c, args: Collapsed())
    monkeypatch.setattr(sentemb.st_modules, "check_before_loading", lambda kind, path: None)  # a fake model's files
    other = tmp_path / "other2" / "model.ckpt"
    other.parent.mkdir()
    other.write_bytes(b"weights")
    assert sentemb.compare.main([str(model), str(other), *argv, "--device", "cpu"]) == 1  # encoded, then refused
    err = capsys.readouterr().err
    assert f"sentemb: compare: {model}, encoded now: STSBenchmark test" in err and "the same similarity" in err
    assert not (tmp_path / "cmp").exists()
