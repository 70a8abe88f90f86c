"""`python -m sentemb.mine`: the same negatives as sentence-transformers' `mine_hard_negatives` on the same model, a
file `data=labelled` reads and trains on, faiss against the exact search, seeded sampling, refusals before any model
loads, and an output written whole or not at all."""

from __future__ import annotations

import csv
import json
import random
from pathlib import Path

import numpy as np
import pytest
import torch

from sentemb.common.errors import SentembConfigError
from sentemb.common.hydra_plumbing import compose_config, resolved_container
from sentemb.common.paths import CONF_DIR
from sentemb.data.labelled import read_labelled
from sentemb.data.mining import GroupedPairs, mine_embeddings, mine_file
from sentemb.data.mining_files import write_rows
from sentemb.data.mining_options import MineOptions
from sentemb.mine import mine
from tests.test_labelled import stsb_rows, write_csv

PAIRS = 200
# the issue's check: top sampling, 3 negatives, range_max 20, relative_margin 0.05, n-tuple
ISSUE = ["mine.num_negatives=3", "mine.range_max=20", "mine.relative_margin=0.05", "mine.output=n-tuple"]


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory) -> Path:
    """A tiny random BERT saved as a Hugging Face folder (so the command and sentence-transformers load the same
    weights). Its word embeddings are N(0, 1) and its position and type embeddings zero: a freshly initialised BERT
    maps every sentence within cosine 0.96 of every other, where no candidate passes a 5% margin."""
    cfg = compose_config(CONF_DIR, "mine", ["model=tiny", "pooling=mean"])
    from sentemb.encoders.build import build_encoder

    torch.manual_seed(0)
    encoder = build_encoder(resolved_container(cfg.model), resolved_container(cfg.pooling), None)
    embeddings = encoder.backbone.embeddings
    with torch.no_grad():
        embeddings.position_embeddings.weight.zero_()
        embeddings.token_type_embeddings.weight.zero_()
        embeddings.word_embeddings.weight.normal_(0.0, 1.0)
    folder = tmp_path_factory.mktemp("tiny_model")
    encoder.backbone.save_pretrained(folder)
    encoder.tokenizer.save_pretrained(folder)
    return folder


def model_overrides(folder: Path) -> list[str]:
    return ["model=minilm", f"model.name_or_path={folder}", "pooling=mean"]


@pytest.fixture(scope="module")
def pairs_csv(tmp_path_factory, data_root) -> Path:
    rows = [[a, b] for a, b, _ in stsb_rows(data_root, PAIRS)]
    rows += rows[:3]  # repeated pairs: mined once, as sentence-transformers groups them
    return write_csv(tmp_path_factory.mktemp("pairs") / "pairs.csv", ["anchor", "positive"], rows)


@pytest.fixture(scope="module")
def sentence_transformer_model(tiny_folder):
    from sentemb.encoders.build import build_encoder
    from sentemb.export import sentence_transformer

    cfg = compose_config(CONF_DIR, "mine", model_overrides(tiny_folder))
    model, pooling = resolved_container(cfg.model), resolved_container(cfg.pooling)
    return sentence_transformer(build_encoder(model, pooling, None), model, pooling, None)


def st_mined(model, pairs: Path, **options) -> dict[tuple[str, str], tuple[str, ...]]:
    from datasets import Dataset
    from sentence_transformers.util import mine_hard_negatives

    with pairs.open(encoding="utf-8", newline="") as handle:
        rows = list(csv.reader(handle))[1:]
    dataset = Dataset.from_dict({"anchor": [r[0] for r in rows], "positive": [r[1] for r in rows]})
    mined = mine_hard_negatives(dataset, model, batch_size=32, verbose=False, **options)
    return grouped([list(row.values()) for row in mined])


def grouped(rows: list[list[str]]) -> dict[tuple[str, str], tuple[str, ...]]:
    """(anchor, positive) -> its negatives in order: an n-tuple row's, or its triplet rows' together."""
    found: dict[tuple[str, str], tuple[str, ...]] = {}
    for anchor, positive, *negatives in rows:
        found[(anchor, positive)] = found.get((anchor, positive), ()) + tuple(negatives)
    return found


