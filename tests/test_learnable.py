"""Issue 62: rows a loss cannot learn from, settings a job would not use, and parts that met only at the first step
(loss=sum on triplets, AnglE on SARCSE's width, a streamed file shorter than a batch) refused or working before the
run; each crafted input is written here."""

from __future__ import annotations

import math
import random
from pathlib import Path

import pytest
import torch

from sentemb.common.errors import SentembConfigError
from sentemb.data.labelled import text_id
from sentemb.losses.base import IN_BATCH_NEGATIVES
from sentemb.losses.inputs import duplicate_mask
from sentemb.losses.registry import available, learning_need, loss_config
from sentemb.training.checks import prepare_run
from sentemb.training.learnable import no_usable_negative
from sentemb.training.module import SentembModule
from tests.conftest import compose_train
from tests.test_labelled import labelled_batch, write_csv
from tests.test_train import run

# the registry's losses that learn from in-batch negatives (what each declares: `learns_from`)
NEGATIVES_LOSSES = [name for name in available() if learning_need(loss_config(name)) == IN_BATCH_NEGATIVES]


def prepared(overrides: list[str], tmp_path: Path) -> None:
    """prepare_run of a labelled job on model=tiny (batches of 8 unless given)."""
    data = [] if any(o.startswith("data=") for o in overrides) else ["data=labelled"]
    size = [] if any(o.startswith("data.batch_size") for o in overrides) else ["data.batch_size=8"]
    prepare_run(compose_train(["model=tiny", *data, *size, *overrides], tmp_path))


def one_anchor(tmp_path: Path) -> Path:
    return write_csv(
        tmp_path / "one_anchor.csv", ["anchor", "positive"], [["one anchor", f"pos {i}"] for i in range(16)]
    )


def distinct(tmp_path: Path, rows: int = 16) -> Path:
    return write_csv(tmp_path / "pairs.csv", ["anchor", "positive"], [[f"anchor {i}", f"pos {i}"] for i in range(rows)])


# ---- finding 2: rows the loss cannot learn from


@pytest.mark.parametrize("loss", NEGATIVES_LOSSES)
def test_one_anchor_text_is_refused_before_any_model_loads(loss, tmp_path, forbid_model_loading):
    with pytest.raises(SentembConfigError, match=r"one_anchor\.csv: .*every candidate is masked as a duplicate"):
        prepared([f"data.path={one_anchor(tmp_path)}", f"loss={loss}"], tmp_path)


def test_such_rows_train_at_exactly_zero_and_the_control_does_not(tmp_path):
    """Why it is refused: the step's loss on those rows is 0.0; on distinct anchors it is not."""
    torch.manual_seed(0)
    module = SentembModule.from_config(compose_train(["model=tiny", "data=labelled"], tmp_path))
    assert float(module.step_loss(labelled_batch(module, one_anchor(tmp_path), 8))[1].detach()) == 0.0
    assert float(module.step_loss(labelled_batch(module, distinct(tmp_path), 8))[1].detach()) > 0.1


def test_swapped_pairs_leave_no_negative_and_controls_pass(tmp_path, forbid_model_loading):
    swapped = write_csv(tmp_path / "swapped.csv", ["anchor", "positive"], [["a", "b"], ["b", "a"]] * 8)
    with pytest.raises(SentembConfigError, match="2 distinct anchors, 2 distinct positives.*no negative to contrast"):
        prepared([f"data.path={swapped}"], tmp_path)
    same = one_anchor(tmp_path)
    triplets = write_csv(
        tmp_path / "t.csv", ["anchor", "positive", "negative"], [["one anchor", f"pos {i}", "other"] for i in range(16)]
    )
    for controls in (
        [f"data.path={distinct(tmp_path)}"],
        [f"data.path={triplets}"],  # a hard negative is a negative
        [f"data.path={same}", "loss=barlow"],  # no negatives needed
        [f"data.path={same}", "negatives=momentum"],  # the queue's negatives are not masked
        [f"data.path={same}", "loss=paradigm", "loss.convention=reference"],  # no exclusions: nothing is masked
    ):
        prepared(controls, tmp_path)


def usable_by_the_mask(rows: list[tuple[str, ...]]) -> bool:
    """Brute force: all rows in one batch (the mask of a pair of rows depends on those two alone), some candidate
    column other than the anchor's own positive left unmasked by the step's own `duplicate_mask`."""
    ids = torch.tensor([[text_id(text) for text in row] for row in rows])
    masked = duplicate_mask(ids)
    masked[:, : len(rows)].fill_diagonal_(True)  # the diagonal is the positive, not a negative
    return not bool(masked.all())


