"""What a file format of labelled data declares (`Format`), and the format a file's extension picks (`file_format`).

A format reads a file as its column names and its rows, each row with the line it starts on (or its row number, in a
format without lines) and {column: value}; the column rule, the checks of each value and the columns' roles are the
same for every format (sentemb.data.labelled).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

from sentemb.common.errors import SentembConfigError
from sentemb.common.parts import registered

Rows = tuple[list[str], Iterator[tuple[int, dict[str, Any]]]]  # the column names, then every (line, {column: value})

# extensions no format reads, each refused with how to make it one that is read
COMPRESSED = {".gz": "gunzip -k", ".bz2": "bunzip2 -k", ".xz": "unxz -k", ".zst": "unzstd", ".zip": "unzip"}
ARROW = (".arrow", ".feather", ".ipc")


class Format:
    """A file format: the extensions that pick it (lower case, with the dot), how refusals name it, its row reader.
    A format holds no state: each `rows` call reads the file again from its start."""

    extensions: ClassVar[tuple[str, ...]] = ()
    label: ClassVar[str] = ""  # its name in a refusal: CSV, TSV, ...
    described: ClassVar[str] = ""  # what a file of it holds, as a refusal's fix says it: "comma-separated", ...

    def rows(self, path: Path) -> Rows:
        """The file's column names and its rows, read as iterated (a streamed file too), each checked as read."""
        raise NotImplementedError(f"{type(self).__name__}.rows")

    def row_where(self, path: Path, number: int) -> str:
        """Where row `number` (as `rows` numbered it) is: `file:line`."""
        return f"{path}:{number}"

    def header_where(self, path: Path) -> str:
        """Where the file names its columns: its first line."""
        return f"{path}:1"


def formats_by_extension() -> dict[str, Format]:
    """Every registered format under each of its extensions; an extension two formats claim is refused."""
    found: dict[str, Format] = {}
    for name, entry in registered("data.format").items():
        for extension in entry.build.extensions:
            other = found.get(extension.lower())
            if other is not None:
                raise SentembConfigError(
                    f"data.format parts {type(other).__name__} and {entry.path} ({name}) both read {extension} "
                    "files. Fix: give one of them another extension"
                )
            found[extension.lower()] = entry.build()
    return found


def format_of(path: Path) -> Format | None:
    """The format `path`'s extension picks, None when none does."""
    return formats_by_extension().get(path.suffix.lower())


def file_format(path: Path) -> Format:
    """The format `path`'s extension picks, else refused naming the extensions read (a compressed or Arrow file:
    how to make it one of them)."""
    formats = formats_by_extension()
    suffix = path.suffix.lower()
    if suffix in formats:
        return formats[suffix]
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
    kinds = {type(fmt): fmt for fmt in formats.values()}.values()  # each format once, in its extensions' order
    named = "; ".join(f"{fmt.described}: {fmt.extensions[0]}" for fmt in kinds)
    raise SentembConfigError(
        f"data.path={path}: labelled data is read by its extension, one of {', '.join(formats)}; "
        f"{suffix or 'none'} is not one. Fix: rename the file to its format's extension ({named})"
    )


def extensions() -> list[str]:
    """Every extension a registered format reads."""
    return list(formats_by_extension())
