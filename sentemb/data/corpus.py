"""The training corpus (one sentence per line, SimCSE's wiki1m format), checked before anything expensive."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from sentemb.common.errors import SentembConfigError


@dataclass(frozen=True)
class CorpusReport:
    path: Path
    lines: int
    blank_lines: int


def check_corpus(path: Path) -> CorpusReport:
    """Read the corpus once as bytes: every line must be UTF-8 and at least one must be non-blank."""
    if not path.is_file():
        raise SentembConfigError(
            f"data.corpus: training corpus {path} does not exist. "
            "Fix: set data.corpus=/path/to/sentences.txt (one sentence per line), point SENTEMB_DATA at a data "
            "root that has wiki/wiki1m_head.txt, or run `make data` to download wiki1m."
        )
    lines = blank = 0
    with path.open("rb") as handle:
        for lines, raw in enumerate(handle, start=1):
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as err:
                raise SentembConfigError(
                    f"{path}:{lines}: line is not valid UTF-8 ({err.reason} at byte {err.start}). "
                    f"Fix: re-encode the file as UTF-8 (e.g. `iconv -f latin1 -t utf-8`) or delete line {lines}."
                ) from err
            blank += not text.strip()
    if lines == blank:
        raise SentembConfigError(
            f"{path}: the corpus has no sentences ({lines} lines, all blank). "
            "Fix: point data.corpus at a text file with one sentence per line."
        )
    return CorpusReport(path, lines, blank)
