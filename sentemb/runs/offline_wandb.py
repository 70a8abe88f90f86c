"""Read an offline W&B run's transaction log (`run-<id>.wandb`): config and metric history.

For notebooks and tests: an offline run can be analysed without syncing it anywhere.

wandb ≥0.19 writes offline runs only as this log (LevelDB-log framing: a 7-byte file header,
32 KiB blocks, records split into FULL/FIRST/MIDDLE/LAST chunks with a 7-byte header each) of
`wandb_internal_pb2.Record` protobufs, and no longer ships a Python reader for it.
"""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any

from wandb.proto import wandb_internal_pb2

from sentemb.common.file_values import parse_json

BLOCK = 32768
HEADER = 7
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def records(path: Path) -> list[wandb_internal_pb2.Record]:
    """Every complete record of the log, in order."""
    data = path.read_bytes()
    ident, magic, version = struct.unpack("<4sHB", data[:HEADER])
    assert ident == b":W&B" and magic == 0xBEE1, f"{path} is not a W&B transaction log"
    out, pending, offset = [], b"", HEADER
    while offset + HEADER <= len(data):
        room = BLOCK - offset % BLOCK
        if room < HEADER:  # the tail of a block too small for a header is zero padding
            offset += room
            continue
        _checksum, length, kind = struct.unpack("<IHB", data[offset : offset + HEADER])
        if (kind == 0 and length == 0) or offset + HEADER + length > len(data):
            break  # the end, or a record W&B is still writing (it flushes after wandb.finish() returns)
        chunk = data[offset + HEADER : offset + HEADER + length]
        offset += HEADER + length
        pending = chunk if kind in (FULL, FIRST) else pending + chunk
        if kind in (FULL, LAST):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            out.append(record)
    return out


def config_and_history(path: Path) -> tuple[dict, list[dict]]:
    """The run's config (last value of each key) and its history rows (one dict per log call)."""
    config, history = {}, []
    for record in records(path):
        kind = record.WhichOneof("record_type")
        if kind == "config":
            config.update({item.key: parse_json(item.value_json, path) for item in record.config.update})
        elif kind == "history":
            history.append(
                {
                    item.key or "/".join(item.nested_key): parse_json(item.value_json, path)
                    for item in record.history.item
                }
            )
    return config, history


def summary(path: Path) -> dict:
    """The run's summary (last value of each key)."""
    values = {}
    for record in records(path):
        if record.WhichOneof("record_type") == "summary":
            values.update(
                {
                    item.key or "/".join(item.nested_key): parse_json(item.value_json, path)
                    for item in record.summary.update
                }
            )
    return values


def run_id(path: Path) -> str:
    """The W&B run id the log belongs to (a resumed run's logs share it)."""
    for record in records(path):
        if record.WhichOneof("record_type") == "run":
            return record.run.run_id
    return ""


def run_info(path: Path) -> dict:
    """The run's display name, group, job type and tags, as wandb.init recorded them."""
    for record in records(path):
        if record.WhichOneof("record_type") == "run":
            run = record.run
            return {"name": run.display_name, "group": run.run_group, "job_type": run.job_type, "tags": list(run.tags)}
    return {}


def key_of(item: Any) -> str:
    """A history or summary item's key: its own, or its nested key's parts joined by '/'."""
    return item.key or "/".join(item.nested_key)