def test_the_rule_agrees_with_the_steps_duplicate_mask_on_random_rows():
    draw = random.Random(0)
    for trial in range(400):
        width, count = draw.choice((2, 3)), draw.randint(2, 6)
        rows = [tuple(draw.choice("abcd"[: draw.randint(1, 4)]) for _ in range(width)) for _ in range(count)]
        columns = list(zip(*rows, strict=True))
        reason = no_usable_negative(columns[0], columns[1], columns[2:])
        assert (reason is None) == usable_by_the_mask(rows), (trial, rows, reason)


@pytest.mark.parametrize("loss", ["cosent", "angle"])
def test_equal_scores_are_refused_for_ranking_losses_and_trained_by_the_regression(loss, tmp_path):
    rows = [[f"s {i}", f"t {i}", "3"] for i in range(16)]
    equal = write_csv(tmp_path / "equal.csv", ["sentence1", "sentence2", "score"], rows)
    with pytest.raises(SentembConfigError, match=r"equal\.csv: .*all 16 scores are equal: no pair ranks above another"):
        prepared([f"data.path={equal}", f"loss={loss}", "data.score_range=[0,5]"], tmp_path)
    prepared([f"data.path={equal}", "loss=cosine_mse", "data.score_range=[0,5]"], tmp_path)  # a regression target
    rows[0][2] = "4"
    ranked = write_csv(tmp_path / "ranked.csv", ["sentence1", "sentence2", "score"], rows)
    prepared([f"data.path={ranked}", f"loss={loss}", "data.score_range=[0,5]"], tmp_path)


# ---- finding 4: settings a job would not use


def test_settings_a_job_would_not_use_are_refused_naming_the_key(tmp_path, forbid_model_loading):
    pairs = distinct(tmp_path)
    refusals = {
        r"loss\.hard_negative_weight=0\.5 weighs labelled hard negatives.*Fix: loss\.hard_negative_weight=0": [
            f"data.path={pairs}",
            "loss.hard_negative_weight=0.5",
        ],
        r"one sentence per line has none.*Fix: loss\.hard_negative_weight=0": [
            "data=wiki",
            "loss.hard_negative_weight=1",
        ],
        r"loss\.terms\.infonce\.hard_negative_weight=0\.3 .*Fix: loss\.terms\.infonce\.hard_negative_weight=0": [
            f"data.path={pairs}",
            "loss=sum",
            "loss.terms={infonce: {weight: 1.0, hard_negative_weight: 0.3}}",
        ],
        r"data\.score_range=\[0, 5\] is set, but .*pairs\.csv holds no score column.*Fix: data\.score_range=null": [
            f"data.path={pairs}",
            "data.score_range=[0,5]",
        ],
        r"data\.score_range=\[0, 1\] with data=stsb_train: its scores are 0-5.*Fix: data\.score_range=\[0,5\]": [
            "data=stsb_train",
            "loss=cosent",
            "data.score_range=[0,1]",
        ],
        r"data\.columns=\['a', 'b'\] with data=sick_nli: .*Fix: drop it": ["data=sick_nli", "data.columns=[a,b]"],
        r"data\.score_range=\[0, 1\] with data=mrpc: it holds no scores": ["data=mrpc", "data.score_range=[0,1]"],
        r"data\.columns: data=wiki reads one sentence per line.*Fix: drop it \(~data\.columns\)": [
            "data=wiki",
            "+data.columns=[a,b]",
        ],
        r"data\.corpus: data=labelled reads labelled rows.*~data\.corpus": [f"data.path={pairs}", "+data.corpus=x.txt"],
    }
    for message, overrides in refusals.items():
        with pytest.raises(SentembConfigError, match=message):
            prepared(overrides, tmp_path)
    prepared(["data=stsb_train", "loss=cosent", "data.score_range=[0,5]"], tmp_path)  # its own scale: used as is


# ---- finding 8: what failed at the first step


def triplets(tmp_path: Path, rows: int = 16) -> Path:
    return write_csv(
        tmp_path / "triplets.csv",
        ["anchor", "positive", "negative"],
        [[f"anchor {i} words", f"positive {i} text", f"negative {i} other"] for i in range(rows)],
    )


