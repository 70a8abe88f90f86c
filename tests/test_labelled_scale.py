"""Labelled data composes with what unlabelled training has: DDP (every rank's positives and hard negatives gathered:
the step equals one process on the global batch), GradCache (hard negatives chunked too), padding-free batches, an
exact resume, ESimCSE's queue and HiCL's segments."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from sentemb.common.hydra_plumbing import resolved_container
from sentemb.training.module import SentembModule
from tests.conftest import compose_train
from tests.test_ddp_gradients import assert_ddp_equals_one_process
from tests.test_grad_cache import assert_same_step, step
from tests.test_labelled import labelled_batch, stsb_rows, write_csv
from tests.test_resume import logged, stopped_and_resumed

# 8 rows: a duplicated anchor on each rank and one row's positive as another rank's hard negative, so the masks and
# the hard-negative columns cross the ranks
ROWS = [
    ["a man is playing a guitar .", "a man plays the guitar .", "a woman is cutting onions ."],
    ["the cat sits on the mat", "a cat is sitting on a mat", "a dog runs in the park"],
    ["a man is playing a guitar .", "someone strums a guitar", "nobody is playing"],
    ["stocks fell sharply on monday", "markets dropped on monday", "stocks rose on monday"],
    ["two dogs run through a field", "dogs are running in grass", "a man plays the guitar ."],
    ["a woman slices an onion", "a woman is cutting onions .", "a woman is peeling a potato"],
    ["children play football in the park", "kids are playing soccer", "children are sleeping"],
    ["the weather is nice today", "it is a sunny day", "it is raining heavily"],
]


@pytest.fixture
def triplets(tmp_path: Path) -> Path:
    return write_csv(tmp_path / "triplets.csv", ["anchor", "positive", "negative"], ROWS)


def parts(overrides: list[str], tmp_path: Path, grad_cache: int | None = None) -> dict:
    cfg = compose_train(["model=tiny", "model.dropout=0.0", *overrides], tmp_path)
    config = {key: resolved_container(cfg[key]) for key in ("model", "pooling", "loss", "optimizer", "scheduler")}
    return {**config, "grad_cache": grad_cache}


@pytest.mark.slow  # two spawned gloo processes (make test-slow)
def test_ddp_with_hard_negatives_equals_one_process_on_the_global_batch(triplets, tmp_path, data_root):
    configs = {
        "infonce+weight": parts(["loss.hard_negative_weight=0.5"], tmp_path),
        "focal": parts(["loss=focal"], tmp_path),
        "arccon": parts(["loss=arccon"], tmp_path),
        "infonce+grad_cache": parts([], tmp_path, grad_cache=2),
    }
    module = SentembModule.from_config(compose_train(["model=tiny"], tmp_path))
    batch = dict(labelled_batch(module, triplets, 8))
    assert_ddp_equals_one_process(configs, batch)
    scored = write_csv(tmp_path / "s.csv", ["sentence1", "sentence2", "score"], stsb_rows(data_root, 8))
    batch = dict(labelled_batch(module, scored, 8, score_range=[0, 5]))
    assert_ddp_equals_one_process({"cosent": parts(["loss=cosent"], tmp_path)}, batch)


def build(overrides: list[str], tmp_path: Path, grad_cache: int | None) -> SentembModule:
    cfg = compose_train(["model=tiny", "model.dropout=0.0", *overrides, f"grad_cache={grad_cache or 'null'}"], tmp_path)
    torch.manual_seed(0)
    return SentembModule.from_config(cfg)


@pytest.mark.parametrize(
    "variant", [[], ["loss=focal"], ["pooling=mean", "loss.hard_negative_weight=1.0"], ["model.padding_free=true"]]
)
def test_grad_cache_chunks_the_hard_negatives_and_equals_the_plain_step(variant, triplets, tmp_path):
    plain, cached = build(variant, tmp_path, None), build(variant, tmp_path, 2)
    batch = labelled_batch(plain, triplets, 8)
    assert_same_step(step(cached, batch), step(plain, batch), " ".join(variant) or "cls")


@pytest.mark.slow  # three short runs (~40 s on 2 cores)
def test_a_labelled_run_resumes_exactly(tmp_path, data_root, small_stsb):
    rows = [
        [a, b, stsb_rows(data_root, 128)[(i + 9) % 128][1]] for i, (a, b, _) in enumerate(stsb_rows(data_root, 128))
    ]
    path = write_csv(tmp_path / "t.csv", ["anchor", "positive", "negative"], rows)
    overrides = [
        "model=tiny", "logger=csv", "data=labelled", f"data.path={path}", "data.batch_size=16", "trainer.max_steps=6",
        "eval.every_n_steps=3", "eval.at_start=false", "trainer.log_every_n_steps=1", f"eval.stsb_dir={small_stsb}",
    ]  # fmt: skip
    full, resumed, _ = stopped_and_resumed(overrides, tmp_path, stop_after=3)
    losses = logged(tmp_path / "full", "train/loss")
    # the same computation on bit-identical weights, optimizer, data position and RNG: equal, not close
    assert (
        len(losses) == 6
        and {**logged(tmp_path / "stopped", "train/loss"), **logged(tmp_path / "resumed", "train/loss")} == losses
    )
    assert resumed["stsb/test/spearman"] == full["stsb/test/spearman"]


@pytest.mark.slow  # a real run each
@pytest.mark.parametrize(
    "preset", ["negatives=momentum", "experiment=hicl/simcse_tiny", "negatives=dclr negatives.complementary=initial"]
)
def test_labelled_triplets_train_with_a_queue_hicl_and_dclr(preset, triplets, tmp_path, data_root, small_stsb):
    rows = [[a, b, stsb_rows(data_root, 40)[(i + 5) % 40][0]] for i, (a, b, _) in enumerate(stsb_rows(data_root, 40))]
    path = write_csv(tmp_path / "t.csv", ["anchor", "positive", "negative"], rows)
    from tests.test_train import run

    metrics = run(
        [*preset.split(), "data=labelled", f"data.path={path}", "model=tiny", "logger=csv", "data.batch_size=8",
         "trainer.max_steps=3", "eval.every_n_steps=3", "eval.at_start=false", f"eval.stsb_dir={small_stsb}"],
        tmp_path / "run",
    )  # fmt: skip
    assert metrics["stsb/test/spearman"] == metrics["stsb/test/spearman"]  # a number, not NaN


def test_a_scored_loss_trains_a_step_of_tiny_llama(tmp_path, data_root):
    scored = write_csv(tmp_path / "s.csv", ["sentence1", "sentence2", "score"], stsb_rows(data_root, 8))
    cfg = compose_train(["model=tiny-llama", "pooling=last_token", "loss=angle", "data=labelled",
                         f"data.path={scored}", "data.score_range=[0,5]", "data.batch_size=8"], tmp_path)  # fmt: skip
    from sentemb.training.checks import prepare_run

    prepare_run(cfg)
    torch.manual_seed(0)
    module = SentembModule.from_config(cfg)
    backward, total, _ = module.step_loss(dict(labelled_batch(module, scored, 8, score_range=[0, 5])))
    module.backward(backward)
    assert torch.isfinite(total) and total > 0
    grads = [p.grad for p in module.parameters() if p.requires_grad]
    assert all(g is not None and torch.isfinite(g).all() for g in grads) and any(g.abs().sum() > 0 for g in grads)


@pytest.mark.slow  # a real run
def test_an_e5_mistral_style_run_lora_on_a_decoder_with_hard_negatives(triplets, tmp_path, small_stsb):
    from tests.test_train import run

    metrics = run(
        ["model=tiny-mistral", "pooling=last_token", "adapter=lora", "data=labelled", f"data.path={triplets}",
         "data.batch_size=4", "loss.tau=0.02", "logger=csv", "trainer.max_steps=2", "eval.every_n_steps=2",
         "eval.at_start=false", f"eval.stsb_dir={small_stsb}"],
        tmp_path / "run",
    )  # fmt: skip
    assert metrics["stsb/test/spearman"] == metrics["stsb/test/spearman"]


# ---- data.streaming=true on a labelled file


def streamed_rows(path: Path, tokenizer, world: int, **options) -> list[list[str]]:
    """Every rank's rows of one epoch of the stream, decoded back to (anchor, positive, negative) texts."""
    from sentemb.data.labelled import LabelledFile
    from sentemb.data.streaming import LabelledRowStream

    rows = []
    for rank in range(world):
        stream = LabelledRowStream(LabelledFile.open(path, None, None), tokenizer, 4, 64, 7, rank=rank,
                                   world_size=world, **options)  # fmt: skip
        for row in stream:
            rows.append([tokenizer.decode(row[f"{p}input_ids"], skip_special_tokens=True)
                         for p in ("", "positive_", "hard_negative_1_")])  # fmt: skip
    return rows


