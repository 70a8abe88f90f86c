"""`make clean` names what it would remove and removes it only when confirmed (`FORCE=1`); it says so when there is
nothing to remove."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from sentemb.common.paths import PROJECT_ROOT


def make_clean(folder, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["make", "--no-print-directory", "-f", str(PROJECT_ROOT / "Makefile"), "-C", str(folder), "clean", *args],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip


@pytest.mark.skipif(shutil.which("make") is None, reason="no make on this machine")
def test_make_clean_refuses_without_force_then_removes_the_folders_it_names_and_nothing_else(tmp_path):
    for folder in ("outputs/train/runs/x", "wandb", "data/wiki"):
        (tmp_path / folder).mkdir(parents=True)
    (tmp_path / "outputs" / "train" / "runs" / "x" / "metrics.json").write_text("{}")

    refused = make_clean(tmp_path)
    assert refused.returncode != 0 and refused.stdout == ""
    assert refused.stderr.startswith("make clean: would remove outputs wandb (")
    assert "nothing removed. To remove them: make clean FORCE=1" in refused.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data", "outputs", "wandb"], "nothing removed"

    forced = make_clean(tmp_path, "FORCE=1")
    assert forced.returncode == 0 and forced.stdout == "make clean: removing outputs wandb\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data"] and (tmp_path / "data" / "wiki").is_dir()
    for args in ((), ("FORCE=1",)):
        nothing = make_clean(tmp_path, *args)
        assert nothing.returncode == 0 and nothing.stdout.startswith("make clean: nothing to remove")
