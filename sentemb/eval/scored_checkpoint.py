"""Which checkpoint file a `results.json` scored: its path and a content identity (size and modification time),
recorded by sentemb.evaluate (`checkpoint_identity`) and checked by sentemb.export's model card (`why_not_scored`),
which shows only results of its own checkpoint."""

from __future__ import annotations

import os
from collections.abc import Mapping
from datetime import datetime
from pathlib import Path
from typing import Any

SCORED = "checkpoint_file"  # results.json's key


def checkpoint_identity(checkpoint: str | Path) -> dict[str, Any]:
    """The file `checkpoint` names: its absolute path, size and modification time (ns). A checkpoint is written once
    (published whole, never modified in place), so another file, or another write at that path, differs here."""
    path = Path(checkpoint).expanduser()
    found = path.stat()
    return {"path": os.path.abspath(path), "size": found.st_size, "mtime_ns": found.st_mtime_ns}


def why_not_scored(results: Mapping[str, Any], checkpoint: str | Path) -> str:
    """'' when `results` scored the file `checkpoint` names now; else why not, in words."""
    scored = results.get(SCORED)
    if not isinstance(scored, Mapping) or not isinstance(scored.get("size"), int):
        return "it does not record which checkpoint file it scored (written before sentemb recorded that, or edited)"
    here = checkpoint_identity(checkpoint)
    if (scored.get("size"), scored.get("mtime_ns")) == (here["size"], here["mtime_ns"]):
        return ""
    return (
        f"it scored {scored.get('path')} ({described(scored)}), not this checkpoint file ({here['path']}, "
        f"{described(here)})"
    )


def described(identity: Mapping[str, Any]) -> str:
    """`<size> bytes, modified <time>`."""
    mtime = identity.get("mtime_ns")
    when = datetime.fromtimestamp(mtime / 1e9).isoformat(timespec="seconds") if isinstance(mtime, int) else "?"
    return f"{identity.get('size')} bytes, modified {when}"
