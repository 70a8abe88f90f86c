"""`python -m sentemb.download [--if-missing] [DEST]`: the public data into ./data (`make data`, `make train/test`).

Fetches SimCSE's wiki1m_for_simcse.txt (1M Wikipedia sentences) into DEST/wiki/, writes its first HEAD_BYTES
beside it as wiki1m_head.txt (the sample `data=wiki` trains on), and unpacks SimCSE's senteval.tar (SentEval's
data/downstream) into DEST/senteval/. `--if-missing` (what `make train` and `make test` run first) does nothing when
a data root already holds the data (docs/data.md's search order), and otherwise fetches only what DEST lacks.
Where the internet cannot be reached it says so within seconds and exits with status 2, changing nothing already
there: a file is downloaded into a staging folder and moved into place only once complete, and DEST's folders are
created only then, so a failed or cut download leaves no partial file and no empty folder.
URLs can be overridden (mirrors): SENTEMB_WIKI_URL, SENTEMB_SENTEVAL_URL (read when the download starts).
"""

from __future__ import annotations

import argparse
import http.client
import os
import shutil
import ssl
import sys
import tarfile
import tempfile
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from sentemb.common.errors import SentembConfigError
from sentemb.common.paths import configured_root, data_root_candidates, found_data_root, resolve_data_root

SIMCSE_DATA = "https://huggingface.co/datasets/princeton-nlp/datasets-for-simcse/resolve/main"
CHUNK = 1 << 20
# the default training sample: wiki1m's first 1.28 MB (11,914 whole lines and the start of the next), byte for byte
# the same file wherever it is made, so `make train` trains on the same sentences everywhere
HEAD_BYTES = 1_280_000
CONNECT_TIMEOUT = 5.0  # seconds: an offline machine fails fast
READ_TIMEOUT = 60.0  # seconds a connected server may pause between chunks


class DownloadError(RuntimeError):
    pass


def wiki_url() -> str:
    """Read at call time, so a mirror set after import (or by a test) is used."""
    return os.environ.get("SENTEMB_WIKI_URL", f"{SIMCSE_DATA}/wiki1m_for_simcse.txt")


def senteval_url() -> str:
    return os.environ.get("SENTEMB_SENTEVAL_URL", f"{SIMCSE_DATA}/senteval.tar")


class _Connection(http.client.HTTPConnection):
    def connect(self) -> None:
        super().connect()  # within urlopen's timeout (CONNECT_TIMEOUT)
        self.sock.settimeout(READ_TIMEOUT)  # then the patience a large file needs


class _TLSConnection(http.client.HTTPSConnection):
    def connect(self) -> None:
        super().connect()
        self.sock.settimeout(READ_TIMEOUT)


class _HTTPHandler(urllib.request.HTTPHandler):
    def http_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
        return self.do_open(_Connection, req)


class _HTTPSHandler(urllib.request.HTTPSHandler):
    def https_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
        return self.do_open(_TLSConnection, req, context=ssl.create_default_context())


# urllib has one timeout for connecting and reading; these handlers split it (proxies from the environment still apply)
OPENER = urllib.request.build_opener(_HTTPHandler, _HTTPSHandler)


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
        "This machine cannot reach it (no internet?). Fix: run again where the internet can be reached, or point "
        "SENTEMB_DATA at a data tree holding wiki/ and senteval/downstream/ (docs/data.md), e.g. one copied from a "
        "machine that ran `make data`."
    )


def download(url: str, path: Path) -> Path:
    """`url` into `path` with a progress bar; a download shorter than its Content-Length is an error (urllib's
    chunked reads return what came before the connection closed without saying so)."""
    from tqdm import tqdm

    try:
        with OPENER.open(url, timeout=CONNECT_TIMEOUT) as response, path.open("wb") as out:
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
            "kept. Fix: run the same command again (or copy the data from a machine that can download it)"
        )
    return path


def write_head(full: Path, head: Path) -> None:
    """`head` as the first HEAD_BYTES of `full`, written beside it and renamed into place."""
    with staging_folder(head) as staging, full.open("rb") as source:
        (staging / head.name).write_bytes(source.read(HEAD_BYTES))
        place(staging / head.name, head)


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


def download_all(dest: Path, full_wiki: bool = True) -> None:
    """Whatever of the data `dest` lacks; silent when it lacks nothing. `full_wiki=False` (--if-missing) leaves a
    present wiki1m_head.txt without its full file, as `data=wiki` needs only the sample."""
    wiki = dest / "wiki" / "wiki1m_for_simcse.txt"
    head = wiki.with_name("wiki1m_head.txt")
    if not wiki.is_file() and (full_wiki or not head.is_file()):
        print(f"downloading {wiki_url()} -> {wiki}")
        with staging_folder(wiki) as staging:
            place(download(wiki_url(), staging / wiki.name), wiki)
    if wiki.is_file() and not head.is_file():
        print(f"writing {head} (its first {HEAD_BYTES:,} bytes: the sample data=wiki trains on)")
        write_head(wiki, head)
    downstream = dest / "senteval" / "downstream"
    if (downstream / "STS").is_dir():
        return
    if downstream.exists():  # never merged into or replaced: it may be someone's own copy
        raise DownloadError(f"{downstream} exists but has no STS/ folder. Fix: move it away and run `make data` again")
    print(f"downloading {senteval_url()} -> {downstream}")
    with staging_folder(downstream) as staging:
        archive = download(senteval_url(), staging / "senteval.tar")
        print(f"unpacking {archive.name} -> {downstream}")
        place(unpack(archive, staging / "unpacked"), downstream)


def fetch_if_missing(dest: Path) -> None:
    """Nothing when $SENTEMB_DATA or a searched root (other than `dest`) holds data; else `dest` is completed."""
    if configured_root():
        resolve_data_root()  # a wrong $SENTEMB_DATA is reported now, not after a download into ./data
        return
    root = found_data_root()
    if root is not None and root != dest.resolve():
        return
    try:
        download_all(dest, full_wiki=False)
    except DownloadError as err:
        if root is not None:  # dest held part of the data: the download error says what failed
            raise
        tried = ", ".join(str(p) for p in data_root_candidates())
        raise DownloadError(
            f"no data root found (SENTEMB_DATA is not set; searched {tried}), and downloading one into "
            f"{dest.resolve()} failed: {err}"
        ) from err


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sentemb.download", description=__doc__.split("\n\n")[0])
    parser.add_argument("dest", nargs="?", default="data", help="the data root to fill (default: ./data)")
    parser.add_argument(
        "--if-missing", action="store_true", help="fetch only when no data root holds the data (make train/test)"
    )
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    dest = Path(args.dest)
    try:
        if args.if_missing:
            fetch_if_missing(dest)
            return 0
        download_all(dest)
    except (DownloadError, SentembConfigError) as err:
        print(f"sentemb.download: {err}", file=sys.stderr)
        return 2
    print(
        f"data ready under {dest.resolve()} (sentemb finds ./data by itself; or export SENTEMB_DATA={dest.resolve()})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
