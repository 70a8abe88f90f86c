"""SNCSE's `auxiliary.sncse.convention=reference` against the released training's token rows (findings 19 and 20).

Source: Sense-GVT/SNCSE @faa013eae581ad1bebb0b313520364e31bde7e25, SNCSE/train_SNCSE.py, `prepare_features`, the
`Different_Prompt_Negation` branch (lines 489-541, the one its `__main__` selects at lines 674-678), restated below
as a loop (`released_rows`); none of it is sentemb's code. Fixed sentences, with and without final punctuation, one
longer than the row allows, through the tiny BERT (MiniLM's uncased WordPiece) and the tiny RoBERTa (byte-level BPE):
sentemb's data view and prompt pooling must give the very same ids, view by view.
"""

from __future__ import annotations

import json
import string
from pathlib import Path

import pytest
import torch

from sentemb.common.errors import SentembConfigError
from sentemb.common.hydra_plumbing import resolved_container
from sentemb.data.view_makers.negation import NegationView
from sentemb.data.views import ViewCollator, ViewMakers, encode_views
from sentemb.encoders.poolings.templates import PROMPTBERT_TEMPLATE, SNCSE_POSITIVE_TEMPLATE, SNCSE_REFERENCE_TEMPLATES
from sentemb.training.checks import check_parts
from sentemb.training.module import SentembModule
from tests.conftest import compose_train

MAX_LENGTH = 32  # train_SNCSE.sh: --max_seq_length 32
SENTENCES = [
    "He is here.",
    "The cat sat on the mat",  # no final punctuation: " ." appended (line 511), its lookup misses (line 514)
    "Why would they leave?",
    "Two dogs run through a field   ",  # spaces after: " ." appended to the sentence as given
    "It rains…",  # "…" is not in string.punctuation
    "a very long sentence without any final punctuation that keeps going well past the thirty two tokens that "
    "the row allows so that truncation cuts its tail",
]
# the negation file's pairs, keyed by the sentences as they are (the released file's keys); some negations lack
# final punctuation (line 515 appends " .")
NEGATIONS = {
    "He is here.": "He is not here .",
    "The cat sat on the mat": "The cat did not sit on the mat",
    "Why would they leave?": "Why would not they leave ?",
    "Two dogs run through a field   ": "Two dogs do not run through a field",
    "It rains…": "It does not rain …",
    SENTENCES[5]: "Not " + SENTENCES[5],
}
RELEASED_OVERRIDES = [
    "auxiliary=sncse",
    "pooling=prompt",
    "auxiliary.sncse.convention=reference",
    f"pooling.template='{SNCSE_REFERENCE_TEMPLATES[0]}'",
    f"pooling.positive_template='{SNCSE_REFERENCE_TEMPLATES[1]}'",
    f"pooling.max_length={MAX_LENGTH}",
]
PAPER_OVERRIDES = [
    "auxiliary=sncse",
    "pooling=prompt",
    f"pooling.template='{PROMPTBERT_TEMPLATE}'",
    f"pooling.positive_template='{SNCSE_POSITIVE_TEMPLATE}'",
    f"pooling.max_length={MAX_LENGTH}",
]


def released_rows(tokenizer, sentences: list[str], negation: dict[str, str], roberta: bool) -> list[list[list[int]]]:
    """[tokens0, tokens1, tokens2] per sentence, as train_SNCSE.py's loop builds them (line numbers at faa013e)."""
    punctuation = list(string.punctuation)  # line 47

    def ids(text: str) -> list[int]:
        return tokenizer.convert_tokens_to_ids(tokenizer.tokenize(text))

    s1 = ids('This sentence : " ')  # lines 490-491
    ss1 = ids('This sentence of " ')  # lines 492-493
    if roberta:  # lines 494-496
        s2 = tokenizer.encode(' " means <mask> .')[1:-1]
    else:  # lines 497-499
        s2 = ids(' " means [MASK] .')
    max_seq_length = MAX_LENGTH - len(s1) - len(s2) - 2  # line 504
    max_seq_length1 = MAX_LENGTH - len(ss1) - len(s2) - 2  # line 505
    cls, sep = tokenizer.cls_token_id, tokenizer.sep_token_id
    rows = []
    for sentence in sentences:  # line 508
        if sentence.strip()[-1] not in punctuation:  # lines 511-512
            sentence = sentence + " ."
        negation_sentence = negation.get(sentence, "Not " + sentence)  # line 514
        if negation_sentence.strip()[-1] not in punctuation:  # lines 515-516
            negation_sentence = negation_sentence + " ."
        tokens0 = ids(sentence)[:max_seq_length]  # lines 518-520
        tokens0 = [cls] + s1 + tokens0 + s2 + [sep]  # line 521
        tokens1 = ids(sentence)[:max_seq_length1]  # lines 524-526
        tokens1 = [cls] + ss1 + tokens1 + s2 + [sep]  # line 527
        tokens2 = ids(negation_sentence)[:max_seq_length1]  # lines 530-532
        tokens2 = [cls] + ss1 + tokens2 + s2 + [sep]  # line 533
        rows.append([tokens0, tokens1, tokens2])
    return rows


