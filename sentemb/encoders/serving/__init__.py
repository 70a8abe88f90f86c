"""Serving: the encoder as one ONNX graph, and the ONNX folder's loader (numpy, onnxruntime, tokenizers only)."""