def read_mined(path: Path) -> tuple[list[str], dict[tuple[str, str], tuple[str, ...]]]:
    with path.open(encoding="utf-8", newline="") as handle:
        header, *rows = list(csv.reader(handle))
    return header, grouped(rows)


def run_mine(overrides: list[str]) -> dict:
    return mine(compose_config(CONF_DIR, "mine", overrides))


def agreement(ours: dict, theirs: dict) -> float:
    """The share of rows (of either side) whose negatives are the same, in the same order."""
    keys = ours.keys() | theirs.keys()
    return sum(ours.get(key) == theirs.get(key) for key in keys) / len(keys)


def test_mine_writes_sentence_transformers_negatives_and_data_labelled_reads_them(
    tiny_folder, pairs_csv, sentence_transformer_model, tmp_path, command, capsys
):
    out = tmp_path / "mined.csv"
    command("mine", [*model_overrides(tiny_folder), f"data.path={pairs_csv}", f"out={out}", *ISSUE])
    printed = capsys.readouterr().out
    summary = json.loads(out.with_name("mined.csv.summary.json").read_text())
    assert f"mine: {summary['rows_written']} n-tuple rows written to {out}" in printed and "relative_margin" in printed
    header, ours = read_mined(out)
    theirs = st_mined(
        sentence_transformer_model, pairs_csv, num_negatives=3, range_max=20, relative_margin=0.05,
        sampling_strategy="top", output_format="n-tuple",
    )  # fmt: skip
    share = agreement(ours, theirs)
    print(f"same negatives as sentence-transformers: {share:.2%} of {len(ours.keys() | theirs.keys())} rows")
    assert share >= 0.99
    assert 0 < len(ours) < PAIRS  # some rows kept all 3 negatives, others were dropped as sentence-transformers drops
    assert header == ["anchor", "positive", "negative_1", "negative_2", "negative_3"]
    assert all(a != n and p != n for (a, p), negatives in ours.items() for n in negatives)
    assert set(summary["seconds"]) == {"encode", "search_and_select", "write", "total"}
    with pairs_csv.open(encoding="utf-8", newline="") as handle:
        distinct = {tuple(row) for row in list(csv.reader(handle))[1:]}
    assert summary["pairs_read"] == PAIRS + 3 and summary["pairs_mined"] == len(distinct) < PAIRS + 3
    assert summary["rows_written"] == summary["pairs_with_all_negatives"] == len(ours)
    assert summary["candidates_dropped"]["relative_margin"] > 0 and summary["candidates_dropped"]["positive"] > 0
    rows = read_labelled({"source": "file", "path": str(out)})  # data=labelled reads the file unchanged
    assert rows.roles == ["anchor", "positive", "hard_negative_1", "hard_negative_2", "hard_negative_3"]
    assert len(rows) == len(ours)


def test_random_sampling_is_seeded_and_is_sentence_transformers_under_the_same_seed(
    tiny_folder, pairs_csv, sentence_transformer_model, tmp_path
):
    base = [*model_overrides(tiny_folder), f"data.path={pairs_csv}", "mine.sampling=random", "mine.range_max=20"]
    for name, seed in (("a.csv", 7), ("b.csv", 7), ("c.csv", 8)):
        run_mine([*base, f"out={tmp_path / name}", f"seed={seed}"])
    first, again, other = (read_mined(tmp_path / name)[1] for name in ("a.csv", "b.csv", "c.csv"))
    assert first == again and first != other
    state = random.getstate()  # the process's random state, restored: other tests may draw from it
    try:
        random.seed(7)  # sentence-transformers samples with the global random.sample
        theirs = st_mined(sentence_transformer_model, pairs_csv, range_max=20, sampling_strategy="random")
    finally:
        random.setstate(state)
    share = agreement(first, theirs)
    print(f"random sampling, same negatives as sentence-transformers under the same seed: {share:.2%}")
    assert share >= 0.99


