"""Every file a sentemb command writes is published whole, and never written through a link it did not make
(sentemb.common.published_files).

A link planted at a destination (to a file of the user's, or dangling) must leave its target as it was: the writer
replaces the link with its file, or refuses. Each writer is run on such a link; a scan of the package fails on a
file write that bypasses the helper. The helper itself is tested with and without O_TMPFILE (the named fallback,
as on NFS): a failed write leaves no temporary file, a killed one's is removed by the next write of that name.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from omegaconf import OmegaConf

from sentemb.common import published_files
from sentemb.common.errors import SentembConfigError
from sentemb.common.paths import PROJECT_ROOT
from sentemb.common.published_files import (
    HOST,
    exit_on_sigterm,
    open_for_append,
    publish_folder,
    publish_text,
    published,
    remove_stale_partials,
    staging_folder,
)

VICTIM = "a file of the user's\n"


@pytest.fixture(params=["O_TMPFILE", "named"])
def mode(request, monkeypatch) -> str:
    """Both ways the helper makes its temporary file: unnamed (ext4, tmpfs, ...), and named (NFS, no O_TMPFILE)."""
    if request.param == "named":
        monkeypatch.setattr(published_files.os, "O_TMPFILE", 0, raising=False)
    return request.param


def victim(tmp_path: Path) -> Path:
    path = tmp_path / "victim.txt"
    path.write_text(VICTIM)
    return path


def plant_link(at: Path, target: Path | str) -> Path:
    at.parent.mkdir(parents=True, exist_ok=True)
    at.symlink_to(target)
    return at


def hidden(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.startswith("."))


def test_a_link_at_the_destination_is_replaced_never_written_through(mode, tmp_path):
    target = victim(tmp_path)
    out = plant_link(tmp_path / "out" / "metrics.json", target)
    publish_text(out, "new\n")
    assert target.read_text() == VICTIM
    assert not out.is_symlink() and out.read_text() == "new\n"
    assert hidden(out.parent) == [], "no temporary file left"


def test_without_replace_an_entry_at_the_destination_is_refused(mode, tmp_path):
    dangling = plant_link(tmp_path / "out.jsonl", tmp_path / "nowhere" / "made.txt")
    with pytest.raises(FileExistsError):
        publish_text(dangling, "new\n", replace=False)
    assert dangling.is_symlink() and not (tmp_path / "nowhere").exists(), "nothing made where the link points"
    publish_text(tmp_path / "fresh.jsonl", "new\n", replace=False)
    assert (tmp_path / "fresh.jsonl").read_text() == "new\n" and hidden(tmp_path) == []


def test_a_write_that_fails_publishes_nothing_and_leaves_no_temporary_file(mode, tmp_path):
    out = tmp_path / "sweep.csv"
    out.write_text("the previous table\n")
    with pytest.raises(KeyboardInterrupt), published(out, "w") as handle:
        handle.write("half a table")
        raise KeyboardInterrupt
    assert out.read_text() == "the previous table\n" and hidden(tmp_path) == []


def test_a_published_file_has_the_mode_a_new_file_gets(mode, tmp_path):
    umask = os.umask(0o022)
    try:
        publish_text(tmp_path / "results.md", "x")
    finally:
        os.umask(umask)
    assert (tmp_path / "results.md").stat().st_mode & 0o777 == 0o644


def test_a_killed_processs_temporary_files_go_with_the_next_write_of_that_name(tmp_path):
    dead = int(subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True).stdout)
    stale = tmp_path / f".out.jsonl.{HOST}-{dead}-0123abcd.partial"
    stale.write_text("half")
    staged = tmp_path / f".out.jsonl.{HOST}-{dead}-4567abcd.staging"  # a staging folder of a killed comparison
    (staged / "inner").mkdir(parents=True)
    live = tmp_path / f".out.jsonl.{HOST}-{os.getpid()}-89abcdef.partial"  # this process's: in use
    elsewhere = tmp_path / f".out.jsonl.0000beef-{dead}-0123abcd.partial"  # another host's: its PID means nothing here
    other = tmp_path / f".other.{HOST}-{dead}-0123abcd.partial"  # another file's
    for path in (live, elsewhere, other):
        path.write_text("kept")
    publish_text(tmp_path / "out.jsonl", "whole\n")
    assert hidden(tmp_path) == sorted(p.name for p in (live, elsewhere, other))
    assert remove_stale_partials(tmp_path, "other") == [other]


def test_a_staging_folder_is_published_whole_or_removed(tmp_path):
    target = tmp_path / "cmp"
    with staging_folder(target) as staging:
        publish_text(staging / "compare.json", "{}\n")
        publish_text(staging / "compare.md", "# Comparison\n")
        publish_folder(staging, target)
    assert sorted(p.name for p in target.iterdir()) == ["compare.json", "compare.md"] and hidden(tmp_path) == []
    with pytest.raises(FileExistsError), staging_folder(target) as staging:  # no-replace: an existing one stays
        publish_text(staging / "compare.json", "{}\n")
        publish_folder(staging, target)
    with pytest.raises(RuntimeError), staging_folder(tmp_path / "other") as staging:
        publish_text(staging / "compare.json", "{}\n")
        raise RuntimeError("stopped")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cmp"]


def test_a_log_is_never_appended_through_a_link_or_into_a_fifo(tmp_path):
    target = victim(tmp_path)
    with pytest.raises(OSError):
        open_for_append(plant_link(tmp_path / "train.log", target))
    os.mkfifo(tmp_path / "fifo.log")
    with pytest.raises(OSError):  # at once: a FIFO would otherwise wait for a reader
        open_for_append(tmp_path / "fifo.log")
    assert target.read_text() == VICTIM
    with open_for_append(tmp_path / "job.log") as handle:
        handle.write("line\n")
    assert (tmp_path / "job.log").read_text() == "line\n"


def test_sigterm_is_raised_as_an_exit_while_a_write_runs(tmp_path, monkeypatch):
    monkeypatch.setattr(published_files.os, "O_TMPFILE", 0, raising=False)  # a named temporary file: it must go
    with pytest.raises(SystemExit) as stop, exit_on_sigterm(), published(tmp_path / "out.jsonl", "w") as handle:
        handle.write("half")
        os.kill(os.getpid(), 15)
    assert stop.value.code == 143 and hidden(tmp_path) == [] and not (tmp_path / "out.jsonl").exists()


# ---- every writer, on a link planted at its file ----


def record_writer(folder: Path) -> Path:
    from sentemb.runs.record import write_record

    return write_record(folder, {"status": "ok", "message": "", "metrics": {}, "overrides": []})


def similarities_writer(folder: Path) -> Path:
    from sentemb.eval.similarities import write_similarities
    from sentemb.eval.sts import SentencePairs

    pairs = SentencePairs(["a", "b"], ["c", "d"], np.array([1.0, 2.0]))
    data = {"STSBenchmark": {"test": pairs}}
    return write_similarities(folder / "similarities.npz", data, {"STSBenchmark": {"test": np.array([0.1, 0.2])}})


def hydra_files_writer(folder: Path) -> Path:
    from sentemb.runs.job_files import save_hydra_files

    hydra_cfg = OmegaConf.create({"output_subdir": None, "overrides": {"task": ["model=tiny"]}})
    save_hydra_files(OmegaConf.create({"model": "tiny"}), hydra_cfg, folder)
    return folder / ".hydra" / "overrides.yaml"


def figure_writer(folder: Path) -> Path:
    from sentemb.eval.figures import similarity_density_figure

    path = folder / "stsb_test_similarity_density.png"
    similarity_density_figure(np.linspace(0, 1, 20), np.linspace(0, 5, 20), path, "test")
    return path


def checkpoint_writer(folder: Path) -> Path:
    from sentemb.training.checkpoints import write_atomically

    write_atomically({"step": 2}, folder / "checkpoints" / "last.ckpt")
    return folder / "checkpoints" / "last.ckpt"


def negations_writer(folder: Path) -> Path:
    from sentemb.negate import write_atomically

    write_atomically(folder / "negations.jsonl", iter(['["a", "not a"]\n']), overwrite=True)
    return folder / "negations.jsonl"


def sweep_report_writer(folder: Path) -> Path:
    from sentemb.runs.record import write_record
    from sentemb.runs.sweeps import write_report

    for job, tau in enumerate((0.05, 0.1)):
        write_record(folder / str(job), {"status": "ok", "message": "", "overrides": [f"loss.tau={tau}"],
                                         "swept": {"loss.tau": tau}, "seed": 42,
                                         "metrics": {"stsb/dev/spearman_best_logged": 70.0 + job}})  # fmt: skip
    write_report(folder)
    return folder / "sweep.md"


def token_frequency_writer(folder: Path) -> Path:
    from sentemb.encoders.heads.sarcse import corpus_token_frequency

    class Tokenizer:  # the three things the count reads
        name_or_path = "test"

        def __len__(self) -> int:
            return 5

        def __call__(self, lines, add_special_tokens=False):
            return {"input_ids": [[1, 2] for _ in lines]}

    corpus = folder / "corpus.txt"
    corpus.write_text("one\ntwo\n")
    cache = folder / "cache"
    corpus_token_frequency(corpus, Tokenizer(), str(cache))  # once, to learn the cache file's name
    [path] = (cache / "token_frequency").iterdir()
    path.unlink()
    return path, lambda: corpus_token_frequency(corpus, Tokenizer(), str(cache))


# analysis.py's figures and arrays go through the same helper (the scan below checks it), at ~10 s a run
WRITERS: dict[str, Callable[[Path], Path]] = {
    "metrics.json (runs/record.py)": record_writer,
    "similarities.npz (eval/similarities.py)": similarities_writer,
    ".hydra/overrides.yaml (runs/job_files.py)": hydra_files_writer,
    "a figure (eval/figures.py)": figure_writer,
    "last.ckpt (training/checkpoints.py)": checkpoint_writer,
    "negations (negate.py)": negations_writer,
    "sweep.md (runs/sweeps.py)": sweep_report_writer,
}


@pytest.mark.parametrize("writer", WRITERS)
@pytest.mark.parametrize("link", ["to a file", "dangling"])
def test_every_writer_replaces_a_link_at_its_file(writer, link, tmp_path):
    write = WRITERS[writer]
    folder = tmp_path / "run"
    folder.mkdir()
    path = write(folder)  # once, to learn where its file goes
    path.unlink()
    target = victim(tmp_path) if link == "to a file" else tmp_path / "elsewhere" / "made-through-the-link"
    plant_link(path, target)
    write(folder)
    assert not path.is_symlink() and path.is_file()
    if link == "to a file":
        assert target.read_text() == VICTIM, "the link's target was written through"
    else:
        assert not target.parent.exists(), "a file was made where the dangling link points"


def test_a_cache_file_is_never_written_through_a_dangling_link(tmp_path):
    folder = tmp_path / "run"
    folder.mkdir()
    path, write = token_frequency_writer(folder)
    plant_link(path, tmp_path / "elsewhere" / "made-through-the-link")
    write()
    assert not path.is_symlink() and path.is_file() and not (tmp_path / "elsewhere").exists()


def test_a_link_at_the_wandb_id_or_the_job_log_is_refused(tmp_path):
    from sentemb.runs.job_files import job_log
    from sentemb.runs.wandb_runs import wandb_run_id

    target = victim(tmp_path)
    dangling = plant_link(tmp_path / "checkpoints" / "wandb_run_id", tmp_path / "elsewhere" / "id")
    with pytest.raises(SentembConfigError, match=r"wandb_run_id: '<a link>' is not a W&B run id.*Fix: delete"):
        wandb_run_id(dangling.parent)
    assert not (tmp_path / "elsewhere").exists()
    plant_link(tmp_path / "train.log", target)
    hydra_cfg = OmegaConf.create({"job": {"name": "train"}})
    with pytest.raises(SentembConfigError, match=r"train\.log: the job's log cannot be opened.*Fix: remove it"):
        with job_log(tmp_path, hydra_cfg):
            pass
    assert target.read_text() == VICTIM


# ---- no writer bypasses the helper ----

# where a file is written without the helper, and why that is safe: into a folder the command made itself
OWN_FOLDER_WRITES = {
    ("sentemb/download.py", "download"): "its own staging folder (mkdtemp), moved into place whole",
    ("sentemb/download.py", "write_head"): "its own staging folder (mkdtemp), moved into place whole",
    ("sentemb/export.py", "with_unused_pooler"): "its own TemporaryDirectory",
    ("sentemb/encoders/serving/onnx_graph.py", "write_onnx_folder"): "the export's staging folder",
}
WRITE_CALLS = {
    "write_text", "write_bytes", "savefig", "np.save", "np.savez", "np.savez_compressed", "torch.save", "save_file",
    "FileHandler",
}  # fmt: skip
HANDLES = {"handle", "buffer"}  # a file object the helper opened (or bytes in memory): the call names no file


def call_name(call: ast.Call) -> str:
    """`write_text`, `torch.save`, `open`, ...: the call's name as WRITE_CALLS lists it."""
    func = call.func
    if isinstance(func, ast.Attribute):
        owner = func.value.id if isinstance(func.value, ast.Name) else ""
        return f"{owner}.{func.attr}" if owner in ("torch", "np") else func.attr
    return getattr(func, "id", "")


