"""The training corpus (one sentence per line, SimCSE's wiki1m format), checked before anything expensive."""

from __future__ import annotations

import stat
from dataclasses import dataclass
from pathlib import Path

from sentemb.common.errors import SentembConfigError

# data.streaming=true checks only this many lines up front (more while all are blank); the stream checks the rest
HEAD_LINES = 1000


@dataclass(frozen=True)
class CorpusReport:
    path: Path
    lines: int  # the lines read: the whole file, or its head when streaming
    blank_lines: int
    whole: bool = True


def check_corpus(path: Path, streaming: bool = False) -> CorpusReport:
    """Read the corpus once as bytes: every line must be UTF-8 and at least one must be non-blank.

    streaming: only the first HEAD_LINES lines (and on while they are all blank), so a corpus of 100M lines
    starts at once; the stream reports a bad line further on when it reaches it (`undecodable_line_error`).
    """
    if path.is_dir():
        raise SentembConfigError(
            f"data.corpus={path} is a directory, not a file{files_inside(path)}. "
            "Fix: data.corpus=<a text file with one sentence per line>, e.g. data.corpus=<that folder>/<file>.txt"
        )
    special = not_regular(path)  # a FIFO is never opened: reading it would wait for a writer
    if special:
        raise SentembConfigError(
            f"data.corpus: training corpus {path} is {special}, not a regular file. "
            "Fix: copy the sentences into a text file (one sentence per line) and set data.corpus to it"
        )
    if not path.is_file():
        raise SentembConfigError(
            f"data.corpus: training corpus {path} does not exist. "
            "Fix: set data.corpus=/path/to/sentences.txt (one sentence per line), point SENTEMB_DATA at a data "
            "root that has wiki/wiki1m_head.txt, or run `make data` to download wiki1m."
        )
    lines = blank = 0
    with path.open("rb") as handle:
        for lines, raw in enumerate(handle, start=1):
            blank += not decoded(raw, path, lines).strip()
            if streaming and lines >= HEAD_LINES and blank < lines:
                return CorpusReport(path, lines, blank, whole=False)
    if lines == blank:
        raise SentembConfigError(
            f"{path}: the corpus has no sentences ({lines} lines, all blank). "
            "Fix: point data.corpus at a text file with one sentence per line."
        )
    return CorpusReport(path, lines, blank)


def not_regular(path: Path) -> str | None:
    """What `path` is when it exists but is neither a regular file nor a folder (told by stat, never opened: a FIFO
    would block the reader, /dev/zero never ends), else None."""
    try:
        mode = path.stat().st_mode
    except OSError:
        return None  # absent (or unreachable): the caller says so
    if stat.S_ISREG(mode) or stat.S_ISDIR(mode):
        return None
    if stat.S_ISFIFO(mode):
        return "a FIFO (a named pipe)"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    return "a socket" if stat.S_ISSOCK(mode) else "a special file"


def files_inside(folder: Path, shown: int = 3) -> str:
    """' (it holds a.txt, b.txt)': a few of the files a folder given as the corpus holds, to pick one from."""
    names = sorted(entry.name for entry in folder.iterdir() if entry.is_file())
    more = ", ..." if len(names) > shown else ""
    return f" (it holds {', '.join(names[:shown])}{more})" if names else ""


def decoded(raw: bytes, path: Path, number: int) -> str:
    """Line `number` of `path` as text, or the error naming it and the fix."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise SentembConfigError(
            f"{path}:{number}: line is not valid UTF-8 ({err.reason} at byte {err.start}). "
            f"Fix: re-encode the file as UTF-8 (e.g. `iconv -f latin1 -t utf-8`) or delete line {number}."
        ) from err


def undecodable_line_error(path: Path, cause: UnicodeDecodeError) -> SentembConfigError:
    """The file:line error for the first non-UTF-8 line of `path`: a reader that decodes in blocks (Hugging Face
    `datasets` reads 10 MB at a time) knows only the block, so the lines are read again up to the bad one."""
    try:
        check_corpus(path)
    except SentembConfigError as err:
        return err
    return SentembConfigError(f"{path}: not valid UTF-8 ({cause.reason}). Fix: re-encode the file as UTF-8.")
