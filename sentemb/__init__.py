"""sentemb: unsupervised contrastive sentence embeddings, configured by Hydra, trained by Lightning."""

__version__ = "0.1.0"
