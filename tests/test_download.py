"""sentemb.download (`make data`, and `--if-missing` before `make train/test`): a failed, cut or finished download,
what is fetched when a data root exists, and the data root an empty ./data leaves; served by http.server locally."""

from __future__ import annotations

import functools
import hashlib
import http.server
import io
import shutil
import socket
import tarfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

import sentemb.common.paths
from sentemb.common.errors import SentembConfigError
from sentemb.common.paths import resolve_data_root
from sentemb.download import HEAD_BYTES, main
from tests.conftest import compose_train

WIKI = b"first sentence.\nsecond sentence.\n" * 50
# a corpus longer than the sample cut from it, so the cut shows
BIG_WIKI = b"".join(b"sentence %d of the corpus, one per line.\n" % i for i in range(40_000))


def tree(root: Path) -> dict[str, str]:
    """Every folder and file under `root` (relative path → sha256 of a file's bytes, "dir" for a folder)."""
    return {
        str(p.relative_to(root)): "dir" if p.is_dir() else hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
    }


def senteval_tar() -> bytes:
    """A stand-in for SimCSE's senteval.tar: downstream/STS/... as its members are laid out."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        data = b"s1\ts2\t4.0\n"
        member = tarfile.TarInfo("downstream/STS/STSBenchmark/sts-dev.csv")
        member.size = len(data)
        tar.addfile(member, io.BytesIO(data))
    return buffer.getvalue()


class Handler(http.server.BaseHTTPRequestHandler):
    """/wiki and /senteval.tar serve their bytes; /cut announces 1,000,000 bytes, sends 1,000 and closes."""

    files = {"/wiki": WIKI, "/senteval.tar": senteval_tar()}

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        body = self.files.get(self.path, b"x" * 1000)
        self.send_response(200 if self.path in self.files or self.path == "/cut" else 404)
        self.send_header("Content-Length", str(1_000_000 if self.path == "/cut" else len(body)))
        self.end_headers()
        self.wfile.write(body)
        self.close_connection = True

    def log_message(self, *args) -> None:  # quiet
        pass


@contextmanager
def serving(handler) -> Iterator[str]:
    """An http.server on a free port of 127.0.0.1, in a thread; yields its URL."""
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()


@contextmanager
def mirror(folder: Path, wiki: bytes) -> Iterator[list[str]]:
    """`python -m http.server`'s handler over `folder` holding `wiki` and a senteval.tar, the download URLs pointed
    at it; yields the paths it was asked for."""
    (folder / "wiki1m_for_simcse.txt").write_bytes(wiki)
    (folder / "senteval.tar").write_bytes(senteval_tar())
    requests: list[str] = []

    class Recording(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args) -> None:  # called once per request: record it, print nothing
            requests.append(self.path)

    with serving(functools.partial(Recording, directory=str(folder))) as url, pytest.MonkeyPatch.context() as env:
        env.setenv("SENTEMB_WIKI_URL", f"{url}/wiki1m_for_simcse.txt")
        env.setenv("SENTEMB_SENTEVAL_URL", f"{url}/senteval.tar")
        yield requests


@pytest.fixture
def server() -> Iterator[str]:
    with serving(Handler) as url:
        yield url


@pytest.fixture(autouse=True)
def searched_only_here(tmp_path, monkeypatch) -> None:
    """The data root is searched in tmp_path only: no $SENTEMB_DATA, the checkout's data/ is tmp_path/checkout/data."""
    monkeypatch.delenv("SENTEMB_DATA", raising=False)
    monkeypatch.setattr(sentemb.common.paths, "PROJECT_ROOT", tmp_path / "checkout")


@pytest.fixture
def work(tmp_path, monkeypatch) -> Path:
    """The folder make runs in (./data is searched and filled there)."""
    (tmp_path / "work").mkdir()
    monkeypatch.chdir(tmp_path / "work")
    return tmp_path / "work"


@pytest.fixture
def served(tmp_path) -> Iterator[list[str]]:
    (tmp_path / "served").mkdir()
    with mirror(tmp_path / "served", BIG_WIKI) as requests:
        yield requests


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]  # closed when the socket is: a connection there is refused


def test_an_unreachable_download_exits_2_and_creates_nothing(tmp_path, monkeypatch, capsys):
    url = f"http://127.0.0.1:{closed_port()}/x"
    monkeypatch.setenv("SENTEMB_WIKI_URL", url)  # after sentemb.download was imported: read at call time
    monkeypatch.setenv("SENTEMB_SENTEVAL_URL", url)
    (tmp_path / "other.txt").write_text("already here\n")
    before = tree(tmp_path)
    assert main([str(tmp_path / "data")]) == 2
    assert tree(tmp_path) == before, "no data/ and no data/wiki/ created, no staging file left"
    assert f"cannot download {url}" in capsys.readouterr().err


