"""The stream's checks of data.streaming's options, torch-free: run by the pre-run checks before torch, pyarrow and
datasets are imported (sentemb.data.streaming re-exports it)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sentemb.common.errors import SentembConfigError
from sentemb.common.numbers import Bounds, require_flag, require_whole

# a streamed shuffle holds this many lines (each cut to char_limit(max_length) characters) in memory; a larger
# buffer holds more than data.streaming=false, which shuffles the whole corpus from its memory-mapped Arrow file
MAX_SHUFFLE_BUFFER = 2**22


def check_streaming(data: Mapping[str, Any], trainer: Mapping[str, Any]) -> None:
    """data.streaming=true needs the run's length up front and reads in the training process; data.shuffle_buffer, when
    set, is a whole number of lines from 1 to MAX_SHUFFLE_BUFFER (checked streamed or not: it is allocated as read)."""
    streaming = require_flag("data.streaming", data.get("streaming", False), "data.streaming=true, or false")
    shuffle = require_flag("data.shuffle", data.get("shuffle", True), "data.shuffle=true, or false")
    buffer = data.get("shuffle_buffer")
    if buffer is not None or (streaming and shuffle):
        require_whole(
            "data.shuffle_buffer",
            buffer,
            Bounds(1, MAX_SHUFFLE_BUFFER),
            f"data.shuffle_buffer=10000 (lines held in memory for the streamed shuffle; at most {MAX_SHUFFLE_BUFFER}), "
            "or data.streaming=false to shuffle the whole corpus from disk",
        )
    if not streaming:
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
