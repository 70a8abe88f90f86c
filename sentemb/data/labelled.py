"""Labelled training data: pairs, tuples with hard negatives, and scored pairs, in sentence-transformers' columns.

A row is one of (docs/labelled.md):
- `(anchor, positive)`: a pair; the positive replaces the dropout copy as view 2;
- `(anchor, positive, negative_1, ..., negative_k)`: the pair and k hard negatives, views
  `hard_negative_1` ... `hard_negative_k`: extra candidate columns of the in-batch loss;
- `(sentence1, sentence2, score)`: a scored pair (a column named `score` or `label`), for the losses of scored
  pairs (loss=cosent, angle, cosine_mse); the scores reach the loss scaled to [0, 1] by `data.score_range`.

Columns are taken in the file's order, or as `data.columns` names them; the score column is `data.score_column`,
else the one named score or label. A file is CSV, TSV, JSON lines or parquet, by its extension, with a header row
(CSV, TSV) or named fields (JSON, parquet). One column rule for every format, at the header (`check_header`,
`check_no_number_column`): each column read has a name of its own (none empty, none twice), and a text column whose
every value is a number (an id, a score under another name) needs data.columns. Every row is checked when the job
starts (`read_labelled`, which the pre-run checks call): a missing, empty or invisible text, a lone surrogate, a score
that is not a plain decimal number within data.score_range (bounded before conversion), a row with another number of
fields than the header, JSON keys other than the first line's, a line that is not UTF-8 (at its physical line); each
refusal names the file, the line (the row, in a parquet file) and the fix.

Built in, from the SentEval tree under $SENTEMB_DATA: `stsb_train` (STS-B train's scored pairs), `sick_nli` (SICK
train: each ENTAILMENT pair, its premise's CONTRADICTION partner as hard negative where it has one), `mrpc`
(MRPC train's paraphrase pairs); `nli` is SimCSE's nli_for_simcse.csv (`sent0, sent1, hard_neg`).
"""

from __future__ import annotations

import csv
import hashlib
import json
import math
import re
import reprlib
import unicodedata
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sentemb.common.batch_views import ANCHOR, POSITIVE, prefix
from sentemb.common.errors import SentembConfigError
from sentemb.common.file_values import not_text
from sentemb.data.corpus import decoded, files_inside, not_regular
from sentemb.data.sentence_cut import cut_text, cut_texts

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

HARD_NEGATIVE = "hard_negative"  # views hard_negative_1 ... hard_negative_k
SCORE_COLUMNS = ("score", "label")  # sentence-transformers' names of a scored pair's label column
FORMATS = {".csv": "csv", ".tsv": "tsv", ".jsonl": "json", ".json": "json", ".parquet": "parquet"}
SOURCES = ("file", "nli", "stsb_train", "sick_nli", "mrpc")
STREAMED_SOURCES = ("file", "nli")  # files, which data.streaming=true reads as training goes
NLI_COLUMNS = ("sent0", "sent1", "hard_neg")  # SimCSE's nli_for_simcse.csv header
NLI_URL = "https://huggingface.co/datasets/princeton-nlp/datasets-for-simcse/resolve/main/nli_for_simcse.csv"
ABSENT = -1  # the text id of a hard negative a row lacks (sick_nli): its column is no negative of any anchor
TEXT_IDS, SCORES = "text_ids", "scores"  # a labelled batch's per-row labels beside its views


# the test sets a built-in set shares its source with: scores on them after training on it are in-domain
IN_DOMAIN = {"stsb_train": "STS-B", "sick_nli": "SICK-R"}


def in_domain_note(data: Mapping[str, Any]) -> str | None:
    """The caveat a report carries when the training data is a benchmark's own train split (else None)."""
    task = IN_DOMAIN.get(str(data.get("source")))
    if task is None:
        return None
    return (
        f"in-domain: trained on {task}'s own train split (data={data.get('source')}), so its {task} scores are not "
        "comparable with the unsupervised tables"
    )


def hard_negative_role(number: int) -> str:
    """The view of each row's `number`-th hard negative (1-based)."""
    return f"{HARD_NEGATIVE}_{number}"


def labelled_roles(views: int) -> list[str]:
    """The roles of a labelled row's `views` texts: anchor, positive, then its hard negatives."""
    return [ANCHOR, POSITIVE, *(hard_negative_role(b) for b in range(1, views - 1))]


def is_hard_negative(role: str) -> bool:
    return role.startswith(f"{HARD_NEGATIVE}_")


