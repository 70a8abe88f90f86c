"""Labelled data: every format and column convention read, every bad row refused naming file and line before a model
loads, the built-in sets, hard negatives as extra columns (= a naive loop), duplicates masked, real Trainer runs."""

from __future__ import annotations

import csv
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from omegaconf import OmegaConf
from torch.utils.data import DataLoader

from sentemb.common.errors import SentembConfigError
from sentemb.data.datamodule import LabelledDataModule
from sentemb.data.labelled import ABSENT, read_labelled, text_id
from sentemb.data.sets.nli import NLI_COLUMNS
from sentemb.data.views import ViewCollator
from sentemb.losses import build
from sentemb.losses.inputs import LossInputs, duplicate_mask
from sentemb.training.checks import prepare_run
from sentemb.training.module import SentembModule
from tests.conftest import compose_train
from tests.test_train import run


def stsb_rows(data_root: Path, count: int) -> list[tuple[str, str, str]]:
    """(sentence1, sentence2, score) of STS-B train's first `count` pairs."""
    lines = (data_root / "senteval/downstream/STS/STSBenchmark/sts-train.csv").read_text(encoding="utf-8").splitlines()
    return [(f[5], f[6], f[4]) for f in (line.split("\t") for line in lines[:count])]


def write_csv(path: Path, header: list[str], rows: list[list[str]], delimiter: str = ",") -> Path:
    with path.open("w", encoding="utf-8", newline="") as handle:
        writer = csv.writer(handle, delimiter=delimiter)
        writer.writerow(header)
        writer.writerows(rows)
    return path


@pytest.fixture
def triplets_csv(tmp_path: Path, data_root: Path) -> Path:
    """64 rows of anchor,positive,negative: an STS-B pair and another row's first sentence as hard negative."""
    pairs = stsb_rows(data_root, 64)
    rows = [[a, b, pairs[(i + 7) % len(pairs)][0]] for i, (a, b, _) in enumerate(pairs)]
    return write_csv(tmp_path / "triplets.csv", ["anchor", "positive", "negative"], rows)


# ---- formats and columns


def test_every_format_reads_the_same_rows(tmp_path):
    rows = [["a dog runs", "a dog is running", "a cat sleeps"], ["it rains", "rain falls", "the sun shines"]]
    header = ["anchor", "positive", "negative"]
    files = {
        "csv": write_csv(tmp_path / "t.csv", header, rows),
        "tsv": write_csv(tmp_path / "t.tsv", header, rows, "\t"),
        "jsonl": tmp_path / "t.jsonl",
        "parquet": tmp_path / "t.parquet",
    }
    files["jsonl"].write_text("\n".join(json.dumps(dict(zip(header, r, strict=True))) for r in rows) + "\n")
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({name: [r[i] for r in rows] for i, name in enumerate(header)}), files["parquet"])
    for kind, path in files.items():
        labelled = read_labelled({"path": str(path)})
        assert labelled.texts == tuple([r[i] for r in rows] for i in range(3)), kind
        assert labelled.roles == ["anchor", "positive", "hard_negative_1"] and labelled.scores is None, kind


def test_columns_are_named_or_taken_in_order_and_a_score_column_makes_scored_pairs(tmp_path):
    path = write_csv(tmp_path / "s.csv", ["id", "sentence1", "sentence2", "score"], [["1", "a b", "c d", "4"]])
    with pytest.raises(SentembConfigError, match="data.score_range is not set"):
        read_labelled({"path": str(path), "columns": ["sentence1", "sentence2", "score"]})
    scored = read_labelled({"path": str(path), "columns": ["sentence2", "sentence1", "score"], "score_range": [0, 5]})
    assert scored.texts == (["c d"], ["a b"]) and scored.scores == [0.8]
    # every column read: id would be the anchor (a scored row may carry hard negatives), and its numbers are refused
    with pytest.raises(SentembConfigError, match=r"every value of column 'id' \(1 rows read\) is a number"):
        read_labelled({"path": str(path), "score_range": [0, 5]})
    with pytest.raises(SentembConfigError, match="'query', which the file does not have"):
        read_labelled({"path": str(path), "columns": ["query", "sentence1"]})


