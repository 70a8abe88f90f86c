"""Tokens → sentence vector: backbones, the SentenceEncoder, and every pooling and head (one `Pooling` interface)."""
