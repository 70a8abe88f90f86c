"""`python -m sentemb.download [DEST]` (`make data`): the full public data into ./data.

Fetches SimCSE's wiki1m_for_simcse.txt (1M Wikipedia sentences) into DEST/wiki/ and
SimCSE's senteval.tar (SentEval's data/downstream) into DEST/senteval/. Where the internet
cannot be reached it says so and exits with status 2, changing nothing already there: a file
is downloaded into a staging folder and moved into place only once complete, and DEST's folders
are created only then, so a failed or cut download leaves no partial file and no empty folder.
URLs can be overridden (mirrors): SENTEMB_WIKI_URL, SENTEMB_SENTEVAL_URL (read when the download starts).
"""

from __future__ import annotations

import http.client
import os
import shutil
import sys
import tarfile
import tempfile
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

SIMCSE_DATA = "https://huggingface.co/datasets/princeton-nlp/datasets-for-simcse/resolve/main"
CHUNK = 1 << 20


class DownloadError(RuntimeError):
    pass


def wiki_url() -> str:
    """Read at call time, so a mirror set after import (or by a test) is used."""
    return os.environ.get("SENTEMB_WIKI_URL", f"{SIMCSE_DATA}/wiki1m_for_simcse.txt")


def senteval_url() -> str:
    return os.environ.get("SENTEMB_SENTEVAL_URL", f"{SIMCSE_DATA}/senteval.tar")


def existing_ancestor(path: Path) -> Path:
    """The nearest folder above `path` that exists: staging there creates no new folder on the way to `path`."""
    return next(parent for parent in Path(os.path.abspath(path)).parents if parent.is_dir())


@contextmanager
def staging_folder(target: Path) -> Iterator[Path]:
    """A hidden temporary folder beside the nearest existing folder above `target` (the same file system, so the
    final move is a rename), removed with whatever is left in it however the download ends."""
    folder = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".partial", dir=existing_ancestor(target)))
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def place(finished: Path, target: Path) -> None:
    """Move a complete file or folder to `target`, creating its missing parent folders only now (removed again if
    the move fails)."""
    created = [parent for parent in Path(os.path.abspath(target)).parents if not parent.exists()]
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        shutil.move(finished, target)
    except OSError:
        for folder in created:  # deepest first
            folder.rmdir()
        raise


def unreachable(url: str, err: BaseException) -> str:
    """Why `url` could not be downloaded, and what to do."""
    if isinstance(err, urllib.error.HTTPError):  # reached, but refused: not a network problem
        return (
            f"cannot download {url}: the server answered HTTP {err.code} ({err.reason}). Fix: check the URL "
            "(SENTEMB_WIKI_URL / SENTEMB_SENTEVAL_URL name a mirror), or try again later"
        )
    return (
        f"cannot download {url}: {getattr(err, 'reason', None) or err}.\n"
        "This machine cannot reach it (no internet?). Copy the data from a machine that can, or point "
        "SENTEMB_DATA at an existing data tree (e.g. ../shared/data: wiki/ and senteval/downstream/)."
    )


def download(url: str, path: Path, timeout: float = 30.0) -> Path:
    """`url` into `path` with a progress bar; a download shorter than its Content-Length is an error (urllib's
    chunked reads return what came before the connection closed without saying so)."""
    from tqdm import tqdm

    try:
        with urllib.request.urlopen(url, timeout=timeout) as response, path.open("wb") as out:
            size = int(response.headers.get("Content-Length") or 0) or None
            with tqdm(total=size, unit="B", unit_scale=True, unit_divisor=1024, desc=path.name) as bar:
                while chunk := response.read(CHUNK):
                    out.write(chunk)
                    bar.update(len(chunk))
            received = bar.n
    except (urllib.error.URLError, http.client.HTTPException, OSError) as err:  # TimeoutError is an OSError
        raise DownloadError(unreachable(url, err)) from err
    if size is not None and received != size:
        raise DownloadError(
            f"the download of {url} stopped after {received} of {size} bytes (the connection closed); nothing was "
            "kept. Fix: run `make data` again (or copy the data from a machine that can download it)"
        )
    return path


def unpack(archive: Path, into: Path) -> Path:
    """SentEval's archive into `into`; returns its downstream/ folder."""
    try:
        with tarfile.open(archive) as tar:
            tar.extractall(into, filter="data")
    except tarfile.TarError as err:
        raise DownloadError(f"{archive.name} from {senteval_url()} is not a readable tar archive: {err}") from err
    if not (into / "downstream").is_dir():
        raise DownloadError(f"{archive.name} from {senteval_url()} has no downstream/ folder (not SimCSE's archive?)")
    return into / "downstream"


def download_all(dest: Path) -> None:
    wiki = dest / "wiki" / "wiki1m_for_simcse.txt"
    if wiki.is_file():
        print(f"{wiki} is already there")
    else:
        print(f"downloading {wiki_url()} -> {wiki}")
        with staging_folder(wiki) as staging:
            place(download(wiki_url(), staging / wiki.name), wiki)
    downstream = dest / "senteval" / "downstream"
    if (downstream / "STS").is_dir():
        print(f"{downstream} is already there")
        return
    if downstream.exists():  # never merged into or replaced: it may be someone's own copy
        raise DownloadError(f"{downstream} exists but has no STS/ folder. Fix: move it away and run `make data` again")
    print(f"downloading {senteval_url()} -> {downstream}")
    with staging_folder(downstream) as staging:
        archive = download(senteval_url(), staging / "senteval.tar")
        print(f"unpacking {archive.name} -> {downstream}")
        place(unpack(archive, staging / "unpacked"), downstream)


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
