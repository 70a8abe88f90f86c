"""A folder has one writer, and a stopped job never looks finished.

A run directory's lock (sentemb.common.folder_lock, taken in sentemb.runs.lifecycle before the
restart decision) refuses a second training command in seconds, naming the live one, and changes
no byte; a lock its holder's death released is taken over. An export's out= is locked the same
way. A preemption signal at any point of a job exits with 128 + its number and `preempted` in
metrics.json (sentemb.runs.job_outcome), not only at a training step's end.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from lightning.pytorch.utilities.exceptions import SIGTERMException

import sentemb.train
from sentemb.common.errors import SentembConfigError
from sentemb.common.folder_lock import LOCK_NAME
from sentemb.common.hydra_plumbing import compose_config
from sentemb.common.paths import CONF_DIR
from sentemb.export import export
from sentemb.runs.record import read_record, write_record
from tests.conftest import tree

FINISHED = ["model=tiny", "logger=csv", "trainer.max_steps=2"]
SECONDS = 15  # "refused in seconds": the refusal comes before any model loads, on a slow shared CPU too

# a process that holds a folder's lock (as a live training or export does) until it is killed
HOLDER = """
import sys, time
from pathlib import Path
from sentemb.common.folder_lock import take_folder_lock
take_folder_lock(Path(sys.argv[1]), "test", "wait").claim("a test holding the lock")
print("locked", flush=True)
time.sleep(300)
"""


@pytest.fixture
def hold_lock():
    """`hold(folder)`: a live process holding `folder`'s lock (and named in its lock file); killed after the test."""
    started: list[subprocess.Popen] = []

    def hold(folder: Path) -> subprocess.Popen:
        process = subprocess.Popen([sys.executable, "-c", HOLDER, str(folder)], stdout=subprocess.PIPE, text=True)
        started.append(process)
        assert process.stdout.readline() == "locked\n"
        return process

    yield hold
    for process in started:
        process.kill()
        process.wait()
        process.stdout.close()


@pytest.fixture
def sigterm_handler():
    """A handler already installed for SIGTERM, as submitit's is: calls to it are listed (it must be called only by
    the job's requeue, after the job's own handlers are gone), and it keeps this test process alive if not."""
    calls: list[int] = []
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: calls.append(signum))
    handler = signal.getsignal(signal.SIGTERM)
    yield handler, calls
    signal.signal(signal.SIGTERM, previous)


def not_reached(cfg, before_build=None):
    pytest.fail("the job trained although its folder was refused")


def dead_pid() -> int:
    return int(subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True).stdout)


def holder(folder: Path) -> dict:
    return json.loads((folder / LOCK_NAME).read_text())


def test_a_training_command_on_a_folder_in_use_is_refused_in_seconds_naming_it(cli, tmp_path, hold_lock, monkeypatch):
    run = tmp_path / "run"
    write_record(run, {"status": "running", "message": "", "metrics": {}, "overrides": FINISHED})  # a live run's
    live = hold_lock(run)
    before = tree(run)
    monkeypatch.setattr(sentemb.train, "train", not_reached)
    started = time.monotonic()
    expected = rf"hydra\.run\.dir={re.escape(str(run))} is in use by PID {live.pid} on .*Fix: wait for it to finish"
    with pytest.raises(SystemExit, match=expected):
        cli([*FINISHED, f"hydra.run.dir={run}"])  # the same command: without the lock, it would resume the live run
    assert time.monotonic() - started < SECONDS
    assert tree(run) == before, "the live run's record and lock file untouched, nothing added"


def test_resuming_another_live_runs_checkpoint_into_a_new_folder_is_refused(cli, tmp_path, hold_lock, monkeypatch):
    # ckpt_path=<run A's checkpoint>: the new run's checkpoints go on in A's checkpoints/, so A's folder is locked too
    run_a, run_b = tmp_path / "a", tmp_path / "b"
    (run_a / "checkpoints").mkdir(parents=True)
    (run_a / "checkpoints" / "last.ckpt").write_bytes(b"A's")
    live = hold_lock(run_a)
    before = tree(run_a)
    monkeypatch.setattr(sentemb.train, "train", not_reached)
    ckpt = run_a / "checkpoints" / "last.ckpt"
    with pytest.raises(SystemExit, match=rf"ckpt_path={re.escape(str(ckpt))} .* is in use by PID {live.pid}"):
        cli([*FINISHED, f"ckpt_path={ckpt}", f"hydra.run.dir={run_b}"])
    assert tree(run_a) == before and not (run_b / LOCK_NAME).exists()


