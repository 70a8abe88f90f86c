"""What a source of labelled rows declares (`LabelledSource`), and the two kinds sentemb has: a labelled file read by
its format (`FileSource`) and a set in a tab-separated file read by its own rule (`TabSeparatedSet`: SentEval's
train splits).

A source declares the facts that were tables in sentemb.data.labelled and its checks: whether data.streaming=true
may read it (`streams`), whether its reader reads data.columns, data.score_range and data.score_column
(`reads_columns`), the one score scale a fixed reader reads (`score_range`), the test set its scores are in-domain
on (`in_domain`), the columns its file has (`columns`); and its reader (`read`, `open`). A source holds no state:
each call reads its file again.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, ClassVar

from sentemb.common.errors import SentembConfigError
from sentemb.data.corpus import files_inside, not_regular
from sentemb.data.formats import extensions
from sentemb.data.labelled import LabelledFile, LabelledSet

SENTEVAL_FIX = (
    "point SENTEMB_DATA (or paths.data_dir) at a data root holding senteval/downstream/ (docs/data.md), or run "
    "`make data`"
)


class LabelledSource:
    """A source of labelled rows, named by data.source (conf/data/<name>.yaml)."""

    built_in: ClassVar[bool] = True  # a set sentemb names (data=<name>), not a file of your own
    streams: ClassVar[bool] = False  # data.streaming=true reads it as training goes; else it is small, read whole
    reads_columns: ClassVar[bool] = False  # its reader reads data.columns, data.score_range, data.score_column
    score_range: ClassVar[tuple[float, float] | None] = None  # a fixed reader's score scale (None: no scores)
    in_domain: ClassVar[str | None] = None  # the test set sharing its source: scores there after training are in-domain
    columns: ClassVar[tuple[str, ...]] = ()  # the columns its file has, in view order where it is read by them

    def locate(self, path: Path) -> None:
        """data.path checked as the config is read (a file read by its format: it exists); by default the set's own
        files are checked as they are read."""

    def read(self, path: Path, data: Mapping[str, Any], limit: int | None = None) -> LabelledSet:
        """Every row under data.path, checked (a streamed file: its first `limit` rows)."""
        raise NotImplementedError(f"{type(self).__name__}.read")

    def open(self, path: Path, data: Mapping[str, Any]) -> LabelledFile:
        """Its file opened for data.streaming=true (only a source that `streams`)."""
        raise SentembConfigError(
            f"data.streaming=true with data.source={data.get('source')}: a built-in set is small and read whole. "
            "Fix: data.streaming=false"
        )


def require_file(path: Path, what: str, fix: str) -> Path:
    """`path` if it is a regular file, else refused naming `what` and `fix` (a directory: the files it holds)."""
    if path.is_dir():
        raise SentembConfigError(f"data.path={path} is a directory, not a file{files_inside(path)}. Fix: {fix}")
    special = not_regular(path)  # a FIFO is never opened: reading it would wait for a writer
    if special:
        raise SentembConfigError(f"{what} {path} is {special}, not a regular file. Fix: {fix}")
    if not path.is_file():
        raise SentembConfigError(f"{what} {path} does not exist. Fix: {fix}")
    return path


class FileSource(LabelledSource):
    """A labelled file at data.path, read by the format its extension picks (sentemb.data.formats); streamed when
    data.streaming=true; data.columns, data.score_range and data.score_column read as given. `columns`: the header a
    named file has (read in that order unless data.columns names others)."""

    streams = True
    reads_columns = True
    what: ClassVar[str] = "data.path: the labelled file"  # how a refusal names the file
    origin: ClassVar[str] = "this data"  # what has `columns`, as a refusal of a file without them says
    columns_fix: ClassVar[str] = "data.columns naming the columns to read"  # the fix of a file without `columns`

    def fix(self, path: Path) -> str:
        """How to get the file, as a refusal of a missing one says."""
        return f"data.path=<a {', '.join(extensions())} file>"

    def locate(self, path: Path) -> None:
        require_file(path, self.what, self.fix(path))

    def open(self, path: Path, data: Mapping[str, Any]) -> LabelledFile:
        return LabelledFile.open(
            path, data.get("columns"), data.get("score_range"), self.columns, data.get("score_column"),
            origin=self.origin, origin_fix=self.columns_fix,
        )  # fmt: skip

    def read(self, path: Path, data: Mapping[str, Any], limit: int | None = None) -> LabelledSet:
        return self.open(path, data).read(limit)


class TabSeparatedSet(LabelledSource):
    """A set in a tab-separated file under data.path (sentemb's own: a train split in SentEval's tree, data.path its
    downstream/ folder), read whole by its own rule (`rows`); `columns`: the file's fields, each line checked to have
    them."""

    file: ClassVar[str] = ""  # its file under data.path
    what: ClassVar[str] = ""  # its name in a refusal: STS-B train, ...
    header: ClassVar[bool] = True  # its first line names its fields (no row)
    fix: ClassVar[str] = SENTEVAL_FIX  # how to get the file, as a refusal of a missing one says

    def read(self, path: Path, data: Mapping[str, Any], limit: int | None = None) -> LabelledSet:
        file = require_file(path / self.file, self.what, self.fix)
        return self.rows(file, tab_lines(file, len(self.columns), ", ".join(self.columns), self.header))

    def rows(self, path: Path, lines: Iterator[tuple[int, list[str]]]) -> LabelledSet:
        """The set's rows from its file's checked `lines` (each: its line number, its fields)."""
        raise NotImplementedError(f"{type(self).__name__}.rows")


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
