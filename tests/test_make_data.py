"""`make train` and `make test` fetch the data first, only where no data root holds it: the Makefile's own recipes,
run by make in a copy of the checkout (so the searched ./data and <checkout>/data are the copy's), against a local
http.server mirror or a closed port. `-o .venv/.installed` skips the install step, `PY=` names this interpreter."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sentemb.common.paths import PROJECT_ROOT
from tests.test_download import WIKI, closed_port, mirror, tree

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="no make on this machine")
FETCH = f"{sys.executable} -m sentemb.download --if-missing data"


@pytest.fixture
def checkout(tmp_path) -> Path:
    """The package and the Makefile, copied: `python -m sentemb.download` run there imports this copy."""
    copy = tmp_path / "checkout"
    shutil.copytree(PROJECT_ROOT / "sentemb", copy / "sentemb", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(PROJECT_ROOT / "Makefile", copy)
    return copy


def make(folder: Path, *args: str) -> subprocess.CompletedProcess:
    env = {key: value for key, value in os.environ.items() if key != "SENTEMB_DATA"}
    env["PYTHONDONTWRITEBYTECODE"] = "1"  # the copy's tree stays as it was
    command = ["make", "--no-print-directory", "-o", ".venv/.installed", f"PY={sys.executable}", *args]
    return subprocess.run(command, cwd=folder, env=env, capture_output=True, text=True, timeout=60)


def test_train_and_test_run_the_fetch_first(checkout):
    for target, runs in (("train", "-m sentemb.train"), ("test", "-m pytest")):
        lines = make(checkout, "-n", target).stdout.splitlines()
        assert lines[0] == FETCH and runs in lines[1], (target, lines)


def test_make_train_offline_fails_in_seconds_and_changes_nothing(checkout, monkeypatch):
    url = f"http://127.0.0.1:{closed_port()}/x"
    monkeypatch.setenv("SENTEMB_WIKI_URL", url)
    monkeypatch.setenv("SENTEMB_SENTEVAL_URL", url)
    before = tree(checkout)
    start = time.monotonic()
    result = make(checkout, "train")
    assert time.monotonic() - start < 10, "a refused connection fails at once; 10 s allows a loaded CPU"
    assert result.returncode != 0 and result.stdout.splitlines()[0] == FETCH
    assert "sentemb.train" not in result.stdout, "training never started"
    assert f"searched {checkout / 'data'})" in result.stderr and "Fix:" in result.stderr
    assert tree(checkout) == before, "no data/, no partial file, no empty folder"


def test_make_fetches_into_data_once_then_only_echoes_its_command(checkout, tmp_path):
    (tmp_path / "served").mkdir()
    with mirror(tmp_path / "served", WIKI) as requests:
        first = make(checkout, "data-if-missing")
        assert first.returncode == 0, first.stderr
        assert requests == ["/wiki1m_for_simcse.txt", "/senteval.tar"]
        assert (checkout / "data" / "wiki" / "wiki1m_head.txt").read_bytes() == WIKI  # shorter than the sample
        assert (checkout / "data" / "senteval" / "downstream" / "STS").is_dir()
        again = make(checkout, "data-if-missing")
    assert requests == ["/wiki1m_for_simcse.txt", "/senteval.tar"], "nothing fetched the second time"
    assert (again.returncode, again.stdout, again.stderr) == (0, FETCH + "\n", "")
