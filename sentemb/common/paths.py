"""Where things live: the checkout, its Hydra configs (conf/), the data root ($SENTEMB_DATA, ./data, ../shared/data)."""

from __future__ import annotations

import os
from pathlib import Path

from sentemb.common.errors import SentembConfigError

PROJECT_ROOT = Path(__file__).resolve().parents[2]
CONF_DIR = PROJECT_ROOT / "conf"


def data_root_candidates() -> list[Path]:
    """The places searched for the data root, in order (cwd first, then the checkout)."""
    places = [Path("data"), Path("../shared/data"), PROJECT_ROOT / "data", PROJECT_ROOT.parent / "shared" / "data"]
    seen: list[Path] = []
    for place in places:
        resolved = place.resolve()
        if resolved not in seen:
            seen.append(resolved)
    return seen


def holds_data(root: Path) -> bool:
    """A data root has a file in wiki/ or a senteval/downstream/ folder (../shared/data/README.md's layout), so an
    empty ./data (an offline `make data` or a hand-made folder) never shadows a root that has the data."""
    wiki = root / "wiki"
    return (wiki.is_dir() and any(p.is_file() for p in wiki.iterdir())) or (root / "senteval" / "downstream").is_dir()


def resolve_data_root(configured: str | os.PathLike | None = None) -> Path:
    """Return the data root: `configured` (paths.data_dir / $SENTEMB_DATA) or the first candidate that holds data."""
    if configured:
        root = Path(configured).expanduser().resolve()
        if not root.is_dir():
            raise SentembConfigError(
                f"paths.data_dir (or $SENTEMB_DATA) points to {root}, which is not a directory. "
                "Fix: set SENTEMB_DATA to the folder holding wiki/ and senteval/ (see ../shared/data/README.md), "
                "or run `make data` to download them into ./data."
            )
        return root
    for root in data_root_candidates():
        if holds_data(root):
            return root
    tried = ", ".join(str(p) for p in data_root_candidates())
    raise SentembConfigError(
        f"No data root found (tried $SENTEMB_DATA, then {tried}; a root needs a file in wiki/ or a "
        "senteval/downstream/ folder). "
        "Fix: export SENTEMB_DATA=/path/to/data, or run `make data` to download wiki1m and SentEval into ./data."
    )