def test_a_streamed_file_gives_every_whole_round_once_shuffled_and_shared_by_the_ranks(tmp_path):
    from tests.test_labelled import write_csv as write

    rows = [[f"anchor {i}", f"positive {i}", f"negative {i}"] for i in range(37)]
    path = write(tmp_path / "t.csv", ["anchor", "positive", "negative"], rows)
    module = SentembModule.from_config(compose_train(["model=tiny"], tmp_path))
    tokenizer = module.encoder.tokenizer
    in_order = streamed_rows(path, tokenizer, 1, shuffle_buffer=None)
    assert in_order == [[t.lower() for t in row] for row in rows[:36]]  # 9 whole batches of 4; the ragged 37th dropped
    shuffled = streamed_rows(path, tokenizer, 2, shuffle_buffer=10)
    assert len(shuffled) == 32 and len({tuple(r) for r in shuffled}) == 32  # 4 rounds of 2 x 4, each row once
    assert shuffled != in_order[:32] and all(r[0].split()[1] == r[1].split()[1] == r[2].split()[1] for r in shuffled)
    assert shuffled == streamed_rows(path, tokenizer, 2, shuffle_buffer=10), "seeded: the same order every run"


def test_a_bad_row_past_a_streamed_files_head_is_named_when_the_stream_reaches_it(tmp_path, small_stsb):
    from sentemb.common.errors import SentembConfigError
    from sentemb.data.corpus import HEAD_LINES
    from tests.test_train import run

    lines = ["anchor,positive"] + [f"sentence {i},another {i}" for i in range(HEAD_LINES + 20)] + ["last,"]
    (tmp_path / "t.csv").write_text("\n".join(lines) + "\n", encoding="utf-8")
    overrides = ["model=tiny", "logger=csv", "data=labelled", f"data.path={tmp_path / 't.csv'}", "data.streaming=true",
                 "data.batch_size=64", "trainer.max_steps=40", "eval.every_n_steps=100", "eval.at_start=false",
                 f"eval.stsb_dir={small_stsb}", "data.shuffle=false"]  # fmt: skip
    from sentemb.training.checks import prepare_run

    prepare_run(compose_train(overrides, tmp_path))  # the head is sound
    with pytest.raises(SentembConfigError, match=rf"t.csv:{HEAD_LINES + 22}: column 'positive' is empty"):
        run(overrides, tmp_path / "run")


@pytest.mark.slow  # three short runs
def test_a_streamed_labelled_run_resumes_exactly(tmp_path, data_root, small_stsb):
    pairs = stsb_rows(data_root, 128)
    path = write_csv(tmp_path / "t.csv", ["anchor", "positive", "negative"],
                     [[a, b, pairs[(i + 9) % 128][1]] for i, (a, b, _) in enumerate(pairs)])  # fmt: skip
    overrides = [
        "model=tiny", "logger=csv", "data=labelled", f"data.path={path}", "data.streaming=true",
        "data.shuffle_buffer=32", "data.batch_size=16", "trainer.max_steps=6", "eval.every_n_steps=3",
        "eval.at_start=false", "trainer.log_every_n_steps=1", f"eval.stsb_dir={small_stsb}",
    ]  # fmt: skip
    full, resumed, _ = stopped_and_resumed(overrides, tmp_path, stop_after=3)
    losses = logged(tmp_path / "full", "train/loss")
    after = {**logged(tmp_path / "stopped", "train/loss"), **logged(tmp_path / "resumed", "train/loss")}
    assert len(losses) == 6 and after == losses  # the same batches in the same order: equal, not close
    assert resumed["stsb/test/spearman"] == full["stsb/test/spearman"]
