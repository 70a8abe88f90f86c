"""SentEval's STS aggregates, alignment/uniformity, and `python -m sentemb.evaluate`."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import numpy as np
import pytest
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra

from sentemb.common.errors import SentembConfigError
from sentemb.common.metric_names import DEV_SPEARMAN_BEST_LOGGED
from sentemb.eval.bootstrap import Resampling
from sentemb.eval.geometry import alignment, uniformity
from sentemb.eval.similarities import SIMILARITIES_NAME, read_similarities
from sentemb.eval.sts import SentencePairs, load_sts_task, read_sts_subset, read_stsb_split, score_sts_task
from sentemb.eval.suite import evaluate, flat_metrics, resolve_tasks
from tests.conftest import CONF_DIR


def spearman_by_ranks(x, y) -> float:
    """Independent Spearman for tie-free data: 1 − 6 Σd² / (n(n² − 1)), ×100."""
    rx, ry = np.argsort(np.argsort(x)), np.argsort(np.argsort(y))
    n = len(x)
    return 100 * (1 - 6 * float(((rx - ry) ** 2).sum()) / (n * (n * n - 1)))


def embed_as_angle(sentences):
    """'a<θ>' embeds as (cos θ, sin θ), so the cosine of a pair with 'a0' is cos θ."""
    return np.array([[math.cos(float(s[1:])), math.sin(float(s[1:]))] for s in sentences])


def pairs(angles, gold):
    return SentencePairs(["a0"] * len(angles), [f"a{t}" for t in angles], np.asarray(gold, dtype=float))


def test_aggregates_all_mean_wmean():
    # cosine = cos θ decreases with θ; each subset's gold order is hand-set against it
    s1 = pairs([0.1, 0.5, 0.9, 1.3], [4.0, 3.0, 1.0, 2.0])
    s2 = pairs([0.2, 0.6, 1.0, 1.4, 1.5, 1.55], [5.0, 4.5, 3.5, 0.5, 1.5, 0.0])  # no ties across subsets
    result = score_sts_task({"s1": s1, "s2": s2}, embed_as_angle)
    cos1, cos2 = np.cos([0.1, 0.5, 0.9, 1.3]), np.cos([0.2, 0.6, 1.0, 1.4, 1.5, 1.55])
    r1, r2 = spearman_by_ranks(cos1, s1.gold), spearman_by_ranks(cos2, s2.gold)
    close = {"rel": 1e-9}  # float64: scipy's correlation of ranks vs the closed form, ~1e-14 apart
    assert result["subsets"]["s1"]["spearman"] == pytest.approx(r1, **close)
    assert result["subsets"]["s2"]["spearman"] == pytest.approx(r2, **close)
    agg = result["all"]["spearman"]
    assert agg["mean"] == pytest.approx((r1 + r2) / 2, **close)
    assert agg["wmean"] == pytest.approx((4 * r1 + 6 * r2) / 10, **close)
    pooled = spearman_by_ranks(np.concatenate([cos1, cos2]), np.concatenate([s1.gold, s2.gold]))
    assert agg["all"] == pytest.approx(pooled, **close)
    # 'all' pools the pairs, so it is neither average: the tables' number is not 'wmean'
    assert abs(agg["all"] - agg["wmean"]) > 1 and abs(agg["all"] - agg["mean"]) > 1


def test_a_file_without_a_scored_pair_is_refused_by_name(tmp_path):
    # no pair: no correlation and no interval; refused when read, before a model loads or a job trains
    (tmp_path / "STS.input.x.txt").write_text("a\tb\n", encoding="utf-8")
    (tmp_path / "STS.gs.x.txt").write_text("\n", encoding="utf-8")
    with pytest.raises(SentembConfigError, match=r"STS.gs.x.txt: no scored sentence pair in it. Fix"):
        read_sts_subset(tmp_path, "x")
    (tmp_path / "sts-test.csv").write_text("", encoding="utf-8")
    with pytest.raises(SentembConfigError, match=r"sts-test.csv: no scored sentence pair in it"):
        read_stsb_split(tmp_path / "sts-test.csv")


def test_sts_subset_skips_empty_gold_and_names_bad_lines(tmp_path):
    (tmp_path / "STS.input.x.txt").write_text("a  b\tc\nd\te\nf\tg\n", encoding="utf-8")
    (tmp_path / "STS.gs.x.txt").write_text("1.5\n\n4\n", encoding="utf-8")
    subset = read_sts_subset(tmp_path, "x")
    assert subset.first == ["a b", "f"] and subset.second == ["c", "g"] and subset.gold.tolist() == [1.5, 4.0]
    (tmp_path / "STS.input.x.txt").write_text("a\tc\nno tab here\nf\tg\n", encoding="utf-8")
    with pytest.raises(SentembConfigError, match=r"STS.input.x.txt:2: expected 2"):
        read_sts_subset(tmp_path, "x")


def test_missing_task_folder_names_the_file(tmp_path):
    with pytest.raises(SentembConfigError, match=r"STS13-en-test/STS.input.FNWN.txt does not exist"):
        load_sts_task(tmp_path, "STS13")


def test_unknown_task_lists_valid_ones():
    with pytest.raises(SentembConfigError, match="Valid: sts, transfer, all, STS12"):
        resolve_tasks("STS12,STS17")
    assert resolve_tasks("STS12, STSBenchmark,STS12") == ["STS12", "STSBenchmark"]


def test_alignment_and_uniformity_on_known_geometry():
    # alignment: pairs at angle θ on the unit circle are 2 − 2cos θ apart (squared)
    a = embed_as_angle(["a0", "a0"])
    b = embed_as_angle(["a1.0", "a0.5"])
    expected = ((2 - 2 * math.cos(1.0)) + (2 - 2 * math.cos(0.5))) / 2
    # float64: normalise, difference, norm squared vs 2 − 2cos θ, ~1e-16 apart
    assert alignment(3 * a, b) == pytest.approx(expected, rel=1e-9)
    # uniformity: the 4 corners of a square: 4 sides with d² = 2, 2 diagonals with d² = 4
    square = np.array([[1, 0], [0, 1], [-1, 0], [0, -1]], dtype=float)
    assert uniformity(square) == pytest.approx(math.log((4 * math.exp(-4) + 2 * math.exp(-8)) / 6), rel=1e-9)  # f64


def compose_eval(overrides):
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose("eval", overrides=overrides)


def test_evaluate_writes_results_for_a_tiny_model(tmp_path, data_root):
    senteval = data_root / "senteval" / "downstream"
    cfg = compose_eval(["model=tiny", "tasks=[STS16,STSBenchmark]", "sts_splits=[dev,test]"])
    results = evaluate(cfg, tmp_path)
    saved = json.loads((tmp_path / "results.json").read_text())
    assert set(saved["sts_table"]) == {"STS16", "STSBenchmark"}
    assert saved["sts_table"]["STS16"] == results["sts"]["STS16"]["all"]["spearman"]["all"]
    assert "| STS16 | STS-B | Avg. |" in (tmp_path / "results.md").read_text()
    assert saved["alignment_uniformity"]["positive_pairs"] > 0

    # every figure's interval: the table score itself, bounded, recomputed from the kept cosines with the same seed
    assert saved["intervals"] == {"resamples": 1000, "seed": 1234, "level": 0.95, "interval": "percentile"}
    assert set(saved["sts"]["STS16"]["intervals"]) == {"all"}
    assert set(saved["sts"]["STSBenchmark"]["intervals"]) == {"dev", "test"}
    for task, score in saved["sts_table"].items():
        interval = saved["sts_table_intervals"][task]
        assert interval["estimate"] == score and interval["low"] < score < interval["high"]
    stored = read_similarities(tmp_path / SIMILARITIES_NAME, {"STS16": load_sts_task(senteval, "STS16")})
    pairs = load_sts_task(senteval, "STS16")
    again = Resampling().spearman(
        np.concatenate(list(stored["STS16"].values())),
        np.concatenate([p.gold for p in pairs.values()]),
        [len(p.gold) for p in pairs.values()],
    )
    assert (again.low, again.high) == (
        saved["sts_table_intervals"]["STS16"]["low"],
        saved["sts_table_intervals"]["STS16"]["high"],
    )
    table = (tmp_path / "results.md").read_text()
    low, high = (
        saved["sts_table_intervals"]["STSBenchmark"]["low"],
        saved["sts_table_intervals"]["STSBenchmark"]["high"],
    )
    assert f"{saved['sts_table']['STSBenchmark']:.2f} [{low:.2f}, {high:.2f}]" in table
    assert "95% percentile bootstrap interval, 1000 resamples" in table
    assert set(saved["timing_s"]) == {"encode", "sts_scores", "intervals"}
    metrics = flat_metrics(saved)
    assert (metrics["eval/STS16_ci_low"], metrics["eval/STS16_ci_high"]) == (again.low, again.high)


def test_bad_interval_settings_fail_before_the_model(tmp_path, monkeypatch):
    import sentemb.encoders.models.backbones

    monkeypatch.setattr(sentemb.encoders.models.backbones, "tiny_bert", lambda **_: pytest.fail("model loaded first"))
    with pytest.raises(SentembConfigError, match=r"intervals.level=1.5: a confidence level in \(0, 1\).*Fix"):
        evaluate(compose_eval(["model=tiny", "tasks=STS16", "intervals.level=1.5"]), tmp_path)
    with pytest.raises(SentembConfigError, match=r"intervals.resamples=0: a positive whole number"):
        evaluate(compose_eval(["model=tiny", "tasks=STS16", "intervals.resamples=0"]), tmp_path)
    with pytest.raises(SentembConfigError, match=r"intervals: unknown key\(s\) \['method'\]"):
        evaluate(compose_eval(["model=tiny", "tasks=STS16", "+intervals.method=bca"]), tmp_path)
    assert not (tmp_path / "results.json").exists()


def test_checkpoint_evaluated_offline_gives_the_logged_dev_score(tiny_overrides, tmp_path):
    from sentemb.train import train
    from tests.conftest import compose_train

    # the full STS-B dev, as evaluate reads it (tiny_overrides score 200 pairs of it)
    full_dev = [o for o in tiny_overrides if not o.startswith("eval.stsb_dir=")]
    train_cfg = compose_train(full_dev, output_dir=tmp_path / "train")
    metrics = train(train_cfg)
    overrides = ["tasks=STSBenchmark", "sts_splits=[dev]", f"batch_size={train_cfg.eval.batch_size}"]
    cfg = compose_eval([f"checkpoint={metrics['best_checkpoint']}", *overrides])
    offline = evaluate(cfg, tmp_path / "eval")["sts"]["STSBenchmark"]["subsets"]["dev"]["spearman"]
    # exact: only dev's sentences, the training's eval batch size, CPU: the callback's computation, same weights.
    # (With more tasks the cache batches dev with other sentences; then expect ~1e-4 points, not equality.)
    assert offline == metrics[DEV_SPEARMAN_BEST_LOGGED]


def test_bad_checkpoint_path(tmp_path):
    with pytest.raises(SentembConfigError, match=r"none\.ckpt: no such checkpoint file"):
        evaluate(compose_eval([f"checkpoint={tmp_path}/none.ckpt", "tasks=STS12"]), tmp_path)


def test_evaluate_reads_data_before_loading_the_model(tmp_path, monkeypatch):
    import sentemb.encoders.models.backbones

    monkeypatch.setattr(sentemb.encoders.models.backbones, "tiny_bert", lambda **_: pytest.fail("model loaded first"))
    with pytest.raises(SentembConfigError, match="does not exist"):
        evaluate(compose_eval(["model=tiny", "tasks=STS12", f"paths.data_dir={tmp_path}"]), tmp_path / "out")


def test_figure_and_wandb_attachment(tmp_path, monkeypatch):
    from sentemb.runs.offline_wandb import summary

    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    overrides = ["model=tiny", "tasks=[STSBenchmark]", "sts_splits=[test]", "figure=true", "wandb_run_id=evaltest"]
    results = evaluate(compose_eval(overrides), tmp_path)
    png = Path(results["figure"]["path"])
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert sum(results["figure"]["pairs_per_bucket"].values()) == 1379, "every STS-B test pair is in one bucket"
    [log] = list(tmp_path.glob("wandb/offline-run-*-evaltest/run-evaltest.wandb"))
    deadline = time.monotonic() + 30  # W&B's service may still be flushing after finish()
    while "eval/STSBenchmark" not in (logged := summary(log)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert logged["eval/STSBenchmark"] == results["sts_table"]["STSBenchmark"], "the same float carried by W&B"


def test_unknown_transfer_mode_fails_before_the_model(tmp_path, monkeypatch):
    import sentemb.encoders.models.backbones

    monkeypatch.setattr(sentemb.encoders.models.backbones, "tiny_bert", lambda **_: pytest.fail("model loaded first"))
    with pytest.raises(SentembConfigError, match="mode='quick'"):
        evaluate(compose_eval(["model=tiny", "tasks=[TREC]", "mode=quick"]), tmp_path)


def npz_with(tmp_path: Path, members: dict[str, bytes]) -> Path:
    """An archive of .npy members given as bytes (a crafted header: no array of its size is ever made)."""
    import zipfile

    path = tmp_path / SIMILARITIES_NAME
    with zipfile.ZipFile(path, "w") as archive:
        for name, content in members.items():
            archive.writestr(f"{name}.npy", content)
    return path


def npy_header(descr: str, shape: tuple[int, ...], data: bytes = b"") -> bytes:
    import io

    buffer = io.BytesIO()
    np.lib.format.write_array_header_1_0(buffer, {"descr": descr, "fortran_order": False, "shape": shape})
    return buffer.getvalue() + data


def npy_bytes(array: np.ndarray) -> bytes:
    import io

    buffer = io.BytesIO()
    np.save(buffer, array)
    return buffer.getvalue()


TWO_PAIRS = SentencePairs(["a", "b"], ["c", "d"], np.array([1.0, 4.0]))


@pytest.mark.parametrize(
    ("entry", "header"),
    [("cosine/STSBenchmark/test", ("<f8", (10**10,))), ("pairs/STSBenchmark/test", ("<U64", (10**9,)))],
)
def test_an_npz_header_declaring_a_huge_array_is_refused_before_numpy_allocates_it(entry, header, tmp_path):
    """Issue 51, finding 13: a similarities.npz member whose header declares 1e10 values (80 GB) with 16 bytes
    behind it; bounded by what today's pairs need, refused naming the file and the entry."""
    from sentemb.eval.similarities import pairs_digest

    members = {
        "pairs/STSBenchmark/test": npy_bytes(np.asarray(pairs_digest(TWO_PAIRS))),
        "cosine/STSBenchmark/test": npy_bytes(np.array([0.5, 0.25])),
    }
    members[entry] = npy_header(*header, data=b"\0" * 16)
    path = npz_with(tmp_path, members)
    with pytest.raises(SentembConfigError, match=rf"^{path}: {entry} declares shape .*Fix: "):
        read_similarities(path, {"STSBenchmark": {"test": TWO_PAIRS}})


def test_stored_cosines_that_are_all_equal_are_refused_not_scored(tmp_path):
    """All-zero cosines (what a NaN whitening used to store): no Spearman to compare, refused naming the entry."""
    from sentemb.eval.scorable import UndefinedScore
    from sentemb.eval.similarities import pairs_digest

    members = {"pairs/STSBenchmark/test": npy_bytes(np.asarray(pairs_digest(TWO_PAIRS)))}
    path = npz_with(tmp_path, {**members, "cosine/STSBenchmark/test": npy_bytes(np.zeros(2))})
    with pytest.raises(UndefinedScore, match=rf"^{path}: cosine/STSBenchmark/test: .*the same similarity"):
        read_similarities(path, {"STSBenchmark": {"test": TWO_PAIRS}})
    path = npz_with(tmp_path, {**members, "cosine/STSBenchmark/test": npy_bytes(np.array([0.5, 0.25]))})
    assert read_similarities(path, {"STSBenchmark": {"test": TWO_PAIRS}})["STSBenchmark"]["test"].tolist() == [
        0.5,
        0.25,
    ]