@pytest.mark.slow
def test_a_tiny_training_run_trains_on_the_mined_file(tiny_folder, pairs_csv, tmp_path, small_stsb):
    from tests.test_train import run

    out = tmp_path / "mined.csv"
    run_mine([*model_overrides(tiny_folder), f"data.path={pairs_csv}", f"out={out}", "mine.range_max=20"])
    metrics = run(
        ["model=tiny", "data=labelled", f"data.path={out}", "logger=csv", "data.batch_size=16",
         "trainer.max_steps=2", "eval.every_n_steps=2", "eval.at_start=false", f"eval.stsb_dir={small_stsb}"],
        tmp_path / "run",
    )  # fmt: skip
    assert np.isfinite(metrics["stsb/test/spearman"])


def grouped_random(count: int, dim: int, seed: int) -> tuple[GroupedPairs, np.ndarray, np.ndarray]:
    gen = np.random.default_rng(seed)
    anchors = [f"a{i}" for i in range(count)]
    positives = [f"p{i}" for i in range(count)]
    return GroupedPairs.of(anchors, positives), gen.normal(size=(count, dim)), gen.normal(size=(count, dim))


def test_faiss_and_the_chunked_exact_search_give_the_same_negatives():
    grouped, queries, corpus = grouped_random(300, 16, 0)
    options = dict(num_negatives=5, range_min=2, range_max=40, relative_margin=0.05, output="n-tuple")
    whole, _ = mine_embeddings(grouped, queries, corpus, MineOptions(chunk_size=4096, **options))
    chunked, _ = mine_embeddings(grouped, queries, corpus, MineOptions(chunk_size=7, **options))
    flat, _ = mine_embeddings(grouped, queries, corpus, MineOptions(faiss=True, chunk_size=64, **options))
    assert torch.equal(whole.indices, chunked.indices) and torch.equal(whole.indices, flat.indices)
    assert torch.allclose(whole.scores, flat.scores, atol=1e-5) and whole.dropped == flat.dropped


def test_faiss_missing_is_named_with_the_install(monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_faiss(name, *args, **kwargs):
        if name == "faiss":
            raise ImportError("no faiss")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_faiss)
    grouped, queries, corpus = grouped_random(20, 4, 1)
    with pytest.raises(SentembConfigError, match=r"faiss is not installed.*sentemb\[mine\].*mine.faiss=false"):
        mine_embeddings(grouped, queries, corpus, MineOptions(faiss=True, range_max=5))


REFUSALS = {
    r"mine.num_negatives=-1 must be a whole number in \[1, 100000\]. Fix: mine.num_negatives=3$": [
        "mine.num_negatives=-1"
    ],
    r"mine.range_min=-2 must be a whole number in \[0, 100000\]": ["mine.range_min=-2"],
    r"mine.range_min=20 >= mine.range_max=20": ["mine.range_min=20", "mine.range_max=20"],
    r"mine.num_negatives=5 > mine.range_max - mine.range_min = 4": ["mine.num_negatives=5", "mine.range_max=4"],
    "both set": ["mine.absolute_margin=0.1", "mine.relative_margin=0.05"],
    r"mine.relative_margin=-0.1 must be a number in \[0, 1\]": ["mine.relative_margin=-0.1"],
    r"mine.max_score=2 must be a number in \[-1, 1\]": ["mine.max_score=2"],
    "mine.sampling='best' is not one of top, random": ["mine.sampling=best"],
    "mine.output='pairs' is not one of triplet, n-tuple": ["mine.output=pairs"],
    "mine.faiss=maybe must be true or false": ["mine.faiss=maybe"],
    "mine.chunk_size=0 must be a whole number": ["mine.chunk_size=0"],
}


