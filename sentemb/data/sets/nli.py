"""SimCSE's supervised data (data=nli): nli_for_simcse.csv, 275,601 SNLI+MNLI premises, each with an entailment as
positive and a contradiction as hard negative, under its header `sent0, sent1, hard_neg`."""

from __future__ import annotations

from pathlib import Path

from sentemb.common.parts import part
from sentemb.data.sets.base import FileSource

NLI_COLUMNS = ("sent0", "sent1", "hard_neg")  # SimCSE's nli_for_simcse.csv header: anchor, positive, hard negative
NLI_URL = "https://huggingface.co/datasets/princeton-nlp/datasets-for-simcse/resolve/main/nli_for_simcse.csv"


@part("data.set", "nli")
class SimCSENLI(FileSource):
    columns = NLI_COLUMNS
    what = "SimCSE's NLI file"
    origin = "SimCSE’s nli_for_simcse.csv"
    columns_fix = f"the file as downloaded ({NLI_URL})"

    def fix(self, path: Path) -> str:
        return f"download it ({NLI_URL}) to {path}, or set data.path"