def sentemb_rows(overrides: list[str], model: str, negations: Path, tmp_path: Path) -> tuple[list[list[int]], object]:
    """The anchor, positive and negation rows sentemb trains on: the data views (`encode_views`, the collator) through
    the prompt pooling's `training_batch`, real tokens only; [anchors..., positives..., negations...]."""
    file = ["auxiliary.sncse.source=file", f"auxiliary.sncse.path={negations}", f"data.max_length={MAX_LENGTH}"]
    cfg = compose_train([f"model={model}", *overrides, *file], tmp_path)
    check_parts(cfg)
    torch.manual_seed(0)
    module = SentembModule.from_config(cfg)
    tokenizer = module.encoder.tokenizer
    views = ViewMakers.asked({"negation": resolved_container(cfg.auxiliary.sncse)})
    columns = encode_views(SENTENCES, range(len(SENTENCES)), tokenizer, MAX_LENGTH, view_makers=views)
    batch = ViewCollator(tokenizer)([{k: v[i] for k, v in columns.items()} for i in range(len(SENTENCES))])
    rows = module.encoder.pooling.training_batch(dict(batch), tokenizer)
    real = zip(rows["input_ids"].tolist(), rows["attention_mask"].tolist(), strict=True)
    return [[i for i, keep in zip(ids, mask, strict=True) if keep] for ids, mask in real], tokenizer


@pytest.fixture
def negation_file(tmp_path: Path) -> Path:
    path = tmp_path / "negations.jsonl"
    path.write_text("".join(json.dumps([s, n]) + "\n" for s, n in NEGATIONS.items()), encoding="utf-8")
    return path


@pytest.mark.parametrize(("model", "roberta"), [("tiny", False), ("tiny-roberta", True)])
def test_reference_rows_are_the_released_trainings_view_by_view(model, roberta, negation_file, tmp_path):
    rows, tokenizer = sentemb_rows(RELEASED_OVERRIDES, model, negation_file, tmp_path)
    released = released_rows(tokenizer, SENTENCES, NEGATIONS, roberta)
    n = len(SENTENCES)
    for view, name in enumerate(("anchor", "positive", "negation")):
        expected = [per_sentence[view] for per_sentence in released]
        assert rows[view * n : (view + 1) * n] == expected, name  # token ids: equal, not close
    assert all(len(row) <= MAX_LENGTH for row in rows), "the whole row within max_seq_length"


@pytest.mark.parametrize(("model", "roberta"), [("tiny", False), ("tiny-roberta", True)])
def test_the_paper_form_differs_from_the_released_rows_where_the_docs_say(model, roberta, negation_file, tmp_path):
    """The paper form keeps each sentence as given (finding 19: no " ." added) and, for RoBERTa's BPE, tokenises the
    template's pieces without the released spaces (finding 20: no lone-space token after the opening quote, no space
    before the closing one; the tiny BPE has no merged space-quote, so here its rows are two tokens shorter and the
    sentence gets those two); for WordPiece the spaces make no difference, so a punctuated sentence's rows agree."""
    rows, tokenizer = sentemb_rows(
        [*PAPER_OVERRIDES, "auxiliary.sncse.lookup_quirk=true"], model, negation_file, tmp_path
    )
    released = released_rows(tokenizer, SENTENCES, NEGATIONS, roberta)
    assert rows[1] != released[1][0], "'The cat sat on the mat' without its ' .'"
    if roberta:
        assert len(rows[0]) == len(released[0][0]) - 2 and rows[0] != released[0][0]
        assert len(rows[5]) == len(released[5][0]), "the paper's shorter pieces leave the sentence 2 more tokens"
    else:
        assert rows[0] == released[0][0], "WordPiece: the template's spaces change nothing"


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ([*RELEASED_OVERRIDES, f"pooling.template='{PROMPTBERT_TEMPLATE}'"], "pooling.template="),
        (["auxiliary=sncse", "auxiliary.sncse.convention=reference"], "pooling=cls"),
        ([*RELEASED_OVERRIDES, "auxiliary.sncse.lookup_quirk=false"], "lookup_quirk=false with .*convention=reference"),
        ([*RELEASED_OVERRIDES, "auxiliary.sncse.convention=released"], "auxiliary.sncse.convention='released'"),
    ],
    ids=["paper-template", "no-prompt", "lookup-off", "unknown"],
)
def test_reference_settings_the_released_code_has_not_are_refused_before_any_model_loads(
    overrides, message, tmp_path, forbid_model_loading
):
    cfg = compose_train(["model=tiny", *overrides], tmp_path)
    with pytest.raises(SentembConfigError, match=message) as err:
        check_parts(cfg)
    assert "Fix:" in str(err.value)


def test_the_lookup_follows_the_convention_unless_set():
    node = {"source": "rule", "lookup_quirk": None}
    assert NegationView.from_options({**node, "convention": "reference"}).lookup_quirk is True
    assert NegationView.from_options({**node, "convention": "paper"}).lookup_quirk is False
    assert NegationView.from_options({**node, "lookup_quirk": True}).lookup_quirk is True
