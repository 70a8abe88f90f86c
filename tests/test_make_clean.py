"""`make clean` names what it removes before removing it, and says so when there is nothing."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from sentemb.common.paths import PROJECT_ROOT


def make_clean(folder) -> str:
    result = subprocess.run(
        ["make", "--no-print-directory", "-f", str(PROJECT_ROOT / "Makefile"), "-C", str(folder), "clean"],
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    return result.stdout


@pytest.mark.skipif(shutil.which("make") is None, reason="no make on this machine")
def test_make_clean_lists_the_folders_it_removes_and_nothing_else(tmp_path):
    for folder in ("outputs/train/runs/x", "wandb", "data/wiki"):
        (tmp_path / folder).mkdir(parents=True)
    (tmp_path / "outputs" / "train" / "runs" / "x" / "metrics.json").write_text("{}")
    assert make_clean(tmp_path) == "make clean: removing outputs wandb\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data"] and (tmp_path / "data" / "wiki").is_dir()
    assert make_clean(tmp_path).startswith("make clean: nothing to remove")
