"""The stream's checks of data.streaming's options, torch-free: run by the pre-run checks before torch, pyarrow and
datasets are imported (sentemb.data.streaming re-exports it)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sentemb.common.errors import SentembConfigError


def check_streaming(data: Mapping[str, Any], trainer: Mapping[str, Any]) -> None:
    """data.streaming=true needs the run's length up front and reads in the training process."""
    if not data.get("streaming"):
        return
    max_steps = trainer.get("max_steps")
    if max_steps is None or max_steps <= 0:
        raise SentembConfigError(
            f"data.streaming=true needs trainer.max_steps (the LR schedule's length: a stream has no length to "
            f"count), but trainer.max_steps={max_steps}. Fix: pass trainer.max_steps=N"
        )
    if data.get("num_workers"):
        raise SentembConfigError(
            f"data.streaming=true reads and tokenises in the training process (about a millisecond a batch; each "
            f"worker would read the whole stream), but data.num_workers={data.get('num_workers')}. "
            "Fix: pass data.num_workers=0"
        )
    buffer = data.get("shuffle_buffer")
    if data.get("shuffle", True) and (buffer is None or buffer < 1):
        raise SentembConfigError(
            f"data.shuffle_buffer={buffer}: a shuffled stream needs a buffer of >= 1 lines. "
            "Fix: pass data.shuffle_buffer=10000, or data.shuffle=false to read the file in order"
        )