@dataclass(frozen=True)
class LabelledSet:
    """Checked labelled rows: `texts[v]` is view v's sentence of every row (anchor, positive, hard negatives; an
    absent hard negative is None), `scores` the scored pairs' scores scaled to [0, 1] (None: not scored)."""

    texts: tuple[list[str | None], ...]
    scores: list[float] | None
    source: str

    @property
    def roles(self) -> list[str]:
        return labelled_roles(len(self.texts))

    @property
    def hard_negatives(self) -> int:
        return len(self.texts) - 2

    def __len__(self) -> int:
        return len(self.texts[0])

    def columns(self, max_length: int | None = None) -> dict[str, list]:
        """The rows as `datasets` columns: each view's text ('' for an absent hard negative), and the scores; texts
        cut for `max_length` tokens first (`cut_text`), so neither the hash nor the tokenizer reads past the cut."""
        views = self.texts if max_length is None else tuple(cut_texts(texts, max_length) for texts in self.texts)
        columns: dict[str, list] = {
            role: [text or "" for text in texts] for role, texts in zip(self.roles, views, strict=True)
        }
        columns[TEXT_IDS] = [[text_id(texts[row]) for texts in views] for row in range(len(self))]
        if self.scores is not None:
            columns[SCORES] = self.scores
        return columns


def text_id(text: str | None) -> int:
    """A sentence's 63-bit id (equal texts, equal ids: a duplicate is masked as no negative of itself), ABSENT for
    none."""
    if text is None:
        return ABSENT
    return int.from_bytes(hashlib.blake2b(text.encode("utf-8"), digest_size=8).digest(), "big") >> 1


# ---- reading a file: (header, numbered rows) per format

