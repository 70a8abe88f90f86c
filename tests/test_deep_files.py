"""A file nesting lists or dicts past what sentemb writes is refused naming the file, never a raw RecursionError.

json and PyYAML parse recursively: a line of 100k `[` exhausts Python's recursion in the parser, and a value
nested a few hundred deep would exhaust it in `checked`'s walk. Both are refused as SentembConfigError.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sentemb.common.errors import SentembConfigError
from sentemb.common.file_values import MAX_DEPTH, checked, parse_json, read_json, read_yaml
from sentemb.runs.record import read_record, write_record

DEEP = "[" * 100_000 + "]" * 100_000  # past the parser's recursion
NESTED = "[" * 500 + "]" * 500  # parses, but deeper than MAX_DEPTH


def nested(depth: int) -> list:
    value: list = []
    for _ in range(depth - 1):
        value = [value]
    return value


@pytest.mark.parametrize("text", [DEEP, NESTED], ids=["past-the-parser", "past-max-depth"])
def test_a_deeply_nested_json_file_is_refused_naming_it(text, tmp_path):
    path = tmp_path / "results.json"
    path.write_text(text)
    with pytest.raises(SentembConfigError, match=rf"{path}.*more than {MAX_DEPTH} deep"):
        read_json(path)


def test_a_deeply_nested_yaml_file_is_refused_naming_it(tmp_path):
    path = tmp_path / "config.yaml"
    path.write_text("[" * 1000 + "]" * 1000)  # PyYAML recurses a few frames a level: past its recursion at 1000
    with pytest.raises(SentembConfigError, match=rf"{path}.*more than {MAX_DEPTH} deep"):
        read_yaml(path)


def test_a_run_record_nesting_a_metric_too_deep_is_refused(tmp_path):
    write_record(tmp_path, {"status": "ok", "metrics": {}})
    record = json.loads((tmp_path / "metrics.json").read_text())
    record["message"] = nested(MAX_DEPTH + 5)
    (tmp_path / "metrics.json").write_text(json.dumps(record))
    with pytest.raises(SentembConfigError, match=r"metrics\.json: message nests"):
        read_record(tmp_path)


def test_json_text_too_deep_names_its_source():
    with pytest.raises(SentembConfigError, match=r"negations\.jsonl, line 3: nests"):
        parse_json(DEEP, "negations.jsonl, line 3")


def test_the_depth_bound_lets_through_what_sentemb_writes():
    # the bound counts containers: a value exactly MAX_DEPTH lists deep passes, one more is refused
    assert checked(nested(MAX_DEPTH), "f.json") == nested(MAX_DEPTH)
    with pytest.raises(SentembConfigError, match="nests"):
        checked(nested(MAX_DEPTH + 1), "f.json")


def test_invalid_json_still_names_its_line(tmp_path: Path):
    path = tmp_path / "bad.json"
    path.write_text('{\n  "a": 1,\n  oops\n}')
    with pytest.raises(SentembConfigError, match=rf"{path}:3: not valid JSON"):
        read_json(path)
