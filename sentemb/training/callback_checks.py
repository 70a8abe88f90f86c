"""The dev evaluation callback's check of its eval.* options, torch-free: run by the pre-run checks before torch and
lightning are imported (sentemb.training.callbacks re-exports it)."""

from __future__ import annotations

from sentemb.common.numbers import Bounds, require_flag, require_whole

# sentences the dev evaluation encodes together (padded to the longest): 512x the default 128, past any device's memory
MAX_EVAL_BATCH = 2**16


def check_every_n_steps(every_n_steps: object) -> None:
    """eval.every_n_steps: the dev evaluation's interval, a whole number >= 1."""
    require_whole("eval.every_n_steps", every_n_steps, Bounds(1), "e.g. eval.every_n_steps=125")


def check_eval_settings(every_n_steps: object, batch_size: object, at_start: object) -> None:
    """The dev evaluation's interval, its encoding batch and whether it scores the encoder before the first step."""
    check_every_n_steps(every_n_steps)
    require_whole("eval.batch_size", batch_size, Bounds(1, MAX_EVAL_BATCH), "eval.batch_size=128")
    require_flag("eval.at_start", at_start, "eval.at_start=true, or false")
