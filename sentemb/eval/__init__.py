"""Evaluation exactly as SentEval / SimCSE compute it."""

from sentemb.eval.sts import STSBenchmark, correlations, pairwise_cosine, read_stsb_split

__all__ = ["STSBenchmark", "correlations", "pairwise_cosine", "read_stsb_split"]