def writes_by_name(call: ast.Call, name: str) -> bool:
    """Whether the call writes a file it names (not a handle the helper opened)."""
    if name == "open":
        at = 0 if isinstance(call.func, ast.Attribute) else 1  # path.open(mode), open(path, mode)
        modes = [*call.args[at : at + 1], *(k.value for k in call.keywords if k.arg == "mode")]
        return any(
            isinstance(m, ast.Constant) and isinstance(m.value, str) and set(m.value) & set("wax+") for m in modes
        )
    if name not in WRITE_CALLS:
        return False
    target = call.args[1] if name == "torch.save" and len(call.args) > 1 else (call.args[0] if call.args else None)
    return not (isinstance(target, ast.Name) and target.id in HANDLES)


def file_writes(path: Path) -> list[tuple[str, int, str]]:
    """(function, line, call) of every call in `path` that writes a file by name."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found = []
    for function in [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)]:
        for call in [n for n in ast.walk(function) if isinstance(n, ast.Call)]:
            name = call_name(call)
            if writes_by_name(call, name):
                found.append((function.name, call.lineno, "open(write)" if name == "open" else name))
    return found


def test_no_file_is_written_past_the_published_files_helper():
    package = PROJECT_ROOT / "sentemb"
    bypasses = []
    for path in sorted(package.rglob("*.py")):
        where = str(path.relative_to(PROJECT_ROOT))
        if where == "sentemb/common/published_files.py":
            continue
        for function, line, call in file_writes(path):
            if (where, function) not in OWN_FOLDER_WRITES:
                bypasses.append(f"{where}:{line} ({function}): {call}")
    assert not bypasses, "files written past sentemb.common.published_files:\n" + "\n".join(bypasses)


def test_the_scan_finds_a_write_past_the_helper(tmp_path):
    planted = tmp_path / "writer.py"
    planted.write_text(
        "def f(path, fig, handle):\n    path.write_text('x')\n    fig.savefig(path)\n    open(path, 'w')\n"
        "    path.open('a')\n    torch.save(1, path)\n    open(path)\n    path.open('rb')\n    fig.savefig(handle)\n"
    )
    found = [call for _, _, call in file_writes(planted)]
    assert found == ["write_text", "savefig", "open(write)", "open(write)", "torch.save"]
