"""STS-B train (data=stsb_train): 5,749 sentence pairs scored 0-5, for the losses of scored pairs; its STS-B scores
are in-domain."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from sentemb.common.parts import part
from sentemb.data.labelled import LabelledSet, checked_score
from sentemb.data.sets.base import TabSeparatedSet


@part("data.set", "stsb_train")
class STSBTrain(TabSeparatedSet):
    """Tab-separated, no header: genre, file, year, id, score, s1, s2; the sentences' whitespace normalised as
    SentEval reads them."""

    file = "STS/STSBenchmark/sts-train.csv"
    what = "STS-B train"
    header = False
    columns = ("genre", "file", "year", "id", "score", "s1", "s2")
    score_range = (0.0, 5.0)
    in_domain = "STS-B"

    def rows(self, path: Path, lines: Iterator[tuple[int, list[str]]]) -> LabelledSet:
        first, second, scores = [], [], []
        for number, columns in lines:
            first.append(" ".join(columns[5].split()))
            second.append(" ".join(columns[6].split()))
            scores.append(checked_score(columns[4], path, number, "score", self.score_range))
        return LabelledSet((first, second), scores, str(path))
