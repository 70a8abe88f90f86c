"""The dev evaluation callback's check of its eval.* options, torch-free: run by the pre-run checks before torch and
lightning are imported (sentemb.training.callbacks re-exports it)."""

from __future__ import annotations

from sentemb.common.errors import SentembConfigError


def check_every_n_steps(every_n_steps: int) -> None:
    """eval.every_n_steps: the dev evaluation's interval, >= 1."""
    if every_n_steps < 1:
        raise SentembConfigError(f"eval.every_n_steps={every_n_steps} must be >= 1, e.g. eval.every_n_steps=125")
