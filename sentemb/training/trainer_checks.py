"""The Trainer's counts and sizes checked, torch-free: the pre-run checks run them before torch and lightning are
imported (sentemb.training.trainer re-exports them)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from sentemb.common.errors import SentembConfigError
from sentemb.common.numbers import NON_NEGATIVE, Bounds, is_whole, require_number, require_whole, shown_value

# null where Lightning takes it; Lightning itself would name a wrong one only after the model loaded, or never
TRAINER_COUNTS = {
    "max_steps": (Bounds(-1), "trainer.max_steps=1000 (-1: trainer.max_epochs decides)"),
    "max_epochs": (Bounds(-1), "trainer.max_epochs=1 (-1: trainer.max_steps decides)"),
    "num_nodes": (Bounds(1, 4096), "trainer.num_nodes=1"),
    "log_every_n_steps": (Bounds(1), "trainer.log_every_n_steps=10"),
    "accumulate_grad_batches": (Bounds(1, 4096), "trainer.accumulate_grad_batches=1"),
    "num_sanity_val_steps": (Bounds(-1), "trainer.num_sanity_val_steps=0"),
    "check_val_every_n_epoch": (Bounds(1), "trainer.check_val_every_n_epoch=1"),
}
# the trainer's numbers that may be fractions: a finite number in these bounds, or null
TRAINER_NUMBERS = {
    "gradient_clip_val": (NON_NEGATIVE, "trainer.gradient_clip_val=1.0 (0 or null: no clipping)"),
    "limit_val_batches": (NON_NEGATIVE, "trainer.limit_val_batches=0 (a share in [0, 1], or a count of batches)"),
    "limit_train_batches": (NON_NEGATIVE, "trainer.limit_train_batches=1.0 (a share in [0, 1], or a count)"),
}


def check_trainer_sizes(trainer_cfg: Mapping[str, Any]) -> None:
    """Each of the trainer's counts and sizes a whole number (or a finite number where a share may stand) within its
    bounds, and trainer.devices a count, `auto` or device indices: `trainer.max_steps=abc` would otherwise pass the
    checks and fail inside Lightning after the model loaded, naming no key."""
    for key, (bounds, fix) in TRAINER_COUNTS.items():
        if trainer_cfg.get(key) is not None:
            require_whole(f"trainer.{key}", trainer_cfg.get(key), bounds, fix)
    for key, (bounds, fix) in TRAINER_NUMBERS.items():
        value = trainer_cfg.get(key)
        if value is not None:
            number = require_number(f"trainer.{key}", value, bounds, fix)
            if isinstance(value, float) and key.startswith("limit_") and number > 1.0:
                raise SentembConfigError(f"trainer.{key}={value}: a share is at most 1.0, a count whole. Fix: {fix}")
    check_device_count(trainer_cfg.get("devices"))


def check_device_count(devices: Any) -> None:
    """trainer.devices: a whole number >= -1 (-1: all visible), `auto`, or device indices (a list, or `0,1`)."""
    fix = "Fix: trainer.devices=1 (a count; -1 or auto: every visible device; [0,1] or '0,1': those devices)"
    text = devices.strip() if isinstance(devices, str) else None
    if devices is None or text == "auto" or (text is not None and text.lstrip("-").isdigit() and int(text) >= -1):
        return
    if text is not None and "," in text:
        devices = [part.strip() for part in text.split(",") if part.strip()]
        devices = [int(part) if part.isdigit() else part for part in devices]
    if is_whole(devices) and devices >= -1:
        return
    if isinstance(devices, Sequence) and not isinstance(devices, str) and len(devices) > 0:  # a ListConfig too
        if all(is_whole(index) and index >= 0 for index in devices):
            return
    raise SentembConfigError(f"trainer.devices={shown_value(devices)} is not a device count nor device indices. {fix}")