def test_a_lock_file_its_dead_holder_left_is_taken_over(cli, tmp_path, fake_training):
    run = tmp_path / "run"
    write_record(run, {"status": "running", "message": "", "metrics": {}, "overrides": FINISHED})  # killed outright
    (run / LOCK_NAME).write_text(json.dumps({"host": "elsewhere", "pid": dead_pid(), "command": "train"}))
    cli([*FINISHED, f"hydra.run.dir={run}"])
    assert read_record(run)["status"] == "ok"
    assert "running; started afresh" in (run / "train.log").read_text()
    assert holder(run)["pid"] == os.getpid() and holder(run)["host"], "the accepted job names itself, and stays"


def test_the_partial_checkpoint_a_killed_write_left_goes_when_the_next_job_takes_the_folder(
    cli, tmp_path, fake_training
):
    run = tmp_path / "run"
    # a job that failed while another write of its was cut short: the next one starts afresh, its checkpoints set aside
    write_record(run, {"status": "failed", "message": "boom", "metrics": {}, "overrides": FINISHED})
    (run / "checkpoints").mkdir()
    (run / "checkpoints" / ".best-step4.ckpt.4242.partial").write_bytes(b"half a checkpoint")
    (run / "checkpoints" / "best-step2.ckpt").write_bytes(b"a whole one")
    cli([*FINISHED, f"hydra.run.dir={run}"])
    kept = sorted(p.name for p in (run / "checkpoints.previous-1").iterdir())
    assert kept == ["best-step2.ckpt"], "the whole checkpoint is kept (set aside), the partial one is gone"


def test_a_rank_worker_takes_no_lock(cli, tmp_path, fake_training):
    cli([*FINISHED, "ddp_worker=true", "hydra.job.name=rank0", f"hydra.run.dir={tmp_path}"])  # its job holds it
    assert read_record(tmp_path)["status"] == "ok" and not (tmp_path / LOCK_NAME).exists()


def test_a_sweep_job_whose_folder_is_in_use_is_logged_and_the_sweep_goes_on(
    cli, tmp_path, hold_lock, fake_training, capsys
):
    (tmp_path / "0").mkdir()
    live = hold_lock(tmp_path / "0")
    before = tree(tmp_path / "0")
    cli(["-m", *FINISHED, "loss.tau=0.05,0.1", f"hydra.sweep.dir={tmp_path}"])
    assert tree(tmp_path / "0") == before and read_record(tmp_path / "1")["status"] == "ok"
    logged = f"job 0: the job's folder {tmp_path / '0'} (hydra.sweep.dir) is in use by PID {live.pid} on "
    console = capsys.readouterr().out  # Hydra's console log
    assert logged in console and "(the sweep goes on)" in console


def compose_export(overrides: list[str]):
    return compose_config(CONF_DIR, "export", overrides)


def test_an_export_into_a_folder_another_export_writes_in_is_refused_and_changes_nothing(tmp_path, hold_lock):
    out = tmp_path / "out"
    out.mkdir()
    live = hold_lock(out)
    before = tree(out)
    started = time.monotonic()
    with pytest.raises(SentembConfigError, match=rf"out=.* is in use by PID {live.pid} on .*Fix: wait for that"):
        export(compose_export(["model=tiny", "pooling=cls", f"out={out}"]))
    assert time.monotonic() - started < SECONDS and tree(out) == before


def test_an_export_leaves_no_lock_file_and_a_refused_one_leaves_no_folder(tmp_path):
    out = export(compose_export(["model=tiny", "pooling=cls", f"out={tmp_path / 'new' / 'out'}"]))
    assert (out / "README.md").is_file() and not (out / LOCK_NAME).exists(), "the artefacts alone"

    missing = tmp_path / "made" / "by" / "export"
    with pytest.raises(SentembConfigError):
        export(compose_export([f"checkpoint={tmp_path / 'none.ckpt'}", f"out={missing}"]))
    assert not (tmp_path / "made").exists(), "the folders the refused export made are gone"

    kept = tmp_path / "kept"
    kept.mkdir()
    (kept / "keep.txt").write_text("results")
    with pytest.raises(SentembConfigError, match="is not empty"):
        export(compose_export(["model=tiny", "pooling=cls", f"out={kept}"]))
    assert sorted(p.name for p in kept.iterdir()) == ["keep.txt"], "its lock file gone too"


