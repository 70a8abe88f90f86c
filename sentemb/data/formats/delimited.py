"""Delimited text files (`Delimited`: CSV, TSV and any other one-character delimiter), read with a header row.

A file is decoded one physical line at a time, so a bad byte is named at its own line; a record may span lines
(a quoted field with a newline); quotes are CSV's (RFC 4180) except in a tab-separated file, where they are text
(STS-style files quote freely).
"""

from __future__ import annotations

import csv
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

from sentemb.common.errors import SentembConfigError
from sentemb.data.corpus import decoded
from sentemb.data.formats.base import Format, Rows

BARE_CR = re.compile(r"(?<=\r)(?!\n)")  # a lone \r ends a line too (csv's newline="" reading split there)


class Delimited(Format):
    """A header row, then one record a row, its fields split at `delimiter`."""

    delimiter: ClassVar[str] = ","

    def rows(self, path: Path) -> Rows:
        return delimited_rows(path, self.delimiter, self.label)


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


def delimited_records(path: Path, delimiter: str, label: str) -> Iterator[tuple[int, int, list[str]]]:
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
        raise delimited_error(path, start, reader.line_num, err, label) from None


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


def delimited_error(path: Path, start: int, line: int, err: csv.Error, label: str) -> SentembConfigError:
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
        f"{path}:{line}: the line cannot be read as {label} ({err}). Fix: correct that line (a NUL byte: remove it)"
    )


def delimited_rows(path: Path, delimiter: str, label: str) -> Rows:
    """The header's names, and every row with the line it starts on, read as iterated (a streamed file too)."""
    header = next((fields for _, _, fields in delimited_records(path, delimiter, label)), None)
    if not header:
        raise SentembConfigError(f"{path}: the file is empty. Fix: a header row naming the columns, then the rows")
    names = [name.strip() for name in header]

    def rows() -> Iterator[tuple[int, dict[str, Any]]]:
        records = delimited_records(path, delimiter, label)
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
    if delimiter == "\t":
        return "remove the tabs inside the sentences, or write the file as .csv with quoted fields"
    return f'quote a field that holds a {delimiter!r} ("like{delimiter} this"), doubling its quotes'
