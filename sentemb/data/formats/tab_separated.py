"""TSV: tab-separated, a header row, quotes read as text (STS-style files quote freely)."""

from __future__ import annotations

from sentemb.common.parts import part
from sentemb.data.formats.delimited import Delimited


@part("data.format", "tsv")
class TabSeparated(Delimited):
    extensions = (".tsv",)
    label = "TSV"
    described = "tab-separated"
    delimiter = "\t"
