"""A labelled file of your own (data=labelled data.path=<file>): pairs, hard negatives or scored pairs, in any
registered format, its columns as data.columns and data.score_column name them (docs/labelled.md)."""

from __future__ import annotations

from sentemb.common.parts import part
from sentemb.data.sets.base import FileSource


@part("data.set", "file")
class OwnFile(FileSource):
    built_in = False
