"""MRPC train's paraphrase pairs (data=mrpc): its Quality-1 rows, in file order."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from sentemb.common.errors import SentembConfigError
from sentemb.common.parts import part
from sentemb.data.labelled import LabelledSet
from sentemb.data.sets.base import TabSeparatedSet


@part("data.set", "mrpc")
class MRPCTrain(TabSeparatedSet):
    file = "MRPC/msr_paraphrase_train.txt"
    what = "MRPC train"
    columns = ("Quality", "#1 ID", "#2 ID", "#1 String", "#2 String")

    def rows(self, path: Path, lines: Iterator[tuple[int, list[str]]]) -> LabelledSet:
        first, second = [], []
        for number, columns in lines:
            if columns[0] not in ("0", "1"):
                raise SentembConfigError(
                    f"{path}:{number}: Quality {columns[0]!r} is not 0 or 1. Fix: restore the file"
                )
            if columns[0] == "1":
                first.append(columns[3].strip())
                second.append(columns[4].strip())
        return LabelledSet((first, second), None, str(path))