MAX_NUMBER_CHARS = 64  # a number read from text: longer is no score, refused before float() or int() converts it
NUMBER = re.compile(r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")  # plain ASCII decimal only
ECHO_CHARS = 40  # a value a refusal quotes is cut to this many characters (and says how long it was)
INVISIBLE = {"Cc", "Cf", "Zs", "Zl", "Zp"}  # control, format (U+200B ...) and space characters: no visible mark
BARE_CR = re.compile(r"(?<=\r)(?!\n)")  # a lone \r ends a line too (csv's newline="" reading split there)
COMPRESSED = {".gz": "gunzip -k", ".bz2": "bunzip2 -k", ".xz": "unxz -k", ".zst": "unzstd", ".zip": "unzip"}
ARROW = (".arrow", ".feather", ".ipc")


def file_format(path: Path) -> str:
    suffix = path.suffix.lower()
    kind = FORMATS.get(suffix)
    if kind is not None:
        return kind
    if suffix in COMPRESSED:
        inner = path.with_suffix("")
        raise SentembConfigError(
            f"data.path={path} is compressed ({suffix}), and labelled data is read uncompressed. Fix: decompress it "
            f"(`{COMPRESSED[suffix]} {path}`), then data.path={inner}"
        )
    if suffix in ARROW:
        raise SentembConfigError(
            f"data.path={path} is an Arrow file ({suffix}), which the labelled reader does not read. Fix: convert it "
            f"to parquet (pyarrow: pq.write_table(table, '{path.with_suffix('.parquet')}'); a datasets Dataset: "
            f"ds.to_parquet(...)), then data.path=<that .parquet file>"
        )
    raise SentembConfigError(
        f"data.path={path}: labelled data is read by its extension, one of {', '.join(FORMATS)}; "
        f"{suffix or 'none'} is not one. Fix: rename the file to its format's extension (a comma-separated "
        "file: .csv; tab-separated: .tsv; one JSON object a line: .jsonl)"
    )


def row_where(path: Path, line: int) -> str:
    """`file:line`, or `file, row N` in a parquet file (which has no lines)."""
    return f"{path}, row {line}" if path.suffix.lower() == ".parquet" else f"{path}:{line}"


def header_where(path: Path) -> str:
    """Where a file names its columns: its first line, or a parquet file's schema."""
    return f"{path}, schema" if path.suffix.lower() == ".parquet" else f"{path}:1"


def echo(value: Any) -> str:
    """`value` as a refusal quotes it: at most ECHO_CHARS characters, saying how long it was."""
    if isinstance(value, str):
        return repr(value) if len(value) <= ECHO_CHARS else f"{value[:ECHO_CHARS]!r}... ({len(value):,} characters)"
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 128:
        return f"an integer of about {int(value.bit_length() * math.log10(2)):,} digits"  # repr fails past 4,300
    text = reprlib.repr(value)
    return text if len(text) <= ECHO_CHARS else f"{text[:ECHO_CHARS]}..."


def numbered_rows(path: Path, kind: str) -> tuple[list[str], Iterator[tuple[int, dict[str, Any]]]]:
    """The file's column names and its rows, each as (its line, or its row in a parquet file; {column: value})."""
    if kind in ("csv", "tsv"):
        return delimited_rows(path, "," if kind == "csv" else "\t")
    if kind == "json":
        return json_rows(path)
    return parquet_rows(path)


class PhysicalLines:
    """A file's lines decoded one physical line at a time, so a bad byte is named at its own line (a text-mode
    handle decodes in blocks, ahead of the line csv has reached). `pieces`: the lines since `mark()`."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.pieces: list[str] = []
        self.done = False  # the file read to its end

    def __iter__(self) -> Iterator[str]:
        number = 0
        with self.path.open("rb") as handle:
            for raw in handle:
                text = decoded(raw, self.path, number + 1)
                if number == 0:
                    text = text.removeprefix("\ufeff")  # a BOM is not part of the first column's name
                for piece in BARE_CR.split(text) if "\r" in text else (text,):
                    if piece:
                        number += 1
                        self.pieces.append(piece)
                        yield piece
        self.done = True

    def mark(self) -> None:
        self.pieces.clear()


def delimited_records(path: Path, delimiter: str) -> Iterator[tuple[int, int, list[str]]]:
    """Every record (the header first) as (the line it starts on, the line it ends on, its fields)."""
    # TSV: quotes are text (STS-style files quote freely); CSV: RFC 4180 quoting, fields with commas quoted
    quoting = csv.QUOTE_NONE if delimiter == "\t" else csv.QUOTE_MINIMAL
    lines = PhysicalLines(path)
    reader = csv.reader(lines, delimiter=delimiter, quoting=quoting)
    start = 1
    try:
        for fields in reader:
            if lines.done and quoting != csv.QUOTE_NONE and unclosed_quote(lines.pieces, delimiter):
                raise SentembConfigError(
                    f"{path}:{start}: a quoted field opened on line {start} is never closed (the file ends inside "
                    f"it, at line {reader.line_num}). Fix: close the quote, and double each quote inside a field "
                    '("a ""quoted"" word")'
                )
            yield start, reader.line_num, fields
            start = reader.line_num + 1
            lines.mark()
    except csv.Error as err:
        raise delimited_error(path, start, reader.line_num, err) from None


def unclosed_quote(pieces: list[str], delimiter: str) -> bool:
    """Whether a record's lines end inside a quoted field: csv (not strict) returns such a field silently at the end
    of the file, holding every line after its quote."""
    if not pieces or not any('"' in piece for piece in pieces):
        return False
    try:
        list(csv.reader(iter(pieces), delimiter=delimiter, strict=True))
    except csv.Error as err:
        return "unexpected end of data" in str(err)
    return False


def delimited_error(path: Path, start: int, line: int, err: csv.Error) -> SentembConfigError:
    """csv's refusal with its true cause: a field past its size limit (a sentence that long, or an unclosed quote
    that swallows the lines after it), a NUL byte, or another."""
    if "field larger than field limit" in str(err):
        return SentembConfigError(
            f"{path}:{start}: a field of the record from line {start} grows past csv's limit of 128 KiB "
            f"({csv.field_size_limit():,} characters) by line {line}: a quote opened there and not closed (it "
            "swallows the lines after it), or a text that long. Fix: close the quote (double a quote inside a field: "
            '""), or cut the text under 128 KiB'
        )
    return SentembConfigError(
        f"{path}:{line}: the line cannot be read as {'CSV' if path.suffix.lower() == '.csv' else 'TSV'} ({err}). "
        "Fix: correct that line (a NUL byte: remove it)"
    )


def delimited_rows(path: Path, delimiter: str) -> tuple[list[str], Iterator[tuple[int, dict[str, Any]]]]:
    """The header's names, and every row with the line it starts on, read as iterated (a streamed file too)."""
    header = next((fields for _, _, fields in delimited_records(path, delimiter)), None)
    if not header:
        raise SentembConfigError(f"{path}: the file is empty. Fix: a header row naming the columns, then the rows")
    names = [name.strip() for name in header]

    def rows() -> Iterator[tuple[int, dict[str, Any]]]:
        records = delimited_records(path, delimiter)
        next(records)
        for start, end, fields in records:
            if not fields:  # a blank line
                continue
            if len(fields) != len(names):
                spans = f" (the record runs from line {start} to line {end}: a quote opened and closed late)"
                raise SentembConfigError(
                    f"{path}:{start}: {len(fields)} fields, but the header has {len(names)} "
                    f"({', '.join(names)}){spans if end > start else ''}. Fix: {quoting_fix(delimiter)}"
                )
            yield start, dict(zip(names, fields, strict=True))

    return names, rows()