def test_every_bad_option_and_file_is_refused_before_any_model_loads(forbid_model_loading, pairs_csv, tmp_path):
    good = ["model=tiny", f"data.path={pairs_csv}", f"out={tmp_path / 'out.csv'}"]
    for message, overrides in REFUSALS.items():
        with pytest.raises(SentembConfigError, match=message):
            run_mine([*good, *overrides])
    (tmp_path / "bad.csv").write_text("anchor,positive\na man sings,a man is singing\nthe dog runs,\n")
    (tmp_path / "scored.csv").write_text("sentence1,sentence2,score\na,b,4.0\n")
    (tmp_path / "three.csv").write_text("q,pos,neg\na,b,c\n")
    (tmp_path / "exists.csv").write_text("mine\n")
    files = {
        r"bad.csv:3: column 'positive' is empty": [f"data.path={tmp_path / 'bad.csv'}"],
        r"data.path=\S+missing.csv does not exist": [f"data.path={tmp_path / 'missing.csv'}"],
        r"score column \(score\).*Fix: data.columns=\[sentence1,sentence2\]": [f"data.path={tmp_path / 'scored.csv'}"],
        r"3 text columns.*Fix: data.columns=\[q,pos\]": [f"data.path={tmp_path / 'three.csv'}"],
        r"its folder \S+ does not exist. Fix: mkdir": [f"out={tmp_path / 'nowhere' / 'out.csv'}"],
        "is the pairs file itself": [f"out={pairs_csv}"],
        "exists. Fix: overwrite=true": [f"out={tmp_path / 'exists.csv'}"],
        r"\.txt is not a format mining writes": [f"out={tmp_path / 'out.txt'}"],
        "data.path= is required": ["data.path=null"],
    }
    for message, overrides in files.items():
        with pytest.raises(SentembConfigError, match=message):
            run_mine([*good, *overrides])
    assert (tmp_path / "exists.csv").read_text() == "mine\n" and not (tmp_path / "out.csv").exists()


def test_the_command_line_refuses_with_the_fix(forbid_model_loading, command, pairs_csv, tmp_path):
    with pytest.raises(SystemExit, match=r"^sentemb: mine.range_min=30 >= mine.range_max=20.*Fix: "):
        command("mine", ["model=tiny", f"data.path={pairs_csv}", f"out={tmp_path / 'o.csv'}", "mine.range_min=30",
                         "mine.range_max=20"])  # fmt: skip


def failing_rows(count: int):
    for i in range(count):
        yield ["anchor", f"positive {i}", "negative"]
    raise RuntimeError("stopped mid-way")


def test_the_output_is_written_whole_or_not_at_all(tmp_path):
    out = tmp_path / "mined.csv"
    with pytest.raises(RuntimeError, match="mid-way"):
        write_rows(out, ["anchor", "positive", "negative"], failing_rows(50), overwrite=False)
    assert list(tmp_path.iterdir()) == []  # no partial file, no temporary file
    out.write_text("kept\n")
    with pytest.raises(RuntimeError, match="mid-way"):
        write_rows(out, ["anchor", "positive", "negative"], failing_rows(50), overwrite=True)
    assert out.read_text() == "kept\n" and list(tmp_path.iterdir()) == [out]
    target = tmp_path / "target.txt"
    target.write_text("not mine\n")
    link = tmp_path / "link.csv"
    link.symlink_to(target)
    write_rows(link, ["anchor", "positive", "negative"], [["a", "b", "c"]], overwrite=True)
    assert target.read_text() == "not mine\n" and not link.is_symlink()  # the link replaced, never written through
    assert link.read_text() == "anchor,positive,negative\na,b,c\n"


def hashed_embed(texts: list[str]) -> np.ndarray:
    """A model-free embedding (each text's own seeded vector): what `mine_file` takes besides an encoder."""
    return np.stack([np.random.default_rng(sum(map(ord, text))).normal(size=8) for text in texts]).astype(np.float32)


def test_mine_file_returns_the_summary_and_a_failure_leaves_an_existing_output_untouched(pairs_csv, tmp_path):
    out = tmp_path / "mined.jsonl"
    options = MineOptions(num_negatives=2, range_max=10, output="n-tuple")
    summary = mine_file(pairs_csv, out, hashed_embed, options)
    assert summary["rows_written"] == summary["pairs_with_all_negatives"] == summary["pairs_mined"]  # no rule drops
    assert read_labelled({"source": "file", "path": str(out)}).roles[2:] == ["hard_negative_1", "hard_negative_2"]
    before = out.read_bytes(), out.with_name("mined.jsonl.summary.json").read_bytes()

    def broken(texts: list[str]) -> np.ndarray:
        raise RuntimeError("the encoder failed mid-way")

    with pytest.raises(RuntimeError, match="mid-way"):
        mine_file(pairs_csv, out, broken, options, overwrite=True)
    assert (out.read_bytes(), out.with_name("mined.jsonl.summary.json").read_bytes()) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mined.jsonl", "mined.jsonl.summary.json"]
