"""Text → batches: the corpus check and the training datamodule."""
