"""SICK train as NLI triplets (data=sick_nli); its SICK-R scores are in-domain."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from sentemb.common.errors import SentembConfigError
from sentemb.common.parts import part
from sentemb.data.labelled import LabelledSet
from sentemb.data.sets.base import TabSeparatedSet


@part("data.set", "sick_nli")
class SICKNLI(TabSeparatedSet):
    """Each ENTAILMENT pair (A, B) is a row, anchor A and positive B; A's first CONTRADICTION partner (in file order,
    A on either side: the relation is symmetric) its hard negative, or none."""

    file = "SICK/SICK_train.txt"
    what = "SICK train"
    columns = ("pair_ID", "sentence_A", "sentence_B", "relatedness_score", "entailment")
    in_domain = "SICK-R"

    def rows(self, path: Path, lines: Iterator[tuple[int, list[str]]]) -> LabelledSet:
        entailed: list[tuple[str, str]] = []
        contradicted: dict[str, str] = {}
        for number, columns in lines:
            first, second, judgment = columns[1].strip(), columns[2].strip(), columns[4].strip()
            if judgment == "ENTAILMENT":
                entailed.append((first, second))
            elif judgment == "CONTRADICTION":
                contradicted.setdefault(first, second)
                contradicted.setdefault(second, first)
            elif judgment != "NEUTRAL":
                raise SentembConfigError(
                    f"{path}:{number}: entailment judgment {judgment!r} is not ENTAILMENT, NEUTRAL or CONTRADICTION. "
                    "Fix: restore the file from the SentEval download"
                )
        anchors = [first for first, _ in entailed]
        negatives = [contradicted.get(anchor) for anchor in anchors]
        return LabelledSet((anchors, [second for _, second in entailed], negatives), None, str(path))