def quoting_fix(delimiter: str) -> str:
    if delimiter == ",":
        return 'quote a field that holds a comma ("like, this"), doubling its quotes, or write the file as .tsv'
    return "remove the tabs inside the sentences, or write the file as .csv with quoted fields"


def json_rows(path: Path) -> tuple[list[str], Iterator[tuple[int, dict[str, Any]]]]:
    """The keys of the first object, and every object with its line, read as iterated (a streamed file too); every
    object must have the first one's keys (a key the first lacks would be dropped, a missing one read as empty)."""

    def objects() -> Iterator[tuple[int, dict[str, Any]]]:
        with path.open("rb") as handle:
            for number, raw in enumerate(handle, start=1):
                if raw.strip():
                    yield number, json_object(raw, path, number)

    first = next(objects(), None)
    if first is None:
        raise SentembConfigError(f"{path}: the file has no rows. Fix: one JSON object a line")
    keys = list(first[1])

    def rows() -> Iterator[tuple[int, dict[str, Any]]]:
        for number, value in objects():
            if value.keys() != set(keys):
                raise keys_differ(path, number, first[0], keys, list(value))
            yield number, value

    return keys, rows()


def keys_differ(path: Path, number: int, first: int, keys: list[str], found: list[str]) -> SentembConfigError:
    missing = [key for key in keys if key not in found]
    extra = [key for key in found if key not in keys]
    named = (("lacks", missing), ("adds", extra))
    parts = [f"{label} {', '.join(map(echo, names))}" for label, names in named if names]
    return SentembConfigError(
        f"{path}:{number}: the object's keys differ from the first object's (line {first}: "
        f"{', '.join(map(echo, keys))}): it {' and '.join(parts)} (a key the first object lacks would be dropped). "
        f"Fix: give every line the same keys as line {first}, or delete line {number}"
    )


class RepeatedKey(Exception):
    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key


def unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """An object's fields, a repeated key refused (json.loads keeps the last silently: a shadowed name)."""
    value = dict(pairs)
    if len(value) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise RepeatedKey(key)
            seen.add(key)
    return value


def json_object(raw: bytes, path: Path, number: int) -> dict[str, Any]:
    text = decoded(raw, path, number)
    fix = 'Fix: one flat JSON object a line, {"anchor": "...", "positive": "..."}'
    try:
        value = json.loads(text.removeprefix("\ufeff") if number == 1 else text, object_pairs_hook=unique_keys)
    except RepeatedKey as err:
        raise SentembConfigError(
            f"{path}:{number}: the object names {echo(err.key)} twice: json keeps the last, the first is lost. "
            f"Fix: give each field its own name"
        ) from None
    except json.JSONDecodeError as err:
        raise SentembConfigError(f"{path}:{number}: not a JSON object ({err}). {fix}") from None
    except ValueError as err:  # an integer past Python's 4,300 digits: no score, no sentence
        raise SentembConfigError(f"{path}:{number}: a number that cannot be read ({err}). {fix}") from None
    except RecursionError:
        raise SentembConfigError(f"{path}:{number}: lists or objects nested too deep to parse. {fix}") from None
    if not isinstance(value, dict):
        raise SentembConfigError(f"{path}:{number}: a JSON {type(value).__name__}, not an object. {fix}")
    return value