@pytest.mark.slow  # two exports at once (subprocesses): make test-slow
def test_two_exports_started_together_into_one_new_folder_one_exports_the_other_changes_nothing(tmp_path):
    out = tmp_path / "out"
    command = [sys.executable, "-m", "sentemb.export", "model=tiny", "pooling=cls", f"out={out}"]
    processes = [subprocess.Popen(command, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    ended = sorted((process.communicate(timeout=600)[1], process.returncode)[::-1] for process in processes)
    (exported, exported_err), (refused, message) = ended
    assert exported == 0, exported_err[-3000:]
    # refused by the lock while the other writes (named by its PID, or not yet: it has not written the lock file's
    # line), or (had it finished first) by its emptiness check
    assert refused == 1 and ("is in use by" in message or "is not empty" in message), message[-3000:]
    assert (out / "README.md").is_file() and not (out / LOCK_NAME).exists(), "one export's artefacts alone"


def test_sigterm_outside_a_training_step_exits_143_and_records_preempted(cli, tmp_path, monkeypatch, sigterm_handler):
    handler, calls = sigterm_handler

    def train(cfg, before_build=None):  # a signal while the model builds or the dev evaluation at start runs
        signal.raise_signal(signal.SIGTERM)
        pytest.fail("the job went on after SIGTERM")

    monkeypatch.setattr(sentemb.train, "train", train)
    with pytest.raises(SystemExit) as stopped:
        cli([*FINISHED, f"hydra.run.dir={tmp_path}"])
    assert stopped.value.code == 128 + signal.SIGTERM
    record = read_record(tmp_path)
    assert record["status"] == "preempted" and record["signal"] == "SIGTERM", record
    assert "outside a training step: nothing was saved" in record["message"]
    assert calls == [signal.SIGTERM], "handed on once to the handler found (submitit's requeue), after the job's"
    assert signal.getsignal(signal.SIGTERM) is handler, "the job's handlers are gone"


def test_lightnings_sigterm_exception_is_a_preemption_not_a_success(cli, tmp_path, monkeypatch, sigterm_handler):
    def train(cfg, before_build=None):  # what Lightning raises when its SIGTERM handler noted the signal: SystemExit(0)
        raise SIGTERMException

    monkeypatch.setattr(sentemb.train, "train", train)
    with pytest.raises(SystemExit) as stopped:
        cli([*FINISHED, f"hydra.run.dir={tmp_path}"])
    assert stopped.value.code == 128 + signal.SIGTERM and read_record(tmp_path)["status"] == "preempted"


def train_command(args: list[str], run_dir: Path) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if k not in ("WANDB_MODE", "WANDB_API_KEY")}
    command = [sys.executable, "-m", "sentemb.train", *args, f"hydra.run.dir={run_dir}"]
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def ended_at(process: subprocess.Popen, started: float) -> tuple[int, float, str]:
    """(exit status, seconds from `started` to its end, its stderr) of a process, read as it runs."""
    _, stderr = process.communicate(timeout=600)
    return process.returncode, time.monotonic() - started, stderr


@pytest.mark.slow  # two trainings at once (subprocesses): make test-slow
def test_two_trainings_started_together_on_one_folder_one_trains_the_other_is_refused(
    tiny_overrides, small_stsb, tmp_path
):
    run = tmp_path / "run"
    job = [*tiny_overrides, f"eval.stsb_dir={small_stsb}", "trainer.max_steps=12"]  # outlasts the other's start
    processes = [train_command(job, run) for _ in range(2)]
    started = time.monotonic()
    with ThreadPoolExecutor(2) as pool:  # each process's end timed as it comes, not in the order they were started
        ended = list(pool.map(lambda process: ended_at(process, started), processes))
    (trained, trained_s, trained_err), (refused, refused_s, message) = sorted(ended, key=lambda end: end[0])
    assert trained == 0, trained_err[-3000:]
    assert refused == 1 and "is in use by PID" in message and "Traceback" not in message, message[-3000:]
    assert refused_s < trained_s, "refused while the other trained, not after it"
    assert read_record(run)["status"] == "ok" and "resumed" not in read_record(run)
    assert len(list((run / "checkpoints").glob("best-*.ckpt"))) == 1, "no best-step<N>-v1.ckpt of a second writer"
    assert sorted(p.name for p in (run / "csv").iterdir()) == ["version_0"], "one writer of the logs"


@pytest.mark.slow  # a real training in a subprocess: make test-slow
def test_sigterm_during_the_dev_evaluation_at_start_exits_143_and_records_preempted(
    tiny_overrides, small_stsb, tmp_path
):
    run = tmp_path / "run"
    kill = ["+callbacks.kill._target_=tests.interruptions.SignalAtStart", "eval.at_start=true"]
    stopped = train_command([*tiny_overrides, f"eval.stsb_dir={small_stsb}", *kill], run)
    _, stderr = stopped.communicate(timeout=600)
    assert stopped.returncode == 128 + signal.SIGTERM, stderr[-3000:]
    record = read_record(run)
    assert record["status"] == "preempted" and "outside a training step" in record["message"], record
    assert "Traceback" not in stderr and not (run / "checkpoints" / "last.ckpt").exists(), "no step ran"


def test_sigterm_during_the_dev_evaluation_at_start_stops_the_real_job_at_once(
    cli, tiny_overrides, small_stsb, tmp_path, sigterm_handler
):
    handler, calls = sigterm_handler
    kill = ["+callbacks.kill._target_=tests.interruptions.SignalAtStart", "eval.at_start=true"]
    with pytest.raises(SystemExit) as stopped:  # Lightning's SIGTERM handler is in place then, ours chained after it
        cli([*tiny_overrides, f"eval.stsb_dir={small_stsb}", *kill, f"hydra.run.dir={tmp_path}"])
    assert stopped.value.code == 128 + signal.SIGTERM and read_record(tmp_path)["status"] == "preempted"
    assert calls == [signal.SIGTERM] and signal.getsignal(signal.SIGTERM) is handler
    assert not (tmp_path / "checkpoints" / "last.ckpt").exists(), "stopped before the first step"


# ---- a lock file sentemb did not make: refused, never followed, written into or waited on for ever ----


def plant_lock(folder: Path, kind: str, victim: Path) -> Path:
    """`folder/.sentemb.lock` as `kind`: a link to `victim`, a dangling link, a folder, a hard link, a FIFO."""
    folder.mkdir(parents=True, exist_ok=True)
    lock = folder / LOCK_NAME
    if kind == "a link to a file":
        lock.symlink_to(victim)
    elif kind == "a dangling link":
        lock.symlink_to(folder / "gone" / "lock")
    elif kind == "a folder":
        lock.mkdir()
    elif kind == "a hard link":
        os.link(victim, lock)
    elif kind == "a FIFO":
        os.mkfifo(lock)
    return lock


LOCK_KINDS = {  # what stands at the lock's name → what the refusal says it is (a pattern)
    "a link to a file": r"a symbolic link \(to .*victim\.txt\)",
    "a dangling link": r"a symbolic link \(to .*gone/lock, dangling\)",
    "a folder": "a folder",
    "a hard link": r"a file with 2 hard links \(the same file under other names\)",
    "a FIFO": r"not a regular file \(a FIFO, socket or device\)",
}
TAKE_LOCK = """
import sys
from pathlib import Path
from sentemb.common.errors import SentembConfigError
from sentemb.common.folder_lock import take_folder_lock
try:
    take_folder_lock(Path(sys.argv[1]), "the folder", "wait").claim("a test")
except SentembConfigError as err:
    sys.exit(f"sentemb: {err}")
"""


@pytest.mark.parametrize("kind", LOCK_KINDS)
def test_a_lock_file_that_is_not_sentembs_is_refused_at_once_and_nothing_is_written_through_it(kind, tmp_path):
    # a process of its own, with a deadline: a dangling link made the create/open loop spin for ever
    victim = tmp_path / "victim.txt"
    victim.write_text("a file of the user's\n")
    plant_lock(tmp_path / "run", kind, victim)
    before = sorted(os.listdir(tmp_path / "run"))
    done = subprocess.run([sys.executable, "-c", TAKE_LOCK, str(tmp_path / "run")], capture_output=True, text=True,
                          timeout=SECONDS)  # fmt: skip
    assert done.returncode == 1, done.stderr[-3000:]
    assert re.search(rf"its lock file .*\.sentemb\.lock is {LOCK_KINDS[kind]}, which sentemb never makes", done.stderr)
    assert "Fix: remove it (rm " in done.stderr and "Traceback" not in done.stderr
    assert victim.read_text() == "a file of the user's\n", "the lock's JSON written into the link's target"
    assert sorted(os.listdir(tmp_path / "run")) == before and not (tmp_path / "run" / "gone").exists()


@pytest.mark.parametrize("kind", ["a link to a file", "a folder"])
def test_a_training_or_an_export_whose_lock_file_is_not_sentembs_is_refused(kind, cli, tmp_path, monkeypatch):
    victim = tmp_path / "victim.txt"
    victim.write_text("a file of the user's\n")
    monkeypatch.setattr(sentemb.train, "train", not_reached)
    plant_lock(tmp_path / "run", kind, victim)
    with pytest.raises(SystemExit, match=rf"hydra\.run\.dir=.*is {LOCK_KINDS[kind]}, .*Fix: remove it"):
        cli([*FINISHED, f"hydra.run.dir={tmp_path / 'run'}"])
    plant_lock(tmp_path / "out", kind, victim)
    with pytest.raises(SentembConfigError, match=rf"out=.*is {LOCK_KINDS[kind]}, .*Fix: remove it"):
        export(compose_export(["model=tiny", "pooling=cls", f"out={tmp_path / 'out'}"]))
    assert victim.read_text() == "a file of the user's\n"
    assert not (tmp_path / "run" / "metrics.json").exists(), "refused before the job wrote anything"


# ---- a writer into a folder another command holds: refused like a second training ----


def test_a_comparison_into_a_live_runs_folder_is_refused_before_any_work(tmp_path, hold_lock, monkeypatch):
    import sentemb.compare
    from tests.test_compare import fake_seed_sweep

    sweep = fake_seed_sweep(tmp_path / "sweep")
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    live = hold_lock(run)
    before = tree(run)
    out = run / "checkpoints" / "cmp"  # where the live run sets aside and cleans its files
    monkeypatch.setattr(sentemb.compare, "comparison", lambda *args: pytest.fail("compared into a live run's folder"))
    with pytest.raises(
        SentembConfigError,
        match=rf"--out {re.escape(str(out))} \(inside {re.escape(str(run))}\) is "
        rf"in use by PID {live.pid} .*Fix: wait for it to finish, or name an --out folder outside it",
    ):
        sentemb.compare.compare(compare_args([f"{sweep}:loss=infonce", f"{sweep}:loss=focal"], out))
    assert tree(run) == before


def test_an_export_into_a_live_runs_folder_is_refused_and_makes_nothing_there(tmp_path, hold_lock):
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    live = hold_lock(run)
    before = tree(run)
    out = run / "checkpoints" / "exported"
    with pytest.raises(SentembConfigError, match=rf"out={re.escape(str(out))} \(inside {re.escape(str(run))}\) is in "
                       rf"use by PID {live.pid} .*Fix: wait for it to finish, or pass an out= outside it"):  # fmt: skip
        export(compose_export(["model=tiny", "pooling=cls", f"out={out}"]))
    assert tree(run) == before


def test_negations_into_a_live_runs_folder_are_refused(tmp_path, hold_lock):
    from sentemb.negate import negate

    corpus = tmp_path / "corpus.txt"
    corpus.write_text("A man is not playing.\n")
    (tmp_path / "run").mkdir()
    live = hold_lock(tmp_path / "run")
    cfg = compose_config(CONF_DIR, "negate", [f"in={corpus}", f"out={tmp_path / 'run' / 'negations.jsonl'}",
                                              "source=rule"])  # fmt: skip
    with pytest.raises(
        SentembConfigError, match=rf"out=.*negations\.jsonl \(inside .*run\) is in use by PID {live.pid}"
    ):
        negate(cfg)
    assert not (tmp_path / "run" / "negations.jsonl").exists()


def compare_args(contenders: list[str], out: Path):
    import argparse

    return argparse.Namespace(contenders=contenders, tasks="", out=out, resamples=10, seed=1, level=0.95,
                              batch_size=8, device="cpu", data_dir=None)  # fmt: skip