def test_a_weighted_sum_on_triplets_computes_its_terms_with_their_hard_negatives(tmp_path):
    """loss=sum with one InfoNCE term of hard_negative_weight w is exactly loss=infonce with w (the count reaches the
    term); an MPT term beside it adds its own value."""
    path = triplets(tmp_path)
    torch.manual_seed(0)
    module = SentembModule.from_config(
        compose_train(["model=tiny", "model.dropout=0.0", "loss.hard_negative_weight=0.5"], tmp_path)
    )
    batch = labelled_batch(module, path, 8)
    alone = float(module.step_loss(batch)[1])
    summed = compose_train(
        ["model=tiny", "loss=sum", "loss.terms={infonce: {weight: 1.0, hard_negative_weight: 0.5}}"], tmp_path
    )
    module.loss = SentembModule.from_config(summed).loss
    assert float(module.step_loss(batch)[1]) == pytest.approx(alone, abs=1e-6)
    both = compose_train(
        [
            "model=tiny",
            "loss=sum",
            "loss.terms={infonce: {weight: 1.0, hard_negative_weight: 0.5}, mpt: {weight: 0.5}}",
        ],
        tmp_path,
    )
    module.loss = SentembModule.from_config(both).loss
    _, total, logged = module.step_loss(batch)
    assert float(total) == pytest.approx(alone + 0.5 * float(logged["train/loss/mpt"]), abs=1e-6)


@pytest.mark.parametrize(
    "overrides",
    [
        ["loss=sum", "loss.terms={infonce: {weight: 1.0, hard_negative_weight: 0.2}, mpt: {weight: 0.5}}"],
        ["loss=sum", "loss.terms={infonce: {weight: 1.0}}", "negatives=momentum"],
    ],
    ids=["two-terms", "one-term-momentum"],
)
def test_a_weighted_sum_trains_on_triplets(overrides, tmp_path, small_stsb):
    metrics = run(
        ["model=tiny", "data=labelled", f"data.path={triplets(tmp_path)}", "data.batch_size=8", *overrides,
         "trainer.max_steps=3", "eval.every_n_steps=3", "eval.at_start=false", "logger=csv",
         f"eval.stsb_dir={small_stsb}"],
        tmp_path / "run",
    )  # fmt: skip
    assert math.isfinite(metrics["stsb/test/spearman"]) and Path(metrics["best_checkpoint"]).is_file()


def test_angle_on_sarcses_odd_width_is_refused_before_any_model_loads(tmp_path, forbid_model_loading):
    with pytest.raises(SentembConfigError, match=r"loss=angle with head=sarcse.*D = 1497.*Fix: .*head\.co_t=501"):
        prepared(["data=stsb_train", "loss=angle", "head=sarcse"], tmp_path)
    prepared(["data=stsb_train", "loss=angle", "head=sarcse", "head.co_t=501"], tmp_path)  # 3 x 500: even
    prepared(["data=stsb_train", "loss=cosent", "head=sarcse"], tmp_path)


@pytest.mark.parametrize("rows", [1000, 1100])  # the file ends at the head's old length, and past it
def test_a_streamed_file_shorter_than_a_batch_is_refused_naming_it(rows, tmp_path, forbid_model_loading):
    path = distinct(tmp_path, rows)
    stream = [f"data.path={path}", "data.streaming=true", "trainer.max_steps=3"]
    with pytest.raises(SentembConfigError, match=rf"pairs\.csv: {rows} labelled rows, .*data\.batch_size=1200.*Fix"):
        prepared([*stream, "data.batch_size=1200"], tmp_path)
    prepared([*stream, f"data.batch_size={rows}"], tmp_path)


# ---- finding 13: the model named as itself


def test_mntp_on_model_tiny_names_the_tiny_model_not_minilms_path(tmp_path, forbid_model_loading):
    with pytest.raises(SentembConfigError) as refused:
        prepared(["head=mntp", f"data.path={distinct(tmp_path, 16)}"], tmp_path)
    message = str(refused.value)
    assert "model=tiny-bert (model.backbone.name=tiny_bert, built in-process), an encoder" in message
    assert "minilm" not in message.lower().replace("model=minilm", "") and "Fix: " in message


def test_repeated_anchors_that_leave_negatives_stay_accepted(tmp_path, forbid_model_loading):
    """Anchors that repeat, but not all alike: the mask leaves negatives (a file of several positives per query)."""
    rows = [[f"anchor {i % 3}", f"pos {i}"] for i in range(16)]
    prepared([f"data.path={write_csv(tmp_path / 'r.csv', ['anchor', 'positive'], rows)}"], tmp_path)