def test_a_download_cut_halfway_leaves_no_partial_file(tmp_path, monkeypatch, server, capsys):
    monkeypatch.setenv("SENTEMB_WIKI_URL", f"{server}/cut")
    (tmp_path / "data").mkdir()  # the staging folder is made in data/: it must go too
    before = tree(tmp_path)
    assert main([str(tmp_path / "data")]) == 2
    assert tree(tmp_path) == before
    assert "stopped after 1000 of 1000000 bytes" in capsys.readouterr().err


def test_a_missing_file_on_the_server_is_named_as_such(tmp_path, monkeypatch, server, capsys):
    monkeypatch.setenv("SENTEMB_WIKI_URL", f"{server}/no_such_file")
    assert main([str(tmp_path / "data")]) == 2
    assert not list(tmp_path.iterdir())
    assert "the server answered HTTP 404" in capsys.readouterr().err


def test_a_download_puts_each_file_in_place_and_keeps_the_wiki_if_senteval_fails(tmp_path, monkeypatch, server):
    monkeypatch.setenv("SENTEMB_WIKI_URL", f"{server}/wiki")
    monkeypatch.setenv("SENTEMB_SENTEVAL_URL", f"{server}/cut")
    dest = tmp_path / "data"
    assert main([str(dest)]) == 2
    assert tree(tmp_path) == {
        "data": "dir",
        "data/wiki": "dir",
        "data/wiki/wiki1m_for_simcse.txt": hashlib.sha256(WIKI).hexdigest(),
        "data/wiki/wiki1m_head.txt": hashlib.sha256(WIKI).hexdigest(),  # shorter than the sample: all of it
    }, "the finished wiki files stay; no senteval/ folder and no staging folder"

    monkeypatch.setenv("SENTEMB_SENTEVAL_URL", f"{server}/senteval.tar")
    assert main([str(dest)]) == 0
    assert (dest / "senteval" / "downstream" / "STS" / "STSBenchmark" / "sts-dev.csv").read_bytes() == b"s1\ts2\t4.0\n"
    assert sorted(p.name for p in dest.iterdir()) == ["senteval", "wiki"], "the archive and its staging are gone"
    assert resolve_data_root(dest) == dest.resolve()


def test_an_empty_data_folder_never_shadows_a_root_that_holds_data(tmp_path, monkeypatch):
    empty, elsewhere = tmp_path / "data", tmp_path / "elsewhere"
    (empty / "wiki").mkdir(parents=True)  # what an offline `make data` used to leave
    (elsewhere / "wiki").mkdir(parents=True)
    (elsewhere / "wiki" / "wiki1m_head.txt").write_bytes(WIKI)
    monkeypatch.setattr(sentemb.common.paths, "data_root_candidates", lambda: [empty, elsewhere])
    assert resolve_data_root() == elsewhere
    (empty / "senteval" / "downstream").mkdir(parents=True)  # SentEval alone is a data root too
    assert resolve_data_root() == empty


def test_no_candidate_with_data_names_what_a_root_needs(tmp_path, monkeypatch):
    (tmp_path / "data" / "wiki").mkdir(parents=True)
    monkeypatch.setattr(sentemb.common.paths, "data_root_candidates", lambda: [tmp_path / "data"])
    with pytest.raises(SentembConfigError, match=r"a file in wiki/ or a senteval/downstream/ folder.*Fix: "):
        resolve_data_root()


def test_sentemb_data_is_read_by_resolve_data_root_itself(tmp_path, monkeypatch):
    monkeypatch.setenv("SENTEMB_DATA", str(tmp_path / "missing"))
    with pytest.raises(SentembConfigError, match=r"^\$SENTEMB_DATA points to .*missing, which is not a directory"):
        resolve_data_root()
    monkeypatch.setenv("SENTEMB_DATA", str(tmp_path))
    assert resolve_data_root() == tmp_path.resolve()
    (tmp_path / "configured").mkdir()
    assert resolve_data_root(tmp_path / "configured") == (tmp_path / "configured").resolve(), "paths.data_dir wins"


def test_no_root_names_exactly_the_folders_searched(tmp_path, work):
    with pytest.raises(SentembConfigError) as err:
        resolve_data_root()
    searched = f"{work / 'data'}, {tmp_path / 'checkout' / 'data'} were searched"
    assert f"SENTEMB_DATA is not set and paths.data_dir is null, so {searched}" in str(err.value)


