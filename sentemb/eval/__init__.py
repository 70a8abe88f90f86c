"""Evaluation exactly as SentEval / SimCSE compute it, and what an export ships beside its scores: the model card,
whitening='s module, format=onnx's graphs measured against the torch encoder."""

from sentemb.eval.sts import STSBenchmark, correlations, pairwise_cosine, read_stsb_split

__all__ = ["STSBenchmark", "correlations", "pairwise_cosine", "read_stsb_split"]