BAD_ROWS = {
    "an empty text": ("anchor,positive\na,b\nc,\n", "t.csv:3: column 'positive' is empty"),
    "a blank text": ("anchor,positive\na,b\n   ,d\n", "t.csv:3: column 'anchor' is empty"),
    "too many fields": ("anchor,positive\na,b\nc,d,e\n", "t.csv:3: 3 fields, but the header has 2"),
    "too few fields": ("anchor,positive,negative\na,b,c\nd,e\n", "t.csv:3: 2 fields, but the header has 3"),
    "a score not a number": ("s1,s2,score\na,b,1\nc,d,high\n", "t.csv:3: score 'high' is not a finite number"),
    "a nan score": ("s1,s2,score\na,b,nan\n", "t.csv:2: score 'nan' is not a finite number"),
    "a score out of range": ("s1,s2,score\na,b,1\nc,d,5.5\n", r"t.csv:3: score '5.5' is not a finite number in"),
    "one column": ("anchor\na\n", "at least an anchor and a positive column"),
    "a header alone": ("anchor,positive\n", "the header is there but no row"),
}


@pytest.mark.parametrize("case", list(BAD_ROWS))
def test_every_bad_row_is_refused_with_file_and_line(case, tmp_path):
    text, message = BAD_ROWS[case]
    (tmp_path / "t.csv").write_text(text, encoding="utf-8")
    with pytest.raises(SentembConfigError, match=message) as caught:
        read_labelled({"path": str(tmp_path / "t.csv"), "score_range": [0, 5]})
    assert "Fix:" in str(caught.value)


def test_bad_json_lines_and_parquet_rows_are_named(tmp_path):
    (tmp_path / "t.jsonl").write_text('{"anchor": "a", "positive": "b"}\n["a", "b"]\n')
    with pytest.raises(SentembConfigError, match=r"t.jsonl:2: a JSON list, not an object"):
        read_labelled({"path": str(tmp_path / "t.jsonl")})
    (tmp_path / "t.jsonl").write_text('{"anchor": "a", "positive": "b"}\n{"anchor": "c"}\n')
    with pytest.raises(SentembConfigError, match=r"t.jsonl:2: the object's keys differ .* it lacks 'positive'"):
        read_labelled({"path": str(tmp_path / "t.jsonl")})
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"anchor": ["a", "b"], "positive": ["c", None]}), tmp_path / "t.parquet")
    with pytest.raises(SentembConfigError, match=r"t.parquet, row 2: column 'positive' is missing"):
        read_labelled({"path": str(tmp_path / "t.parquet")})
    (tmp_path / "t.txt").write_text("a,b\n")
    with pytest.raises(SentembConfigError, match="is not one"):
        read_labelled({"path": str(tmp_path / "t.txt")})


def test_a_bad_row_is_refused_before_any_model_loads(tmp_path, monkeypatch):
    (tmp_path / "t.csv").write_text("anchor,positive\n" + "a,b\n" * 40 + "c,\n", encoding="utf-8")

    def no_model(*args, **kwargs):
        raise AssertionError("a model was built before the data was checked")

    monkeypatch.setattr(SentembModule, "from_config", no_model)
    cfg = compose_train(["model=tiny", "data=labelled", f"data.path={tmp_path / 't.csv'}", "data.batch_size=8"])
    with pytest.raises(SentembConfigError, match=r"t.csv:42: column 'positive' is empty"):
        prepare_run(cfg)


# ---- the built-in sets


def test_built_in_sets_have_the_documented_rows(data_root):
    root = str(data_root / "senteval" / "downstream")
    stsb = read_labelled({"source": "stsb_train", "path": root})
    assert len(stsb) == 5749 and stsb.scores is not None and min(stsb.scores) == 0.0 and max(stsb.scores) == 1.0
    sick = read_labelled({"source": "sick_nli", "path": root})
    assert len(sick) == 1299 and sum(t is not None for t in sick.texts[2]) == 259
    # the hard negative is a contradiction of the anchor, whichever side of the SICK pair it stood on
    assert all(n is None or n not in (a, p) for a, p, n in zip(*sick.texts, strict=True))
    mrpc = read_labelled({"source": "mrpc", "path": root})
    assert len(mrpc) == 2753 and mrpc.roles == ["anchor", "positive"]
    assert "docs/labelled.md" in Path("conf/data/labelled.yaml").read_text()


