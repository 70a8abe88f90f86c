"""Labelled training data: pairs, tuples with hard negatives, and scored pairs, in sentence-transformers' columns.

A row is one of (docs/labelled.md):
- `(anchor, positive)`: a pair; the positive replaces the dropout copy as view 2;
- `(anchor, positive, negative_1, ..., negative_k)`: the pair and k hard negatives, views
  `hard_negative_1` ... `hard_negative_k`: extra candidate columns of the in-batch loss;
- `(sentence1, sentence2, score)`: a scored pair (a column named `score` or `label`), for the losses of scored
  pairs (loss=cosent, angle, cosine_mse); the scores reach the loss scaled to [0, 1] by `data.score_range`.

Columns are taken in the file's order, or as `data.columns` names them; the score column is `data.score_column`,
else the one named score or label. A file is read by the format its extension picks (`sentemb.data.formats`: CSV,
TSV, JSON lines, parquet, each a `data.format` part), with a header row or named fields. One column rule for every
format, at the header (`check_header`, `check_no_number_column`): each column read has a name of its own (none
empty, none twice), and a text column whose every value is a number (an id, a score under another name) needs
data.columns. Every row is checked when the job starts (`read_labelled`, which the pre-run checks call): a missing,
empty or invisible text, a lone surrogate, a score that is not a plain decimal number within data.score_range
(bounded before conversion), a row with another number of fields than the header, JSON keys other than the first
line's, a line that is not UTF-8 (at its physical line); each refusal names the file, the line (the row, in a
parquet file) and the fix.

Where the rows come from is data.source: a file of your own (`file`) or a built-in set (`nli`, `stsb_train`,
`sick_nli`, `mrpc`, ...), each a `data.set` part in sentemb/data/sets/ that declares its reader, whether it streams,
its columns and its in-domain test set (`labelled_source`).
"""

from __future__ import annotations

import hashlib
import math
import re
import unicodedata
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from sentemb.common.batch_views import ANCHOR, POSITIVE, prefix
from sentemb.common.errors import SentembConfigError
from sentemb.common.file_values import not_text
from sentemb.common.parts import names, registered
from sentemb.data.echo import echo
from sentemb.data.formats import file_format, format_of
from sentemb.data.sentence_cut import cut_text, cut_texts

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

HARD_NEGATIVE = "hard_negative"  # views hard_negative_1 ... hard_negative_k
SCORE_COLUMNS = ("score", "label")  # sentence-transformers' names of a scored pair's label column
ABSENT = -1  # the text id of a hard negative a row lacks (sick_nli): its column is no negative of any anchor
TEXT_IDS, SCORES = "text_ids", "scores"  # a labelled batch's per-row labels beside its views


