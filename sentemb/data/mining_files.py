"""The files of hard-negative mining (torch-free, checked before any model loads): the pairs read through
`data=labelled`'s own reader and checks, `out=` checked, and the mined rows written whole or not at all.

The pairs file is any file `data=labelled` reads (CSV, TSV, JSON lines, parquet) holding (anchor, positive) columns:
every row is checked as training checks it (file and line named). A score column, or more than two text columns, is
refused with the `data.columns=[...]` that picks the pair. The output is a CSV (or JSON lines, by `out`'s extension)
with the pairs' own column names, then `negative` (triplet) or `negative_1..k` (n-tuple): what
`data=labelled data.path=<out>` reads unchanged. It is written into a temporary file in `out`'s folder, fsynced and
renamed into place (sentemb.common.published_files): never through a link, an existing `out` refused unless
overwrite=true, and `<out>.summary.json` beside it.
"""

from __future__ import annotations

import csv
import json
import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from sentemb.common.errors import SentembConfigError
from sentemb.common.published_files import publish_text, published
from sentemb.data.formats import file_format
from sentemb.data.labelled import SCORE_COLUMNS, LabelledFile

OUT_SUFFIXES = (".csv", ".jsonl")
SUMMARY_SUFFIX = ".summary.json"
USAGE = "python -m sentemb.mine model=<m> pooling=<p> data.path=<pairs file> out=<mined.csv>"


def read_pairs(path_value: Any, columns: Sequence[str] | None = None) -> tuple[list[str], list[str], list[str]]:
    """(anchors, positives, [anchor column, positive column]) of the pairs file, every row checked by the labelled
    reader (refusals name the file and line)."""
    if path_value is None or not str(path_value).strip():
        raise SentembConfigError(f"data.path= is required: the (anchor, positive) pairs to mine for. Fix: {USAGE}")
    path = Path(str(path_value)).expanduser()
    if not path.is_file():
        what = "is a folder, not a file" if path.is_dir() else "does not exist"
        raise SentembConfigError(f"data.path={path} {what}. Fix: data.path=<a CSV/TSV/JSONL file of anchor,positive>")
    if not os.access(path, os.R_OK):
        raise SentembConfigError(f"data.path={path} cannot be read (permissions). Fix: chmod u+r {path}")
    header, _ = file_format(path).rows(path)
    scored = [name for name in header if name.lower() in SCORE_COLUMNS]
    if not columns and scored:
        texts = [name for name in header if name not in scored][:2]
        raise SentembConfigError(
            f"data.path={path} has a score column ({scored[0]}): mining takes (anchor, positive) pairs. Fix: "
            f"data.columns=[{','.join(texts)}] to mine for its pairs whatever their score (or keep the rows you mean "
            "as positives first)"
        )
    file = LabelledFile.open(path, columns, None)
    if len(file.layout.texts) != 2:
        raise SentembConfigError(
            f"data.path={path} has {len(file.layout.texts)} text columns ({', '.join(file.layout.texts)}): mining "
            f"takes (anchor, positive) pairs. Fix: data.columns=[{','.join(file.layout.texts[:2])}]"
        )
    rows = file.read()
    anchors, positives = (list(texts) for texts in rows.texts)
    return anchors, positives, list(file.layout.texts)  # type: ignore[arg-type]  (no absent text in a pair)


def checked_out(out_value: Any, data_path: Any, overwrite: bool) -> Path:
    """`out`: a .csv or .jsonl file in an existing folder, not the pairs file, not there already (nor its summary)
    unless overwrite=true."""
    if out_value is None or not str(out_value).strip():
        raise SentembConfigError(f"out= is required: the file to write the mined rows to. Fix: {USAGE}")
    out = Path(str(out_value)).expanduser()
    if out.suffix.lower() not in OUT_SUFFIXES:
        raise SentembConfigError(
            f"out={out}: {out.suffix or 'no extension'} is not a format mining writes. Fix: "
            f"out={out.with_suffix('.csv')} (or .jsonl): what data=labelled reads"
        )
    if not out.parent.is_dir():
        raise SentembConfigError(f"out={out}: its folder {out.parent} does not exist. Fix: mkdir -p {out.parent}")
    if data_path is not None:
        pairs = Path(str(data_path)).expanduser()
        if out.resolve() == pairs.resolve() or (out.exists() and pairs.exists() and os.path.samefile(out, pairs)):
            raise SentembConfigError(f"out={out} is the pairs file itself (data.path). Fix: out=<another file>")
    if out.is_dir():
        raise SentembConfigError(f"out={out} is a folder. Fix: out={out / 'mined.csv'}")
    for path in (out, summary_path(out)):
        if os.path.lexists(path) and not overwrite:  # a link there too, dangling or not
            raise SentembConfigError(f"out: {path} exists. Fix: overwrite=true to replace it, or name another out=")
    return out


def summary_path(out: Path) -> Path:
    return out.with_name(out.name + SUMMARY_SUFFIX)


def write_rows(out: Path, header: list[str], rows: Iterable[Sequence[str]], overwrite: bool) -> None:
    """The rows published as `out` whole or not at all (module docstring): renamed over it with overwrite, else
    linked (an `out` made meanwhile is refused, never replaced)."""
    try:
        with published(out, "w", replace=overwrite, encoding="utf-8", newline="") as handle:
            if out.suffix.lower() == ".jsonl":
                for row in rows:
                    handle.write(json.dumps(dict(zip(header, row, strict=True)), ensure_ascii=False) + "\n")
            else:  # RFC 4180 quoting, as sentemb's CSV reader reads it (data/formats/delimited.py)
                writer = csv.writer(handle, lineterminator="\n")
                writer.writerow(header)
                writer.writerows(rows)
    except FileExistsError:
        raise SentembConfigError(
            f"out={out} appeared while mining (another command wrote it); it was left as it is. Fix: overwrite=true "
            "to replace it, or name another out="
        ) from None


def write_summary(out: Path, summary: dict[str, Any]) -> Path:
    """`<out>.summary.json`, whole (renamed into place, never written through a link)."""
    return publish_text(summary_path(out), json.dumps(summary, indent=2) + "\n")
