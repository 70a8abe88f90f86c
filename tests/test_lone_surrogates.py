"""Text read from a file is text: a lone surrogate (half of a UTF-16 pair, which a JSON escape such as "\\ud800" or a
pickled string can carry, and UTF-8 cannot encode) is refused where it is read, naming the file, line or key, never
left for a tokenizer to fail on without either (finding 11 and its class).

Raw UTF-8 text (corpora, SentEval's files, whitening corpora) is decoded strictly and cannot hold one; JSON and
pickles can: the negation file (`parse_line`), every value `checked` lets through (run records, exported folders'
configs, checkpoints' hyper-parameters, Hydra's saved YAML) and a prompt template wherever it comes from.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from sentemb.common.errors import SentembConfigError
from sentemb.common.file_values import not_text, read_json
from sentemb.data.negation import check_soft_negative_source, read_negations
from sentemb.encoders.checkpoint import read_checkpoint
from sentemb.encoders.poolings.templates import check_template

SURROGATE_JSON = '"a \\ud800 b"'  # the JSON escape of a lone high surrogate, as the file holds it


def test_the_escape_gives_a_python_string_utf8_cannot_encode():
    value = json.loads(SURROGATE_JSON)
    with pytest.raises(UnicodeEncodeError):
        value.encode("utf-8")
    assert "U+D800" in not_text(value) and not_text("a \U0001f600 pair is fine") is None


def test_a_negation_file_with_a_lone_surrogate_is_refused_by_the_pre_run_check_naming_file_and_line(tmp_path: Path):
    path = tmp_path / "negations.jsonl"
    path.write_text(f'[{SURROGATE_JSON}, "Not a b"]\n', encoding="utf-8")
    with pytest.raises(SentembConfigError, match=rf"{path}, line 1: the sentence holds a lone surrogate.*Fix:"):
        check_soft_negative_source("file", str(path))
    with pytest.raises(SentembConfigError, match="line 1: the sentence holds a lone surrogate"):
        read_negations(path)


def test_a_json_value_with_a_lone_surrogate_is_refused_naming_file_and_key(tmp_path: Path):
    path = tmp_path / "results.json"
    path.write_text(f'{{"task": {{"name": {SURROGATE_JSON}}}}}', encoding="utf-8")
    with pytest.raises(SentembConfigError, match=rf"{path}: task.name holds a lone surrogate"):
        read_json(path)


def test_a_checkpoint_whose_template_holds_a_lone_surrogate_is_refused_when_read(tmp_path: Path):
    template = 'This sentence : "[X]" means [MASK] \ud800.'
    checkpoint = {
        "state_dict": {"encoder.backbone.weight": torch.zeros(1)},
        "hyper_parameters": {"model": {}, "pooling": {"name": "prompt", "template": template}, "loss": {}},
        "pytorch-lightning_version": "2.5.0",
    }
    path = tmp_path / "last.ckpt"
    torch.save(checkpoint, path)  # pickle writes the surrogate as it is
    with pytest.raises(SentembConfigError, match=r"pooling.template holds a lone surrogate"):
        read_checkpoint(path)


def test_a_template_with_a_lone_surrogate_is_refused_naming_its_key():
    with pytest.raises(SentembConfigError, match=r"pooling.positive_template holds a lone surrogate.*Fix:"):
        check_template('This sentence of "[X]" means [MASK] \udc80.', "pooling.positive_template")