def in_domain_note(data: Mapping[str, Any]) -> str | None:
    """The caveat a report carries when the training data is a benchmark's own train split (its set's `in_domain`:
    the test set sharing its source), else None; a source no set is named has none."""
    source = data.get("source")
    entry = registered("data.set").get(source) if isinstance(source, str) else None
    task = entry.build.in_domain if entry is not None else None
    if task is None:
        return None
    return (
        f"in-domain: trained on {task}'s own train split (data={source}), so its {task} scores are not "
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


# ---- a row's place and values

MAX_NUMBER_CHARS = 64  # a number read from text: longer is no score, refused before float() or int() converts it
NUMBER = re.compile(r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")  # plain ASCII decimal only
INVISIBLE = {"Cc", "Cf", "Zs", "Zl", "Zp"}  # control, format (U+200B ...) and space characters: no visible mark


def row_where(path: Path, line: int) -> str:
    """`file:line`, or as the file's format names a row (`file, row N` in a parquet file, which has no lines)."""
    found = format_of(path)
    return f"{path}:{line}" if found is None else found.row_where(path, line)


def header_where(path: Path) -> str:
    """Where a file names its columns: its first line, or as its format says (a parquet file's schema)."""
    found = format_of(path)
    return f"{path}:1" if found is None else found.header_where(path)


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
        *,
        origin: str = "this data",
        origin_fix: str = "the file as its source writes it",
    ) -> LabelledFile:
        """`required`: the columns a built-in set's file has (`origin`: what has them; `origin_fix`: where to get
        it), read in that order unless data.columns names others."""
        asked, score_column = checked_columns(columns, score_column)
        header, _ = file_format(path).rows(path)
        missing = [name for name in required if name not in header]
        if missing:
            raise SentembConfigError(
                f"{path}: no column {', '.join(map(repr, missing))} (its columns: {', '.join(header)}), which "
                f"{origin} has. Fix: {origin_fix}"
            )
        check_header(header, asked or list(required) or None, header_where(path))
        layout = column_layout(header, asked or list(required) or None, f"data.path={path}", score_column)
        bounds = score_bounds(score_range, f"data.path={path}") if layout.score else None
        return cls(path, layout, bounds, named=bool(asked))

    def rows(self) -> Iterator[tuple[list[str], float | None]]:
        """Every row as (its texts in view order, its score scaled to [0, 1] or None), checked as it is read."""
        _, rows = file_format(self.path).rows(self.path)
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


# ---- where the rows come from: data.source, a `data.set` part


class RowSource(Protocol):
    """What labelled.py asks of a `data.set` part (sentemb/data/sets/base.py: `LabelledSource`, which each set
    subclasses)."""

    def locate(self, path: Path) -> None:
        """data.path checked as the config is read."""

    def read(self, path: Path, data: Mapping[str, Any], limit: int | None = None) -> LabelledSet:
        """Its rows, every one checked."""

    def open(self, path: Path, data: Mapping[str, Any]) -> LabelledFile:
        """Its file opened for data.streaming=true."""


@dataclass(frozen=True)
class Source:
    """Where a data config's labelled rows come from: data.source, data.path, and the `data.set` part's reader."""

    name: str
    path: Path
    reader: RowSource


def built_in_sets() -> list[str]:
    """The built-in sets' names (data=<name>), as the registry has them."""
    return names("data.set", lambda entry: entry.build.built_in)


def scored_sets() -> list[str]:
    """The built-in sets of scored pairs (their reader's fixed `score_range`)."""
    return names("data.set", lambda entry: entry.build.built_in and entry.build.score_range is not None)


def source_part(source: Any) -> type:
    """The class of the `data.set` part data.source names (null: `file`), what it declares read from it; else refused
    naming the sources there are."""
    source = source or "file"
    entry = registered("data.set").get(source) if isinstance(source, str) else None
    if entry is None:
        raise SentembConfigError(
            f"data.source={source!r} is not one of {', '.join(names('data.set'))}. Fix: e.g. data=labelled, or a "
            "built-in set of your own: a class with @part('data.set', <name>) in sentemb/data/sets/ and its "
            "conf/data/<name>.yaml (docs/layout.md)"
        )
    return entry.build


def labelled_source(data: Mapping[str, Any]) -> Source:
    """The data config's `source` and `path`, checked (a registered source; a file that exists; a built-in set's
    folder as it is read)."""
    source = data.get("source") or "file"
    declared = source_part(source)
    path = data.get("path")
    if not path:
        fix = f"data.path=<the file> (data=labelled), or a built-in set: data={', '.join(built_in_sets())}"
        raise SentembConfigError(f"data.source={source}: data.path is not set. Fix: {fix}")
    path = Path(str(path)).expanduser()
    reader: RowSource = declared()
    reader.locate(path)
    return Source(source, path, reader)


def read_labelled(data: Mapping[str, Any], limit: int | None = None) -> LabelledSet:
    """The labelled rows a data config names (`source`, `path`, `columns`, `score_range`), every row checked (a file:
    its first `limit` rows, a streamed file's head)."""
    source = labelled_source(data)
    return source.reader.read(source.path, data, limit)


def open_labelled(data: Mapping[str, Any]) -> LabelledFile:
    """The labelled file a data config names, opened and its header checked, for data.streaming=true to read."""
    source = labelled_source(data)
    return source.reader.open(source.path, data)


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
