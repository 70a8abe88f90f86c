"""Training: the LightningModule, GradCache, callbacks, exact resume, the Trainer, and the pre-run checks."""
