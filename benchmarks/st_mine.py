"""sentence-transformers' `mine_hard_negatives` on a pairs CSV (anchor, positive), for recipes_vs_st.py's (c): run in
its own process, importing only sentence-transformers' side, so its wall time compares with `python -m sentemb.mine`'s.

    python benchmarks/st_mine.py MODEL_DIR PAIRS.csv OUT.csv

The model: MODEL_DIR's transformer at 128 tokens with mean pooling; the options: issue 64's (top sampling, 3
negatives, range 0-20, relative_margin 0.05, n-tuple); the output a CSV with its columns as a header.
"""

from __future__ import annotations

import csv
import sys
from pathlib import Path


def main(argv: list[str]) -> int:
    model_dir, pairs, out = argv
    from datasets import Dataset
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Pooling, Transformer
    from sentence_transformers.util import mine_hard_negatives

    with open(pairs, encoding="utf-8", newline="") as handle:
        rows = list(csv.reader(handle))[1:]
    dataset = Dataset.from_dict({"anchor": [r[0] for r in rows], "positive": [r[1] for r in rows]})
    word = Transformer(model_dir, max_seq_length=128)
    model = SentenceTransformer(modules=[word, Pooling(word.get_word_embedding_dimension(), "mean")], device="cpu")
    mined = mine_hard_negatives(
        dataset, model, anchor_column_name="anchor", positive_column_name="positive", range_min=0, range_max=20,
        relative_margin=0.05, num_negatives=3, sampling_strategy="top", output_format="n-tuple", use_faiss=False,
        verbose=False,
    )  # fmt: skip
    partial = Path(out).with_name(Path(out).name + ".partial")
    with partial.open("w", encoding="utf-8", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(mined.column_names)
        writer.writerows([record[c] for c in mined.column_names] for record in mined)
    partial.replace(out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
