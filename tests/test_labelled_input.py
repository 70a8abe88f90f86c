"""Issue 62's crafted labelled inputs: each written as a user would, each refused with its file, line and fix (or read
right), before any model loads: the column rule, JSON keys, scores, invisible and non-text sentences, unbounded
numbers and nesting, damaged files, decode errors at their true line, and messages that name the true cause."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from sentemb.common.errors import SentembConfigError
from sentemb.data.corpus import check_corpus, undecodable_line_error
from sentemb.data.labelled import LabelledFile, read_labelled
from sentemb.data.streaming import LabelledRowStream, StreamPosition
from sentemb.training.checks import prepare_run
from tests.conftest import compose_train


def refused(data: dict, *fragments: str) -> str:
    """read_labelled's refusal of `data`, which must hold every fragment and a Fix."""
    with pytest.raises(SentembConfigError) as caught:
        read_labelled(data)
    message = str(caught.value)
    for fragment in (*fragments, "Fix:"):
        assert fragment in message, message
    return message


def write_parquet(path: Path, names: list[str], columns: list[list]) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_arrays([pa.array(values) for values in columns], names=names), path)
    return path


# ---- finding 1: one column rule for every format


PANDAS_INDEX = {  # df.to_csv("x.csv") keeps the index as an unnamed first column; the other formats alike
    "csv": ",anchor,positive\n0,a dog runs,a dog is running\n1,it rains,rain falls\n",
    "tsv": "\tanchor\tpositive\n0\ta dog runs\ta dog is running\n1\tit rains\train falls\n",
    "jsonl": '{"": "0", "anchor": "a dog runs", "positive": "a dog is running"}\n'
    '{"": "1", "anchor": "it rains", "positive": "rain falls"}\n',
}


@pytest.mark.parametrize("kind", [*PANDAS_INDEX, "parquet"])
def test_an_unnamed_column_is_refused_at_the_header_unless_data_columns_names_the_others(kind, tmp_path):
    path = tmp_path / f"t.{kind}"
    if kind == "parquet":
        write_parquet(path, ["", "anchor", "positive"], [["0", "1"], ["a dog runs", "it rains"], ["x y", "z w"]])
    else:
        path.write_text(PANDAS_INDEX[kind], encoding="utf-8")
    where = f"{path}, schema" if kind == "parquet" else f"{path}:1"
    refused({"path": str(path)}, f"{where}: column 1 of the header has no name", "index=False")
    named = read_labelled({"path": str(path), "columns": ["anchor", "positive"]})
    assert named.texts[0] == ["a dog runs", "it rains"]


@pytest.mark.parametrize("kind", ["csv", "tsv", "parquet"])
def test_a_repeated_column_name_is_refused_even_with_data_columns(kind, tmp_path):
    path = tmp_path / f"t.{kind}"
    names, rows = ["anchor", "anchor", "positive"], [["a b", "c d", "e f"], ["g h", "i j", "k l"]]
    if kind == "parquet":
        write_parquet(path, names, [list(column) for column in zip(*rows, strict=True)])
    else:
        sep = "," if kind == "csv" else "\t"
        path.write_text("\n".join(sep.join(r) for r in [names, *rows]) + "\n", encoding="utf-8")
    where = f"{path}, schema" if kind == "parquet" else f"{path}:1"
    for columns in (None, ["anchor", "positive"]):
        refused({"path": str(path), "columns": columns}, f"{where}: the header names 'anchor' 2 times")