def test_the_nli_file_is_read_by_its_header_and_its_absence_names_the_download(tmp_path):
    head = "sent0,sent1,hard_neg\n" + (
        '"One of our number will carry out your instructions minutely.","A member of my team will execute your '
        'orders with immense precision.","We have no one free at the moment so you have to take action yourself."\n'
        "How do you know? All this is their information again.,This information belongs to them.,They have no "
        "information at all.\n"
    )
    (tmp_path / "nli_for_simcse.csv").write_text(head, encoding="utf-8")
    nli = read_labelled({"source": "nli", "path": str(tmp_path / "nli_for_simcse.csv")})
    assert len(nli) == 2 and nli.hard_negatives == 1 and nli.texts[1][1] == "This information belongs to them."
    (tmp_path / "other.csv").write_text("a,b,c\nx,y,z\n")
    with pytest.raises(SentembConfigError, match="no column 'sent0', 'sent1', 'hard_neg'"):
        read_labelled({"source": "nli", "path": str(tmp_path / "other.csv")})
    with pytest.raises(SentembConfigError, match="nli_for_simcse.csv"):
        read_labelled({"source": "nli", "path": str(tmp_path / "missing.csv")})
    assert NLI_COLUMNS == ("sent0", "sent1", "hard_neg")


# ---- the loss with hard negatives and duplicates masked


def naive_infonce(h1, h2, hard, tau, weight=0.0, excluded=None):
    """Supervised SimCSE straight from its equation: for each anchor i, −log e^{s_ii/τ} / Σ_j e^{l_ij}, the j running
    over [positives; hard negatives], l_ij = s_ij/τ (+ w for i's own hard negative), excluded j left out."""
    n, total = h1.shape[0], 0.0
    h1, h2, hard = h1.detach(), h2.detach(), [h.detach() for h in hard]
    candidates = torch.cat([h2, *hard])
    for i in range(n):
        denominator = 0.0
        for j in range(candidates.shape[0]):
            if excluded is not None and excluded[i, j]:
                continue
            logit = float(F.cosine_similarity(h1[i], candidates[j], dim=0)) / tau
            if j >= n and (j - n) % n == i:
                logit += weight
            denominator += math.exp(logit)
        total += -float(F.cosine_similarity(h1[i], h2[i], dim=0)) / tau + math.log(denominator)
    return total / n


@pytest.mark.parametrize("weight", [0.0, 0.7])
@pytest.mark.parametrize("blocks", [1, 2])
def test_infonce_with_hard_negatives_equals_the_loop(weight, blocks):
    torch.manual_seed(0)
    z1, z2 = torch.randn(5, 8, dtype=torch.float64), torch.randn(5, 8, dtype=torch.float64)
    hard = [torch.randn(5, 8, dtype=torch.float64) for _ in range(blocks)]
    loss = build("infonce", tau=0.1, hard_negative_weight=weight)
    got = loss(z1, z2, hard_negatives=tuple(hard)).loss
    # float64 on both sides; the loop sums exp in another order: 1e-12
    assert abs(float(got) - naive_infonce(z1, z2, hard, 0.1, weight)) < 1e-12


def naive_duplicates(ids):
    """The masking rule, one candidate at a time."""
    n, views = len(ids), len(ids[0])
    columns = [(row, view) for view in range(1, views) for row in range(n)]
    mask = []
    for i in range(n):
        line = []
        for row, view in columns:
            text = ids[row][view]
            own = view == 1 and row == i
            masked = text == ABSENT or text in (ids[i][0], ids[i][1]) or (view == 1 and ids[row][0] == ids[i][0])
            line.append(masked and not own)
        mask.append(line)
    return torch.tensor(mask)