def test_if_missing_fetches_a_data_root_for_data_wiki_and_then_nothing_more(work, served, capsys):
    assert main(["--if-missing", "data"]) == 0
    data = work / "data"
    assert resolve_data_root() == data
    assert served == ["/wiki1m_for_simcse.txt", "/senteval.tar"]
    head = (data / "wiki" / "wiki1m_head.txt").read_bytes()
    assert len(head) == 1_280_000 and BIG_WIKI.startswith(head), "the sample is the corpus's first 1.28 MB"
    assert head.splitlines()[:11_914] == BIG_WIKI.splitlines()[:11_914]
    for option, expected in (("data=wiki", head), ("data=wiki_full", BIG_WIKI)):
        cfg = compose_train([option])
        cfg.paths.data_dir = str(resolve_data_root())  # as the run's checks fill it in
        assert Path(cfg.data.corpus).read_bytes() == expected, option
    assert (data / "senteval" / "downstream" / "STS" / "STSBenchmark" / "sts-dev.csv").is_file()
    assert sorted(p.name for p in work.rglob("*") if p.name.startswith(".")) == [], "no staging folder left"

    before, served[:] = tree(work), []
    capsys.readouterr()
    assert main(["--if-missing", "data"]) == 0
    assert served == [] and capsys.readouterr() == ("", ""), "data found: nothing fetched, nothing printed"
    assert tree(work) == before


def test_if_missing_completes_a_partial_data_folder_with_what_it_lacks_only(work, served):
    (work / "data" / "wiki").mkdir(parents=True)
    (work / "data" / "wiki" / "wiki1m_head.txt").write_bytes(WIKI)  # the sample alone serves data=wiki
    assert main(["--if-missing", "data"]) == 0
    assert served == ["/senteval.tar"], "the sample is there: the 1M-line corpus is not fetched for it"
    assert sorted(p.name for p in (work / "data" / "wiki").iterdir()) == ["wiki1m_head.txt"]

    (work / "data" / "wiki" / "wiki1m_head.txt").unlink()  # a `make data` tree from before the sample was written
    (work / "data" / "wiki" / "wiki1m_for_simcse.txt").write_bytes(BIG_WIKI)
    served[:] = []
    assert main(["--if-missing", "data"]) == 0
    assert served == [] and len((work / "data" / "wiki" / "wiki1m_head.txt").read_bytes()) == HEAD_BYTES


def test_if_missing_fetches_nothing_when_another_root_holds_data(tmp_path, work, served, capsys):
    checkout_data = tmp_path / "checkout" / "data" / "senteval" / "downstream"
    checkout_data.mkdir(parents=True)
    assert main(["--if-missing", "data"]) == 0
    assert served == [] and not (work / "data").exists() and capsys.readouterr() == ("", "")
    shutil.rmtree(tmp_path / "checkout")

    (tmp_path / "mine" / "wiki").mkdir(parents=True)
    (tmp_path / "mine" / "wiki" / "wiki1m_head.txt").write_bytes(WIKI)
    with pytest.MonkeyPatch.context() as env:
        env.setenv("SENTEMB_DATA", str(tmp_path / "mine"))
        assert main(["--if-missing", "data"]) == 0
        env.setenv("SENTEMB_DATA", str(tmp_path / "no_such_folder"))  # refused, not replaced by a download
        assert main(["--if-missing", "data"]) == 2
    assert served == [] and not (work / "data").exists()
    assert "$SENTEMB_DATA points to" in capsys.readouterr().err


def test_if_missing_cut_halfway_leaves_nothing(work, server, monkeypatch, capsys):
    monkeypatch.setenv("SENTEMB_WIKI_URL", f"{server}/cut")
    assert main(["--if-missing", "data"]) == 2
    assert list(work.iterdir()) == [], "no data/, no staging folder"
    err = capsys.readouterr().err
    assert "no data root found" in err and "stopped after 1000 of 1000000 bytes" in err


def test_if_missing_offline_fails_in_seconds_naming_what_was_searched_and_the_fix(tmp_path, work, monkeypatch, capsys):
    url = f"http://127.0.0.1:{closed_port()}/x"
    monkeypatch.setenv("SENTEMB_WIKI_URL", url)
    monkeypatch.setenv("SENTEMB_SENTEVAL_URL", url)
    start = time.monotonic()
    assert main(["--if-missing", "data"]) == 2
    assert time.monotonic() - start < 2, "a refused connection is an immediate failure, not a retry loop"
    assert list(work.iterdir()) == [] and not (tmp_path / "checkout").exists()
    err = capsys.readouterr().err
    assert f"searched {work / 'data'}, {tmp_path / 'checkout' / 'data'})" in err
    assert f"cannot download {url}" in err and "Fix:" in err and "SENTEMB_DATA" in err
