"""`python -m sentemb.download [DEST]` (`make data`): the full public data into ./data.

Fetches SimCSE's wiki1m_for_simcse.txt (1M Wikipedia sentences) into DEST/wiki/ and
SimCSE's senteval.tar (SentEval's data/downstream) into DEST/senteval/. Where the internet
cannot be reached it says so and exits with status 2, changing nothing already there.
URLs can be overridden (mirrors): SENTEMB_WIKI_URL, SENTEMB_SENTEVAL_URL.
"""

from __future__ import annotations

import os
import shutil
import sys
import tarfile
import tempfile
import urllib.error
import urllib.request
from pathlib import Path

SIMCSE_DATA = "https://huggingface.co/datasets/princeton-nlp/datasets-for-simcse/resolve/main"
WIKI_URL = os.environ.get("SENTEMB_WIKI_URL", f"{SIMCSE_DATA}/wiki1m_for_simcse.txt")
SENTEVAL_URL = os.environ.get("SENTEMB_SENTEVAL_URL", f"{SIMCSE_DATA}/senteval.tar")


class DownloadError(RuntimeError):
    pass


def fetch(url: str, target: Path, timeout: float = 30.0) -> Path:
    """Download `url` to `target` atomically (a partial download never replaces a good file)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            with tempfile.NamedTemporaryFile(dir=target.parent, delete=False) as partial:
                shutil.copyfileobj(response, partial, length=1 << 20)
    except (urllib.error.URLError, TimeoutError, OSError) as err:
        raise DownloadError(
            f"cannot download {url}: {getattr(err, 'reason', err)}.\n"
            "This machine cannot reach it (no internet?). Copy the data from a machine that can, or point "
            "SENTEMB_DATA at an existing data tree (e.g. ../shared/data: wiki/ and senteval/downstream/)."
        ) from err
    Path(partial.name).replace(target)
    return target


def download_all(dest: Path) -> None:
    wiki = dest / "wiki" / "wiki1m_for_simcse.txt"
    if wiki.is_file():
        print(f"{wiki} is already there")
    else:
        print(f"downloading {WIKI_URL} -> {wiki}")
        fetch(WIKI_URL, wiki)
    senteval = dest / "senteval"
    if (senteval / "downstream" / "STS").is_dir():
        print(f"{senteval / 'downstream'} is already there")
        return
    archive = fetch(SENTEVAL_URL, dest / "senteval.tar")
    print(f"unpacking {archive} -> {senteval}")
    with tarfile.open(archive) as tar:
        tar.extractall(senteval, filter="data")
    archive.unlink()


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    dest = Path(args[0] if args else "data")
    try:
        download_all(dest)
    except DownloadError as err:
        print(f"make data: {err}", file=sys.stderr)
        return 2
    print(
        f"data ready under {dest.resolve()} (sentemb finds ./data by itself; or export SENTEMB_DATA={dest.resolve()})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
