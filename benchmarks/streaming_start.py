"""Time to the first training step and peak memory: today's corpus preparation against data.streaming=true.

A synthetic corpus of --lines lines (the 12k-line wiki sample repeated) is written to a temporary
directory, deleted afterwards. Each path runs `python -m sentemb.train` in a fresh process
(--model minilm by default, the default job's encoder; logger=csv, eval.at_start=false,
trainer.max_steps=1, an empty HF_DATASETS_CACHE so today's path is measured cold). A callback
injected through a Hydra override (`+callbacks.first_step`: `FirstStepMarker` below, imported from
this folder) writes the time when the first training batch starts; nothing in the package changes.
Time to first step: from just before the process starts to that time (the up-front corpus check,
imports, model loading and the data preparation of each path). Peak memory: the highest VmHWM
(peak resident set) of the process and its descendants, polled from /proc until the first step has
started; the process is then ended (what follows, the closing dev and test evaluation, is the same
for both paths).

    python benchmarks/streaming_start.py [--lines 10000000] [--model minilm]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import lightning as L

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(HERE))
from rows import row, write_rows  # noqa: E402

POLL_S = 0.1


class FirstStepMarker(L.Callback):
    """Writes the wall-clock time at the start of the first training batch to `path` (renamed into place whole)."""

    def __init__(self, path: str) -> None:
        self.path = Path(path)

    def on_train_batch_start(self, trainer: L.Trainer, *args: object) -> None:
        if trainer.global_step == 0 and not self.path.exists():
            partial = self.path.with_suffix(".partial")
            partial.write_text(repr(time.time()))
            partial.rename(self.path)


def write_corpus(path: Path, lines: int) -> None:
    """`lines` lines: the wiki sample repeated (its last copy cut short)."""
    from sentemb.common.paths import resolve_data_root

    sample = (resolve_data_root() / "wiki" / "wiki1m_head.txt").read_bytes().splitlines(keepends=True)
    whole, rest = divmod(lines, len(sample))
    block = b"".join(sample)
    with path.open("wb") as handle:
        for _ in range(whole):
            handle.write(block)
        handle.write(b"".join(sample[:rest]))


def descendants(pid: int) -> list[int]:
    found, queue = [], [pid]
    while queue:
        current = queue.pop()
        found.append(current)
        for task in Path(f"/proc/{current}/task").glob("*"):
            try:
                queue += [int(child) for child in (task / "children").read_text().split()]
            except OSError:
                continue
    return found


def peak_rss_mib(pid: int) -> float:
    """The summed VmHWM (each process's own peak resident set) of `pid` and its descendants."""
    total = 0
    for member in descendants(pid):
        try:
            status = Path(f"/proc/{member}/status").read_text()
        except OSError:
            continue
        total += next((int(line.split()[1]) for line in status.splitlines() if line.startswith("VmHWM:")), 0)
    return total / 1024


def first_step(name: str, corpus: Path, streaming: bool, model: str, workdir: Path) -> dict:
    """One fresh training process up to its first step: seconds from process start, and its peak memory."""
    marker = workdir / f"{name}.first_step"
    overrides = [
        f"model={model}",
        "logger=csv",
        "eval.at_start=false",
        "trainer.max_steps=1",
        f"data.corpus={corpus}",
        f"data.streaming={str(streaming).lower()}",
        f"hydra.run.dir={workdir / name}",
        "+callbacks.first_step._target_=streaming_start.FirstStepMarker",
        f"+callbacks.first_step.path={marker}",
    ]
    env = {
        **os.environ,
        "HF_DATASETS_CACHE": str(workdir / f"{name}_datasets_cache"),  # empty: today's path measured cold
        "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep),
    }
    log = (workdir / f"{name}.log").open("w")
    started = time.time()
    process = subprocess.Popen(
        [sys.executable, "-m", "sentemb.train", *overrides], cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT
    )
    peak = 0.0
    try:
        while not marker.exists():
            peak = max(peak, peak_rss_mib(process.pid))
            if process.poll() is not None:
                tail = (workdir / f"{name}.log").read_text()[-3000:]
                raise RuntimeError(f"{name}: the training process ended before its first step:\n{tail}")
            time.sleep(POLL_S)
        peak = max(peak, peak_rss_mib(process.pid))
    finally:
        if process.poll() is None:
            process.kill()  # the rest of the run (the closing evaluation) is the same for both paths
        process.wait()
        log.close()
    return {"seconds": float(marker.read_text()) - started, "peak_mib": peak}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lines", type=int, default=10_000_000)
    parser.add_argument("--model", default="minilm", help="model= of both runs (minilm: the default job's)")
    parser.add_argument("--out", type=Path, default=HERE / "results" / "streaming_start.md")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="streaming_start_") as tmp:
        workdir = Path(tmp)
        corpus = workdir / "corpus.txt"
        write_corpus(corpus, args.lines)
        size_mib = corpus.stat().st_size / 2**20
        print(f"corpus: {args.lines:,} lines, {size_mib:,.0f} MiB", flush=True)
        # the corpus was just written: both paths read it from the page cache
        streamed = first_step("streaming", corpus, True, args.model, workdir)
        print(f"data.streaming=true: {streamed}", flush=True)
        today = first_step("today", corpus, False, args.model, workdir)
        print(f"data.streaming=false: {today}", flush=True)

    time_ratio = streamed["seconds"] / today["seconds"]
    memory_ratio = streamed["peak_mib"] / today["peak_mib"]
    corpus_label = f"{args.lines:,} lines ({size_mib:,.0f} MiB), model={args.model}"
    lines = [
        f"# Time to the first training step: {corpus_label}",
        "",
        "| path | time to first step, s | peak RSS MiB |",
        "|---|---|---|",
        f"| data.streaming=false (today: check, read, filter, tokenise all) | {today['seconds']:.1f} | "
        f"{today['peak_mib']:.0f} |",
        f"| data.streaming=true | {streamed['seconds']:.1f} | {streamed['peak_mib']:.0f} |",
        "",
        f"streaming / today: time **{time_ratio:.3f}**, peak memory **{memory_ratio:.3f}**",
    ]
    report = "\n".join(lines)
    print("\n" + report)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(report + "\n")
    anchor = "data.streaming=false (today), fresh process, cold datasets cache"
    write_rows(
        "streaming_start",
        [
            row(f"time to first training step, s: data.streaming=true, {corpus_label}", streamed["seconds"],
                anchor, today["seconds"], time_ratio, "—", None),
            row(f"peak RSS up to the first step, MiB: data.streaming=true, {corpus_label}", streamed["peak_mib"],
                anchor, today["peak_mib"], memory_ratio, "—", None),
        ],
    )  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