def test_duplicates_are_masked_as_the_rule_says():
    a, b, c, d, e = (text_id(t) for t in "abcde")
    ids = [
        [a, b, c],  # row 0
        [a, d, e],  # a duplicated anchor: d is another positive of a
        [c, e, b],  # b, row 0's positive, is this row's hard negative
        [d, a, ABSENT],  # a hard negative this row lacks
    ]
    tensor = torch.tensor(ids)
    views = [torch.randn(4, 3) for _ in range(3)]  # the mask reads no embedding
    inputs = LossInputs(
        anchors=views[0],
        positives=views[1],
        hard_negatives=(views[2],),
        absent=tensor[:, 2:] == ABSENT,
        duplicates=duplicate_mask(tensor),
    )
    got = inputs.candidate_exclusion()  # the duplicates' and the absent hard negatives' one mask
    assert torch.equal(got, naive_duplicates(ids))
    assert got[0, 1] and got[1, 0] and got[0, 4 + 2] and got[:, 4 + 3].all() and not got.diagonal().any()


def labelled_batch(module: SentembModule, path: Path, size: int, **options) -> dict[str, torch.Tensor]:
    data = LabelledDataModule(str(path), module.encoder.tokenizer, batch_size=size, shuffle=False, **options)
    data.setup()
    return next(iter(DataLoader(data.train_set, batch_size=size, collate_fn=ViewCollator(module.encoder.tokenizer))))


def test_the_step_scores_anchors_against_positives_and_hard_negatives_with_duplicates_masked(tmp_path):
    rows = [
        ["a man plays a guitar", "a person plays music", "a man sleeps"],
        ["a man plays a guitar", "someone strums a guitar", "nobody plays"],  # a duplicated anchor
        ["the cat sits", "a cat is sitting", "a person plays music"],  # row 0's positive as hard negative
        ["stocks fell", "markets dropped", "stocks rose"],
    ]
    path = write_csv(tmp_path / "t.csv", ["anchor", "positive", "negative"], rows)
    cfg = compose_train(["model=tiny", "model.dropout=0.0", "loss.hard_negative_weight=0.5"], tmp_path)
    torch.manual_seed(0)
    module = SentembModule.from_config(cfg)
    batch = labelled_batch(module, path, 4)
    assert set(batch) >= {"positive_input_ids", "hard_negative_1_input_ids", "text_ids"}
    _, total, _ = module.step_loss(batch)
    views = module.encoder.training_views(batch)
    excluded = torch.zeros(4, 8, dtype=torch.bool)
    excluded[0, 1] = excluded[1, 0] = excluded[0, 6] = True  # the other positive of the anchor; row 0's positive
    expected = naive_infonce(views.z1.double(), views.z2.double(), [views.embeddings[2].double()], 0.05, 0.5, excluded)
    # float32 step against the float64 loop on the same embeddings: 1e-5
    assert abs(float(total.detach()) - expected) < 1e-5


# ---- refusals against the run


def test_the_data_and_the_loss_must_fit(tmp_path, triplets_csv, data_root):
    pairs = write_csv(tmp_path / "p.csv", ["anchor", "positive"], [["a b", "c d"]] * 20)
    refusals = {
        "barlow takes no extra negatives": ["loss=barlow", f"data.path={triplets_csv}"],
        "loss=infonce would read the pairs as positives": ["data=stsb_train"],
        "loss=cosent learns from scored pairs": ["loss=cosent", f"data.path={pairs}"],
        "fewer than one batch": [f"data.path={pairs}", "data.batch_size=32"],
        "cannot make the negation view": ["auxiliary=sncse", f"data.path={pairs}"],
    }
    for message, overrides in refusals.items():
        data = [] if any(o.startswith("data=") for o in overrides) else ["data=labelled"]
        size = [] if any(o.startswith("data.batch_size") for o in overrides) else ["data.batch_size=8"]
        cfg = compose_train(["model=tiny", *data, *size, *overrides], tmp_path)
        with pytest.raises(SentembConfigError, match=message):
            prepare_run(cfg)


# ---- real Trainer runs


