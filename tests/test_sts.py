"""STS-B reading and scoring as SentEval does it."""

from __future__ import annotations

import numpy as np
import pytest

from sentemb.common.errors import SentembConfigError
from sentemb.eval.sts import STSBenchmark, correlations, pairwise_cosine, read_stsb_split


def write_split(directory, name, rows):
    directory.mkdir(parents=True, exist_ok=True)
    (directory / f"sts-{name}.csv").write_text("".join("\t".join(r) + "\n" for r in rows), encoding="utf-8")


def test_reads_like_senteval(tmp_path):
    write_split(tmp_path, "dev", [["g", "f", "y", "1", "4.5", "a  man\tx", "b"], ["g", "f", "y", "2", "1", "c", "d"]])
    pairs = read_stsb_split(tmp_path / "sts-dev.csv")
    # the tab inside s1 makes x the s2 column and "b" an 8th column, exactly as SentEval's split does
    assert pairs.first == ["a man", "c"] and pairs.second == ["x", "d"] and pairs.gold.tolist() == [4.5, 1.0]


def test_malformed_lines_name_file_and_line(tmp_path):
    write_split(tmp_path, "dev", [["g", "f", "y", "1", "4.5", "a", "b"], ["g", "f", "y", "2", "4.5", "only six"]])
    with pytest.raises(SentembConfigError, match=r"sts-dev.csv:2: expected 7"):
        read_stsb_split(tmp_path / "sts-dev.csv")
    write_split(tmp_path, "dev", [["g", "f", "y", "1", "high", "a", "b"]])
    with pytest.raises(SentembConfigError, match=r"sts-dev.csv:1: gold score 'high'"):
        read_stsb_split(tmp_path / "sts-dev.csv")


def test_unknown_split_lists_valid_ones(tmp_path):
    with pytest.raises(SentembConfigError, match="valid"):
        STSBenchmark(tmp_path, splits=("validation",))


def test_spearman_against_rank_formula():
    predicted = np.array([0.1, 0.4, 0.35, 0.8, 0.9])
    gold = np.array([1.0, 2.0, 3.0, 4.0, 5.0])
    # no ties: rho = 1 − 6 Σ d² / (n (n² − 1)); ranks of predicted are 1,3,2,4,5
    d2 = (1 - 1) ** 2 + (3 - 2) ** 2 + (2 - 3) ** 2 + 0 + 0
    expected = 100 * (1 - 6 * d2 / (5 * (25 - 1)))
    # float64: scipy's correlation of ranks vs the closed form, ~1e-14 apart
    assert correlations(predicted, gold)["spearman"] == pytest.approx(expected, rel=1e-9)


def test_pairwise_cosine():
    a = np.array([[1.0, 0.0], [1.0, 1.0]], dtype=np.float32)
    b = np.array([[0.0, 2.0], [3.0, 3.0]], dtype=np.float32)
    # float64 of small integers; only the norm's square root (of 2 and 18) rounds, ~1e-16
    np.testing.assert_allclose(pairwise_cosine(a, b), [0.0, 1.0], rtol=1e-12, atol=1e-12)


class ToyEncoder:
    """Embeds a sentence as (length, number of 'a'): enough to score a hand-made benchmark."""

    def encode(self, sentences, **options):
        return np.array([[len(s), s.count("a") + 1.0] for s in sentences], dtype=np.float32)


def test_benchmark_scores_each_split(tmp_path):
    rows = [
        ["g", "f", "y", str(i), str(score), s1, s2]
        for i, (score, s1, s2) in enumerate(
            [(5.0, "aa", "aa"), (1.0, "aaaa", "b"), (3.0, "ab", "a"), (0.0, "aaaaaa", "bbbbbbbbbbbbbbbbbbb")]
        )
    ]
    write_split(tmp_path, "dev", rows)
    scores = STSBenchmark(tmp_path, splits=("dev",)).evaluate(ToyEncoder())["dev"]
    embed = ToyEncoder().encode
    cosines = pairwise_cosine(embed([r[5] for r in rows]), embed([r[6] for r in rows]))
    # exact: the toy encoder's rows do not depend on their batch, so this is the same computation on the same inputs
    assert scores["spearman"] == correlations(cosines, np.array([5.0, 1.0, 3.0, 0.0]))["spearman"]
