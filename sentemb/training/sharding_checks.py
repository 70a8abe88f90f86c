"""What trainer.devices asks for, torch-free: the pre-run checks count the data-parallel processes (each its own
batch) before torch and lightning are imported (sentemb.training.sharding re-exports it)."""

from __future__ import annotations

from typing import Any


def devices_asked(devices: Any) -> int:
    """Processes per node that trainer.devices asks for; 0 where only Lightning knows ("auto", -1)."""
    if isinstance(devices, bool) or devices is None:
        return 0
    if isinstance(devices, int):
        return max(devices, 0)
    if isinstance(devices, str):
        text = devices.strip()
        if "," in text:  # device indices, e.g. "0,1"
            return len([part for part in text.split(",") if part.strip()])
        return max(int(text), 0) if text.lstrip("-").isdigit() else 0
    return len(list(devices))  # a list of device indices
