"""CSV: comma-separated, a header row, RFC 4180 quoting (a field holding a comma is quoted)."""

from __future__ import annotations

from sentemb.common.parts import part
from sentemb.data.formats.delimited import Delimited


@part("data.format", "csv")
class CommaSeparated(Delimited):
    extensions = (".csv",)
    label = "CSV"
    described = "comma-separated"
    delimiter = ","
