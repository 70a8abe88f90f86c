"""`make data` (sentemb.download): a failed, cut or finished download, and the data root an empty ./data leaves."""

from __future__ import annotations

import hashlib
import http.server
import io
import socket
import tarfile
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

import sentemb.common.paths
from sentemb.common.errors import SentembConfigError
from sentemb.common.paths import resolve_data_root
from sentemb.download import main

WIKI = b"first sentence.\nsecond sentence.\n" * 50


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


@pytest.fixture
def server() -> Iterator[str]:
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


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
    }, "the finished wiki file stays; no senteval/ folder and no staging folder"

    monkeypatch.setenv("SENTEMB_SENTEVAL_URL", f"{server}/senteval.tar")
    assert main([str(dest)]) == 0
    assert (dest / "senteval" / "downstream" / "STS" / "STSBenchmark" / "sts-dev.csv").read_bytes() == b"s1\ts2\t4.0\n"
    assert sorted(p.name for p in dest.iterdir()) == ["senteval", "wiki"], "the archive and its staging are gone"
    assert resolve_data_root(dest) == dest.resolve()


def test_an_empty_data_folder_never_shadows_a_root_that_holds_data(tmp_path, monkeypatch):
    empty, shared = tmp_path / "data", tmp_path / "shared"
    (empty / "wiki").mkdir(parents=True)  # what an offline `make data` used to leave
    (shared / "wiki").mkdir(parents=True)
    (shared / "wiki" / "wiki1m_head.txt").write_bytes(WIKI)
    monkeypatch.setattr(sentemb.common.paths, "data_root_candidates", lambda: [empty, shared])
    assert resolve_data_root() == shared
    (empty / "senteval" / "downstream").mkdir(parents=True)  # SentEval alone is a data root too
    assert resolve_data_root() == empty


def test_no_candidate_with_data_names_what_a_root_needs(tmp_path, monkeypatch):
    (tmp_path / "data" / "wiki").mkdir(parents=True)
    monkeypatch.setattr(sentemb.common.paths, "data_root_candidates", lambda: [tmp_path / "data"])
    with pytest.raises(SentembConfigError, match=r"a file in wiki/ or a senteval/downstream/ folder.*Fix: "):
        resolve_data_root()