def parquet_rows(path: Path) -> tuple[list[str], Iterator[tuple[int, dict[str, Any]]]]:
    """The schema's columns, and every row with its number, read a record batch at a time (a streamed file too)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        table = pq.ParquetFile(path)
    except Exception as err:  # noqa: BLE001 - pyarrow's errors are many; each is a file that is not parquet
        raise SentembConfigError(f"{path}: not a parquet file ({err}). Fix: write it with pandas/pyarrow") from err

    def rows() -> Iterator[tuple[int, dict[str, Any]]]:
        number, groups = 0, table.num_row_groups
        for group in range(groups):
            try:
                for batch in table.iter_batches(batch_size=4096, row_groups=[group]):
                    for values in batch.to_pylist():
                        number += 1
                        yield number, values
            except (OSError, ValueError, pa.ArrowException) as err:  # a corrupt page under an intact footer
                raise SentembConfigError(
                    f"{path}, row group {group + 1} of {groups} (after row {number}): the data cannot be read "
                    f"({str(err)[:200]}): the file is damaged. Fix: write it again from its source (pandas' "
                    "df.to_parquet, pyarrow's pq.write_table)"
                ) from None

    return list(table.schema_arrow.names), rows()


# ---- which column is what


@dataclass(frozen=True)
class Layout:
    """The text columns in view order (anchor, positive, hard negatives) and the score column (None: not scored)."""

    texts: list[str]
    score: str | None


def checked_columns(columns: Any, score_column: Any) -> tuple[list[str] | None, str | None]:
    """data.columns (a list of names, or None) and data.score_column (a name, or None), as given or refused."""
    fix = "Fix: data.columns=[anchor,positive] (the columns to read, in view order, in brackets)"
    if columns is not None:
        if isinstance(columns, str) or not isinstance(columns, Sequence):
            raise SentembConfigError(
                f"data.columns={echo(columns)} is a {type(columns).__name__}, not a list of column names (a string "
                f"would be read letter by letter). {fix}"
            )
        if not all(isinstance(name, str) and name.strip() for name in columns):
            raise SentembConfigError(f"data.columns={list(columns)}: each entry must be a column's name. {fix}")
    if score_column is not None and not (isinstance(score_column, str) and score_column.strip()):
        raise SentembConfigError(
            f"data.score_column={echo(score_column)} must be a column's name. Fix: data.score_column=similarity "
            "(the file's score column), or null for a column named score or label"
        )
    return (list(columns) or None) if columns is not None else None, score_column


def check_header(header: Sequence[str], asked: Sequence[str] | None, where: str) -> None:
    """The one column rule of every format: each column read has a name of its own. Without data.columns every
    column is read, so none may be unnamed (pandas' df.to_csv keeps its index as `,anchor,positive`) or repeated
    (one name would read one column for two views); with it, the columns it names."""
    for name in asked or header:
        count = sum(column == name for column in header)
        if not name:
            raise SentembConfigError(
                f"{where}: column {header.index(name) + 1} of the header has no name (pandas' df.to_csv writes its "
                "index so: `,anchor,positive`), and it would be read as a sentence. Fix: write the file without the "
                "index (df.to_csv(path, index=False)), or data.columns=[anchor,positive] naming the columns to read"
            )
        if count > 1:
            raise SentembConfigError(
                f"{where}: the header names {name!r} {count} times: one name would read the same column for two "
                "views. Fix: give each column its own name (data.columns cannot tell them apart)"
            )


def column_layout(
    header: Sequence[str], asked: Sequence[str] | None, where: str, score_column: str | None = None
) -> Layout:
    """The columns to read: `asked` (data.columns) in its order, else the file's, each checked against the header;
    the score column is data.score_column, else the one named score or label."""
    if asked:
        missing = [name for name in asked if name not in header]
        if missing:
            raise SentembConfigError(
                f"{where}: data.columns names {', '.join(map(repr, missing))}, which the file does not have (its "
                f"columns: {', '.join(header)}). Fix: data.columns=[{','.join(header)}] or a subset, in view order"
            )
        if len(set(asked)) != len(asked):
            raise SentembConfigError(f"{where}: data.columns={list(asked)} names a column twice. Fix: each once")
    chosen = list(asked or header)
    if score_column is not None:
        if score_column not in header:
            raise SentembConfigError(
                f"{where}: data.score_column={score_column!r}, which the file does not have (its columns: "
                f"{', '.join(header)}). Fix: data.score_column=<one of them>"
            )
        chosen = chosen if score_column in chosen else [*chosen, score_column]
        scores = [score_column]
    else:
        scores = [name for name in chosen if name.lower() in SCORE_COLUMNS]
    texts = [name for name in chosen if name not in scores]
    if len(scores) > 1:
        raise SentembConfigError(
            f"{where}: two score columns ({', '.join(scores)}). Fix: data.columns=[<sentence 1>,<sentence 2>,<score>]"
        )
    if len(texts) < 2:
        raise SentembConfigError(
            f"{where}: labelled rows need at least an anchor and a positive column, but the columns are "
            f"{', '.join(chosen) or 'none'}. Fix: a header `anchor,positive` (then any hard negatives), or "
            "data.columns naming them; one sentence per line is unlabelled: data=wiki data.corpus=<file>"
        )
    return Layout(texts, scores[0] if scores else None)


def score_bounds(score_range: Sequence[float] | None, where: str) -> tuple[float, float]:
    """data.score_range as (low, high), low < high: scored pairs need it (the scores are checked and scaled by it)."""
    fix = "Fix: data.score_range=[0,5] (STS-B's; the lowest and highest score the file may hold)"
    if score_range is None:
        raise SentembConfigError(f"{where}: the rows are scored pairs, but data.score_range is not set. {fix}")
    values = list(score_range) if isinstance(score_range, Sequence) and not isinstance(score_range, str) else None
    ok = (
        values is not None
        and len(values) == 2
        and all(isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) for v in values)
        and values[0] < values[1]
    )
    if not ok:
        raise SentembConfigError(
            f"data.score_range={score_range} must be two finite numbers [low, high], low < high. {fix}"
        )
    return float(values[0]), float(values[1])


def is_number_text(text: str) -> bool:
    """A plain ASCII decimal number (sign, point, exponent), bounded in length: what a score may be written as."""
    text = text.strip()
    return len(text) <= MAX_NUMBER_CHARS and NUMBER.fullmatch(text) is not None


def number(value: Any) -> float | None:
    """A score's value as a float, or None: a number (a JSON or parquet number), or its text as `is_number_text`
    reads it, bounded before it is converted ("4_5" and Arabic-Indic digits, which float() reads, are no score)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        try:
            return float(value)
        except OverflowError:  # an integer past a float's range (1 and 400 zeros)
            return None
    if isinstance(value, float | Decimal):
        return float(value)
    if isinstance(value, str) and is_number_text(value):
        return float(value)
    return None


def has_visible(text: str) -> bool:
    """Whether a text has a character that shows: not only whitespace, control or format characters (U+200B)."""
    return any(not char.isspace() and unicodedata.category(char) not in INVISIBLE for char in text)


def checked_text(value: Any, path: Path, line: int, column: str) -> str:
    where = row_where(path, line)
    if value is None or (isinstance(value, str) and not has_visible(value)):
        shown = "" if value is None or not value.strip() else f" (no visible character: {echo(value)})"
        raise SentembConfigError(
            f"{where}: column {column!r} is {'missing' if value is None else 'empty'}{shown}: every labelled row "
            "needs each of its sentences. Fix: fill it in, or delete the row"
        )
    if not isinstance(value, str):
        raise SentembConfigError(
            f"{where}: column {column!r} holds {echo(value)} ({type(value).__name__}), not text. Fix: a sentence "
            "there (an id or a score column: data.columns=[<the text columns>], data.score_column=<the score>)"
        )
    why = not_text(value)
    if why:
        raise SentembConfigError(
            f"{where}: column {column!r} {why}. Fix: write the character itself (UTF-8), not a half of its escape, "
            "or delete the row"
        )
    return value


def checked_score(value: Any, path: Path, line: int, column: str, bounds: tuple[float, float]) -> float:
    low, high = bounds
    score = number(value)
    if score is None or not math.isfinite(score) or not low <= score <= high:
        raise SentembConfigError(
            f"{row_where(path, line)}: {column} {echo(value)} is not a finite number in data.score_range "
            f"[{low:g}, {high:g}] (a score is a plain decimal number: digits 0-9, a sign, a point, an exponent). "
            "Fix: correct the score, delete the row, or set data.score_range to the file's scale"
        )
    return (score - low) / (high - low)  # the losses read [0, 1]


def check_no_number_column(path: Path, layout: Layout, texts: Sequence[list[str | None]]) -> None:
    """A text column whose every value (of the rows read) is a number is an id or a score under another name (pandas'
    index, a leading id column, `sentence1,sentence2,similarity`), which would shift every view: refused at the
    header unless data.columns names the columns."""
    for column, role, values in zip(layout.texts, labelled_roles(len(layout.texts)), texts, strict=True):
        if values and all(value is not None and is_number_text(value) for value in values):
            others = [name for name in layout.texts if name != column]
            raise SentembConfigError(
                f"{header_where(path)}: every value of column {column!r} ({len(values):,} rows read) is a number, "
                f"not a sentence: a row id, or a score under another name than {' or '.join(SCORE_COLUMNS)}, read "
                f"as the {role}. Fix: data.columns=[{','.join(others)}] (the text columns, in view order), or, for "
                f"scored pairs, data.score_column={column} data.score_range=[<low>,<high>]"
            )


@dataclass(frozen=True)
class LabelledFile:
    """A labelled file opened and its header checked: its path, the columns to read (`layout`), the scores' range
    (`bounds`, scored pairs only) and whether data.columns named them (`named`). `rows()` reads it again from the
    start, each row checked as it is read."""

    path: Path
    layout: Layout
    bounds: tuple[float, float] | None
    named: bool = False

    @classmethod
    def open(
        cls,
        path: Path,
        columns: Sequence[str] | None,
        score_range: Sequence[float] | None,
        required: Sequence[str] = (),
        score_column: str | None = None,
    ) -> LabelledFile:
        asked, score_column = checked_columns(columns, score_column)
        header, _ = numbered_rows(path, file_format(path))
        missing = [name for name in required if name not in header]
        if missing:
            raise SentembConfigError(
                f"{path}: no column {', '.join(map(repr, missing))} (its columns: {', '.join(header)}), which "
                f"{'SimCSE’s nli_for_simcse.csv' if required == NLI_COLUMNS else 'this data'} has. Fix: the file as "
                f"downloaded ({NLI_URL})"
            )
        check_header(header, asked or list(required) or None, header_where(path))
        layout = column_layout(header, asked or list(required) or None, f"data.path={path}", score_column)
        bounds = score_bounds(score_range, f"data.path={path}") if layout.score else None
        return cls(path, layout, bounds, named=bool(asked))

    def rows(self) -> Iterator[tuple[list[str], float | None]]:
        """Every row as (its texts in view order, its score scaled to [0, 1] or None), checked as it is read."""
        _, rows = numbered_rows(self.path, file_format(self.path))
        for line, row in rows:
            texts = [checked_text(row.get(column), self.path, line, column) for column in self.layout.texts]
            score = None
            if self.layout.score is not None and self.bounds is not None:
                score = checked_score(row.get(self.layout.score), self.path, line, self.layout.score, self.bounds)
            yield texts, score

    def read(self, limit: int | None = None) -> LabelledSet:
        """Every row (or the first `limit`: a streamed file's head), checked."""
        texts: tuple[list[str | None], ...] = tuple([] for _ in self.layout.texts)
        scores: list[float] | None = [] if self.layout.score else None
        for count, (row, score) in enumerate(self.rows(), start=1):
            for values, text in zip(texts, row, strict=True):
                values.append(text)
            if scores is not None and score is not None:
                scores.append(score)
            if limit is not None and count >= limit:
                break
        if not texts[0]:
            raise SentembConfigError(f"{self.path}: the header is there but no row. Fix: add the labelled rows")
        if not self.named:
            check_no_number_column(self.path, self.layout, texts)
        return LabelledSet(texts, scores, str(self.path))


def read_file(
    path: Path,
    columns: Sequence[str] | None,
    score_range: Sequence[float] | None,
    required: Sequence[str] = (),
    score_column: str | None = None,
) -> LabelledSet:
    """Every row of a labelled file, checked (module docstring). `required`: the columns a named format has."""
    return LabelledFile.open(path, columns, score_range, required, score_column).read()


# ---- the built-in sets, read from the SentEval tree


def require_file(path: Path, what: str, fix: str) -> Path:
    if path.is_dir():
        raise SentembConfigError(f"data.path={path} is a directory, not a file{files_inside(path)}. Fix: {fix}")
    special = not_regular(path)  # a FIFO is never opened: reading it would wait for a writer
    if special:
        raise SentembConfigError(f"{what} {path} is {special}, not a regular file. Fix: {fix}")
    if not path.is_file():
        raise SentembConfigError(f"{what} {path} does not exist. Fix: {fix}")
    return path


SENTEVAL_FIX = (
    "point SENTEMB_DATA (or paths.data_dir) at a data root holding senteval/downstream/ (docs/data.md), or run "
    "`make data`"
)


def tab_lines(path: Path, fields: int, layout: str, header: bool = True) -> Iterator[tuple[int, list[str]]]:
    """A SentEval tab-separated file's lines (after its header), each split into at least `fields` fields."""
    with path.open(encoding="utf-8-sig") as handle:
        if header:
            next(handle, None)
        for number, line in enumerate(handle, start=2 if header else 1):
            if not line.strip():
                continue
            columns = line.rstrip("\n").split("\t")
            if len(columns) < fields or any(not c.strip() for c in columns[:fields]):
                raise SentembConfigError(
                    f"{path}:{number}: expected {fields} tab-separated fields ({layout}), found {len(columns)} or an "
                    "empty one. Fix: restore the file from the SentEval download"
                )
            yield number, columns


def read_stsb_train(senteval: Path) -> LabelledSet:
    """STS-B train: 5,749 pairs scored 0–5 (tab-separated, no header: genre, file, year, id, score, s1, s2), the
    sentences' whitespace normalised as SentEval reads them."""
    path = require_file(senteval / "STS" / "STSBenchmark" / "sts-train.csv", "STS-B train", SENTEVAL_FIX)
    first, second, scores = [], [], []
    for number, columns in tab_lines(path, 7, "genre, file, year, id, score, s1, s2", header=False):
        first.append(" ".join(columns[5].split()))
        second.append(" ".join(columns[6].split()))
        scores.append(checked_score(columns[4], path, number, "score", (0.0, 5.0)))
    return LabelledSet((first, second), scores, str(path))


def read_sick_nli(senteval: Path) -> LabelledSet:
    """SICK train as NLI triplets: each ENTAILMENT pair (A, B) is a row, anchor A and positive B; A's first
    CONTRADICTION partner (in file order, A on either side: the relation is symmetric) its hard negative, or none."""
    path = require_file(senteval / "SICK" / "SICK_train.txt", "SICK train", SENTEVAL_FIX)
    entailed: list[tuple[str, str]] = []
    contradicted: dict[str, str] = {}
    for number, columns in tab_lines(path, 5, "pair_ID, sentence_A, sentence_B, relatedness_score, entailment"):
        first, second, judgment = columns[1].strip(), columns[2].strip(), columns[4].strip()
        if judgment == "ENTAILMENT":
            entailed.append((first, second))
        elif judgment == "CONTRADICTION":
            contradicted.setdefault(first, second)
            contradicted.setdefault(second, first)
        elif judgment != "NEUTRAL":
            raise SentembConfigError(
                f"{path}:{number}: entailment judgment {judgment!r} is not ENTAILMENT, NEUTRAL or CONTRADICTION. "
                "Fix: restore the file from the SentEval download"
            )
    anchors = [first for first, _ in entailed]
    return LabelledSet(
        (anchors, [second for _, second in entailed], [contradicted.get(anchor) for anchor in anchors]), None, str(path)
    )


def read_mrpc(senteval: Path) -> LabelledSet:
    """MRPC train's paraphrase pairs (Quality 1), in file order."""
    path = require_file(senteval / "MRPC" / "msr_paraphrase_train.txt", "MRPC train", SENTEVAL_FIX)
    first, second = [], []
    for number, columns in tab_lines(path, 5, "Quality, #1 ID, #2 ID, #1 String, #2 String"):
        if columns[0] not in ("0", "1"):
            raise SentembConfigError(f"{path}:{number}: Quality {columns[0]!r} is not 0 or 1. Fix: restore the file")
        if columns[0] == "1":
            first.append(columns[3].strip())
            second.append(columns[4].strip())
    return LabelledSet((first, second), None, str(path))


@dataclass(frozen=True)
class Source:
    """Where a data config's labelled rows come from: its source, its path, the columns a named format has."""

    name: str
    path: Path
    required: tuple[str, ...] = ()


def labelled_source(data: Mapping[str, Any]) -> Source:
    """The data config's `source` and `path`, checked (a file that exists, a built-in set's folder)."""
    source = data.get("source") or "file"
    if source not in SOURCES:
        raise SentembConfigError(f"data.source={source!r} is not one of {', '.join(SOURCES)}. Fix: e.g. data=labelled")
    path = data.get("path")
    if not path:
        fix = "data.path=<the file> (data=labelled), or a built-in set: data=stsb_train, sick_nli, mrpc, nli"
        raise SentembConfigError(f"data.source={source}: data.path is not set. Fix: {fix}")
    path = Path(str(path)).expanduser()
    if source == "nli":
        require_file(path, "SimCSE's NLI file", f"download it ({NLI_URL}) to {path}, or set data.path")
    elif source == "file":
        require_file(path, "data.path: the labelled file", "data.path=<a .csv, .tsv, .jsonl or .parquet file>")
    return Source(source, path, NLI_COLUMNS if source == "nli" else ())


def read_labelled(data: Mapping[str, Any], limit: int | None = None) -> LabelledSet:
    """The labelled rows a data config names (`source`, `path`, `columns`, `score_range`), every row checked (a file:
    its first `limit` rows, a streamed file's head)."""
    source = labelled_source(data)
    if source.name in STREAMED_SOURCES:
        opened = LabelledFile.open(
            source.path, data.get("columns"), data.get("score_range"), source.required, data.get("score_column")
        )
        return opened.read(limit)
    readers = {"stsb_train": read_stsb_train, "sick_nli": read_sick_nli, "mrpc": read_mrpc}
    return readers[source.name](source.path)


def encode_labelled(
    rows: dict[str, list], tokenizer: PreTrainedTokenizerBase, max_length: int, roles: Sequence[str]
) -> dict[str, list[list[int]]]:
    """A batch of labelled rows → each view's token ids (cut, truncated to `max_length`) under its role's prefix (the
    anchor's under the tokenizer's names), as `datasets.map(batched=True)` takes it; the labels stay as they are."""
    encoded: dict[str, list[list[int]]] = {}
    for role in roles:
        encoded.update(
            {
                f"{prefix(role)}{key}": ids
                for key, ids in tokenizer(
                    [cut_text(text, max_length) for text in rows[role]], truncation=True, max_length=max_length
                ).items()
            }
        )
    return encoded