def test_a_repeated_json_key_is_refused_at_its_line(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text('{"anchor": "a", "positive": "b"}\n{"anchor": "c", "anchor": "d", "positive": "e"}\n')
    refused({"path": str(path)}, f"{path}:2: the object names 'anchor' twice")


NUMBER_COLUMN = {  # a leading id column (not pandas' index: named), in every format
    "csv": "id,anchor,positive\n1,a dog runs,a dog is running\n2,it rains,rain falls\n",
    "tsv": "id\tanchor\tpositive\n1\ta dog runs\ta dog is running\n2\tit rains\train falls\n",
    "jsonl": '{"id": "1", "anchor": "a dog runs", "positive": "a dog is running"}\n'
    '{"id": "2", "anchor": "it rains", "positive": "rain falls"}\n',
}


@pytest.mark.parametrize("kind", [*NUMBER_COLUMN, "parquet"])
def test_a_text_column_of_numbers_is_refused_unless_data_columns_names_the_columns(kind, tmp_path):
    path = tmp_path / f"t.{kind}"
    if kind == "parquet":
        write_parquet(path, ["id", "anchor", "positive"], [["1", "2"], ["a dog runs", "it rains"], ["x y", "z w"]])
    else:
        path.write_text(NUMBER_COLUMN[kind], encoding="utf-8")
    where = f"{path}, schema" if kind == "parquet" else f"{path}:1"
    refused({"path": str(path)}, f"{where}: every value of column 'id' (2 rows read) is a number", "read as the anchor")
    assert read_labelled({"path": str(path), "columns": ["anchor", "positive"]}).texts[1][1] in ("rain falls", "z w")


def test_a_score_column_under_another_name_is_refused_and_named_by_data_score_column(tmp_path):
    path = tmp_path / "sts.csv"
    path.write_text("sentence1,sentence2,similarity\na dog runs,a dog is running,4.5\nit rains,the sun,0.5\n")
    refused({"path": str(path)}, f"{path}:1: every value of column 'similarity'", "data.score_column=similarity")
    scored = read_labelled({"path": str(path), "score_column": "similarity", "score_range": [0, 5]})
    assert scored.scores == [0.9, 0.1] and scored.texts == (["a dog runs", "it rains"], ["a dog is running", "the sun"])
    refused({"path": str(path), "score_column": "sim", "score_range": [0, 5]}, "data.score_column='sim'")
    refused({"path": str(path), "score_column": 3}, "data.score_column=3 must be a column's name")


def test_the_pandas_index_file_is_refused_by_prepare_run_before_any_model_loads(tmp_path, forbid_model_loading):
    rows = "".join(f"{i},anchor {i},positive {i}\n" for i in range(40))
    (tmp_path / "x.csv").write_text(",anchor,positive\n" + rows, encoding="utf-8")
    cfg = compose_train(["model=tiny", "data=labelled", f"data.path={tmp_path / 'x.csv'}", "data.batch_size=8"])
    with pytest.raises(SentembConfigError, match=r"x.csv:1: column 1 of the header has no name"):
        prepare_run(cfg)


# ---- finding 4: JSON keys, scores, invisible sentences


def test_a_json_line_with_a_key_the_first_object_lacks_is_refused(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text('{"anchor": "a", "positive": "b"}\n{"anchor": "c", "positive": "d", "negative": "e"}\n')
    refused({"path": str(path)}, f"{path}:2: the object's keys differ from the first object's", "adds 'negative'")


BAD_SCORES = {
    "an underscore (float reads 45)": "4_5",
    "Arabic-Indic digits (float reads 4)": "\u0664",
    "full-width digits": "\uff14",
    "1 and 400 zeros": "1" + "0" * 400,
}


@pytest.mark.parametrize("case", list(BAD_SCORES))
def test_a_score_that_is_no_plain_decimal_number_is_refused_its_echo_clipped(case, tmp_path):
    path = tmp_path / "t.csv"
    path.write_text(f"s1,s2,score\na b,c d,4.5\ne f,g h,{BAD_SCORES[case]}\n", encoding="utf-8")
    message = refused({"path": str(path), "score_range": [0, 5]}, f"{path}:3: score ", "plain decimal number")
    assert "0" * 60 not in message and (len(BAD_SCORES[case]) < 40 or "(401 characters)" in message)


def test_json_number_scores_stay_accepted_and_a_huge_one_is_refused(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text('{"s1": "a b", "s2": "c d", "score": 4.5}\n{"s1": "e f", "s2": "g h", "score": 1}\n')
    assert read_labelled({"path": str(path), "score_range": [0, 5]}).scores == [0.9, 0.2]
    path.write_text('{"s1": "a b", "s2": "c d", "score": 4}\n{"s1": "e", "s2": "g", "score": 1' + "0" * 400 + "}\n")
    refused({"path": str(path), "score_range": [0, 5]}, f"{path}:2: score an integer of about 400 digits")
    path.write_text('{"s1": "a b", "s2": "c d", "score": " +4.5e-1 "}\n')  # text: plain ASCII, signed, exponent
    assert read_labelled({"path": str(path), "score_range": [0, 5]}).scores == [0.09]


@pytest.mark.parametrize("text", ["\u200b", "\u200b\u2060 \u00a0", "\u3000", "\x01"])
def test_a_sentence_with_no_visible_character_is_refused_as_empty(text, tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text(json.dumps({"anchor": "a", "positive": "b"}) + "\n" + json.dumps({"anchor": "c", "positive": text}))
    refused({"path": str(path)}, f"{path}:2: column 'positive' is empty")


def test_a_lone_surrogate_is_refused_naming_the_line_and_column(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text('{"anchor": "a", "positive": "b"}\n{"anchor": "c \\ud800", "positive": "d"}\n')
    refused({"path": str(path)}, f"{path}:2: column 'anchor' holds a lone surrogate (U+D800")


# ---- finding 7: unbounded numbers, nesting and damaged files


def test_a_json_integer_past_4300_digits_is_refused_read_and_streamed(tmp_path):
    path = tmp_path / "t.jsonl"
    lines = [json.dumps({"anchor": f"a {i}", "positive": f"b {i}"}) for i in range(1500)]
    lines[1499] = '{"anchor": "a", "positive": ' + "7" * 4301 + "}"
    path.write_text("\n".join(lines) + "\n")
    fragments = (f"{path}:1500: a number that cannot be read", "4300")
    refused({"path": str(path)}, *fragments)
    stream = LabelledRowStream(LabelledFile.open(path, None, None), None, 4, 32, 0, 100)  # the streamed reader
    with pytest.raises(SentembConfigError) as caught:
        for _ in stream.rounds(StreamPosition(0, 0)):
            pass
    assert all(fragment in str(caught.value) for fragment in fragments)


def test_json_nested_100k_deep_is_refused_at_its_line(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text('{"anchor": "a", "positive": "b"}\n{"anchor": ' + "[" * 100_000 + "]" * 100_000 + "}\n")
    refused({"path": str(path)}, f"{path}:2: lists or objects nested too deep")


def test_a_parquet_data_page_damaged_under_an_intact_footer_is_named(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "t.parquet"
    table = pa.table({"anchor": [f"anchor {i}" for i in range(4000)], "positive": [f"pos {i}" for i in range(4000)]})
    pq.write_table(table, path, row_group_size=2000)
    offset = pq.ParquetFile(path).metadata.row_group(1).column(0).data_page_offset
    data = bytearray(path.read_bytes())
    data[offset : offset + 40] = bytes(b ^ 0xA5 for b in data[offset : offset + 40])
    path.write_bytes(bytes(data))
    refused(
        {"path": str(path)}, f"{path}, row group 2 of 2 (after row 2000): the data cannot be read", "write it again"
    )


# ---- finding 9: a decode error at its true physical line


@pytest.mark.parametrize("kind", ["csv", "tsv"])
@pytest.mark.parametrize("line", [2, 1501])
def test_a_non_utf8_byte_is_reported_at_its_physical_line(kind, line, tmp_path):
    sep = b"," if kind == "csv" else b"\t"
    rows = [sep.join([b"anchor", b"positive"])] + [sep.join([b"a dog %d" % i, b"a cat %d" % i]) for i in range(2000)]
    rows[line - 1] = sep.join([b"caf\xff", b"x y"])
    path = tmp_path / f"t.{kind}"
    path.write_bytes(b"\n".join(rows) + b"\n")
    refused({"path": str(path)}, f"{path}:{line}: line is not valid UTF-8", f"delete line {line}")


def test_a_bad_byte_inside_a_multi_line_quoted_field_and_in_the_header_are_at_their_lines(tmp_path):
    path = tmp_path / "t.csv"
    good = b'anchor,positive\r\na,b\r\n"one\r\ntwo\r\nthree",c\r\nd,e\r\n'
    path.write_bytes(good)
    assert read_labelled({"path": str(path)}).texts == (["a", "one\r\ntwo\r\nthree", "d"], ["b", "c", "e"])
    path.write_bytes(good.replace(b"two", b"tw\xff"))
    refused({"path": str(path)}, f"{path}:4: line is not valid UTF-8")
    path.write_bytes(b"\xef\xbb\xbfanch\xff,positive\na,b\n")
    refused({"path": str(path)}, f"{path}:1: line is not valid UTF-8")


def test_the_corpus_names_a_bad_byte_at_its_line_read_and_streamed(tmp_path):
    path = tmp_path / "corpus.txt"
    lines = [b"sentence %d" % i for i in range(2000)]
    lines[1500] = b"caf\xff"
    path.write_bytes(b"\n".join(lines) + b"\n")
    with pytest.raises(SentembConfigError, match=":1501: line is not valid UTF-8"):
        check_corpus(path)
    assert ":1501: line is not valid UTF-8" in str(
        undecodable_line_error(path, UnicodeDecodeError("utf-8", b"", 0, 1, "x"))
    )


# ---- finding 13: messages with the true cause


def test_a_field_past_csvs_limit_and_an_unclosed_quote_name_their_cause(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text("anchor,positive\na,b\n" + 'c,"' + "x" * 140_000 + '"\n', encoding="utf-8")
    message = refused({"path": str(path)}, f"{path}:3: a field of the record from line 3 grows past csv's limit")
    assert "UTF-8" not in message
    path.write_text('anchor,positive\na,b\nc,"d\ne,f\n', encoding="utf-8")
    message = refused({"path": str(path)}, f"{path}:3: a quoted field opened on line 3 is never closed")
    assert "UTF-8" not in message


def test_a_fifo_or_a_device_is_not_a_regular_file_and_is_never_opened(tmp_path):
    fifo = tmp_path / "pairs.csv"
    os.mkfifo(fifo)  # opening it would block: the test would hang
    refused({"path": str(fifo)}, "is a FIFO (a named pipe), not a regular file")
    refused({"path": "/dev/zero"}, "/dev/zero is a device, not a regular file")
    with pytest.raises(SentembConfigError, match="is a FIFO .*, not a regular file"):
        check_corpus(fifo)


def test_compressed_and_arrow_files_name_decompressing_or_converting(tmp_path):
    for name, fragment in (("x.csv.gz", "gunzip -k"), ("x.jsonl.zst", "unzstd"), ("x.arrow", "convert it to parquet")):
        (tmp_path / name).write_bytes(b"\x1f\x8b")
        message = refused({"path": str(tmp_path / name)}, fragment)
        assert "rename" not in message


def test_data_columns_given_as_a_string_is_refused_naming_the_list_form(tmp_path):
    (tmp_path / "t.csv").write_text("anchor,positive\na,b\n")
    refused(
        {"path": str(tmp_path / "t.csv"), "columns": "anchor"}, "data.columns='anchor' is a str", "[anchor,positive]"
    )


def test_a_relative_data_path_and_corpus_are_recorded_absolute(tmp_path, monkeypatch, forbid_model_loading):
    monkeypatch.chdir(tmp_path)
    Path("t.csv").write_text("anchor,positive\n" + "".join(f"a {i},b {i}\n" for i in range(16)))
    cfg = compose_train(["model=tiny", "data=labelled", "data.path=t.csv", "data.batch_size=8"])
    prepare_run(cfg)
    assert cfg.data.path == str(tmp_path / "t.csv")
    Path("c.txt").write_text("".join(f"sentence {i}\n" for i in range(16)))
    cfg = compose_train(["model=tiny", "data.corpus=c.txt", "data.batch_size=8"])
    prepare_run(cfg)
    assert cfg.data.corpus == str(tmp_path / "c.txt")