def test_the_readmes_command_trains_on_your_own_triplets_csv(tmp_path, data_root):
    """`python -m sentemb.train data=labelled data.path=<triplets.csv> model=tiny`, as the README shows it (run in a
    fresh folder: its outputs/ and offline W&B run land there)."""
    pairs = stsb_rows(data_root, 128)
    rows = [[a, b, pairs[(i + 7) % 128][0]] for i, (a, b, _) in enumerate(pairs)]  # 2 batches of the default 64
    path = write_csv(tmp_path / "triplets.csv", ["anchor", "positive", "negative"], rows)
    readme = (Path(__file__).parent.parent / "README.md").read_text(encoding="utf-8")
    command = "python -m sentemb.train data=labelled data.path=<triplets.csv> model=tiny"
    assert command in readme
    words = [sys.executable, *command.replace("<triplets.csv>", path.name).split()[1:]]  # relative to the cwd
    env = {**os.environ, "WANDB_MODE": "offline", "PYTHONPATH": str(Path(__file__).parent.parent)}
    result = subprocess.run(words, cwd=tmp_path, capture_output=True, text=True, timeout=600, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "STS-B test Spearman" in result.stdout
    assert "views anchor, positive, hard_negative_1" in result.stdout + result.stderr  # read as triplets
    (saved,) = (tmp_path / "outputs").rglob(".hydra/config.yaml")  # the run's config names the file read, absolute
    assert OmegaConf.load(saved).data.path == str(path)


def test_training_on_sick_nli_says_its_sick_scores_are_in_domain(tmp_path, small_stsb):
    metrics = run(
        ["data=sick_nli", "model=tiny", "logger=csv", "data.batch_size=16", "trainer.max_steps=3",
         "eval.every_n_steps=3", "eval.at_start=false", f"eval.stsb_dir={small_stsb}"],
        tmp_path,
    )  # fmt: skip
    assert math.isfinite(metrics["stsb/test/spearman"]) and "SICK-R" in metrics["in_domain"]
    # the evaluation of its checkpoint says so too, read from the run's .hydra/config.yaml (which the job writes)
    from sentemb.common.hydra_plumbing import compose_config
    from sentemb.common.paths import CONF_DIR
    from sentemb.eval.suite import evaluate

    (tmp_path / ".hydra").mkdir()
    (tmp_path / ".hydra" / "config.yaml").write_text("data:\n  source: sick_nli\n  path: /somewhere\n")

    overrides = [f"checkpoint={metrics['best_checkpoint']}", "tasks=[STS12]"]
    results = evaluate(compose_config(CONF_DIR, "eval", overrides, tmp_path / "eval"), tmp_path / "eval")
    assert "SICK-R" in results["in_domain"] and "in-domain" in (tmp_path / "eval" / "results.md").read_text()


TINY_PRESETS = {  # the data each preset trains on
    "labelled/cosent_minilm_tiny": "stsb_train",
    "labelled/angle_minilm_tiny": "stsb_train",
    "labelled/sup_simcse_minilm_tiny": "sick_nli",
    "labelled/sup_simcse_bert_base_tiny": "nli",
}


@pytest.mark.parametrize(
    "preset",
    [p if p == "labelled/cosent_minilm_tiny" else pytest.param(p, marks=pytest.mark.slow) for p in TINY_PRESETS],
)
def test_every_labelled_tiny_preset_trains(preset, tmp_path, data_root, small_stsb):
    extra = []
    if TINY_PRESETS[preset] == "nli":  # SimCSE's file is not reachable here: 64 rows of its shape
        pairs = stsb_rows(data_root, 64)
        rows = [[a, b, pairs[(i + 3) % 64][1]] for i, (a, b, _) in enumerate(pairs)]
        extra = [f"data.path={write_csv(tmp_path / 'nli_for_simcse.csv', list(NLI_COLUMNS), rows)}"]
    metrics = run(
        [f"experiment={preset}", *extra, "logger=csv", "eval.at_start=false", f"eval.stsb_dir={small_stsb}"],
        tmp_path / "run",
    )
    assert math.isfinite(metrics["stsb/test/spearman"])
    assert ("in_domain" in metrics) == (TINY_PRESETS[preset] in ("stsb_train", "sick_nli"))
