"""Where things live: the checkout, its Hydra configs (conf/), the data root ($SENTEMB_DATA, ./data, <checkout>/data).

docs/data.md describes a data root's layout and this search order.
"""

from __future__ import annotations

import os
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from sentemb.common.errors import SentembConfigError

PROJECT_ROOT = Path(__file__).resolve().parents[2]
CONF_DIR = PROJECT_ROOT / "conf"
ENV_VAR = "SENTEMB_DATA"


def data_root_candidates() -> list[Path]:
    """The places searched for the data root when none is configured, in order: ./data (cwd), <checkout>/data."""
    seen: list[Path] = []
    for place in (Path("data"), PROJECT_ROOT / "data"):
        resolved = place.resolve()
        if resolved not in seen:
            seen.append(resolved)
    return seen


def holds_data(root: Path) -> bool:
    """A data root has a file in wiki/ or a senteval/downstream/ folder (docs/data.md's layout), so an empty ./data
    (a hand-made folder) never shadows a root that has the data."""
    wiki = root / "wiki"
    return (wiki.is_dir() and any(p.is_file() for p in wiki.iterdir())) or (root / "senteval" / "downstream").is_dir()


def configured_root() -> tuple[str, str] | None:
    """($SENTEMB_DATA's value, its name) when the variable is set and not empty."""
    value = os.environ.get(ENV_VAR)
    return (value, f"${ENV_VAR}") if value else None


def found_data_root() -> Path | None:
    """The first candidate that holds data, or None (no configured root is consulted here)."""
    return next((root for root in data_root_candidates() if holds_data(root)), None)


def resolve_data_root(configured: str | os.PathLike | None = None) -> Path:
    """Return the data root: `configured` (paths.data_dir), else $SENTEMB_DATA, else the first candidate that holds
    data; the error says exactly which of these it tried."""
    source = "paths.data_dir"
    if not configured and (env := configured_root()):
        configured, source = env
    elif configured and os.environ.get(ENV_VAR) == str(configured):
        source = f"${ENV_VAR}"  # conf/paths/default.yaml's paths.data_dir is $SENTEMB_DATA
    if configured:
        root = Path(configured).expanduser().resolve()
        if not root.is_dir():
            raise SentembConfigError(
                f"{source} points to {root}, which is not a directory. Fix: set SENTEMB_DATA (or paths.data_dir) "
                "to the folder holding wiki/ and senteval/ (docs/data.md), or unset it and run `make data` to "
                "download them into ./data."
            )
        return root
    if (root := found_data_root()) is not None:
        return root
    tried = ", ".join(str(p) for p in data_root_candidates())
    raise SentembConfigError(
        f"No data root found: SENTEMB_DATA is not set and paths.data_dir is null, so {tried} were searched, and none "
        "has a file in wiki/ or a senteval/downstream/ folder. "
        "Fix: export SENTEMB_DATA=/path/to/data (docs/data.md), or run `make data` to download wiki1m and SentEval "
        "into ./data."
    )


def absolute_data_paths(data: DictConfig) -> None:
    """data.path and data.corpus as absolute paths, as paths.data_dir is filled in: the logged config names the file
    read, wherever the run is looked at from (one given through ${paths.data_dir} is absolute once that is)."""
    for key in ("path", "corpus"):
        if key in data and not OmegaConf.is_interpolation(data, key) and data[key]:
            data[key] = os.path.abspath(Path(str(data[key])).expanduser())
