"""`make bench`: run every benchmark (quick modes where a script has long ones) and write BENCHMARKS.md.

Each row is a figure against its anchor measured in the same run, their ratio, the target from
the figure's issue and whether it holds, with the machine and date. The training studies
(loss_study, encoder_variants) run their --quick modes and their tables are appended: they show
the pipeline runs end to end, not the papers' numbers (those need full epochs: BENCHMARKS.md's Training studies).

    python benchmarks/report.py [--full] [--out BENCHMARKS.md]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import torch

from sentemb.eval.deployed import cpu_name

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
RESULTS = HERE / "results"
# (script, the job's arguments (both modes), its quick arguments, rows file or None, markdown appended or None)
SCRIPTS = [
    ("step_time.py", [], ["--rounds", "2", "--steps", "6", "--warmup", "2"], "step_time", "step_time.md"),
    *[
        (
            "step_time.py",
            ["--pooling", pooling, "--max-length", "64"],
            ["--rounds", "2", "--steps", "4", "--warmup", "2"],
            f"step_time_{pooling}64",
            f"step_time_{pooling}64.md",
        )
        for pooling in ("prompt", "hicl")
    ],
    # issue 29: a 92 M-parameter random Llama, full fine-tuning vs LoRA vs LoRA + gradient checkpointing, padded vs
    # padding-free, each configuration in a fresh process; three rounds, so the median sets one disturbed round aside.
    # At max_length 32 its batches are ~85% real tokens and sentemb leaves a third of them padded: padded vs
    # padding-free again at 64 (~66% real, every batch packed)
    *[
        (
            "decoder_step.py",
            job,
            ["--rounds", "3", "--steps", "2", "--warmup", "2"],
            f"decoder_step{length}",
            f"decoder_step{length}.md",
        )
        for job, length in (([], ""), (["--max-length", "64", "--configs", "full_padded,full_padding_free"], "64"))
    ],
    # the STS-suite and HiCL ratios sit near their bounds: their default rounds, so one noisy round cannot decide
    ("eval_speed.py", [], [], "eval_speed", None),
    ("hicl_speed.py", [], [], "hicl_speed", None),
    ("grad_cache.py", [], ["--rounds", "1"], "grad_cache", None),
    # issue 30: the exported MiniLM's ONNX graph, fp32 and int8, encoding STS-B test against sentence-transformers fp32;
    # int8's ratio sits near its bound (1.7-2.4 per round): its default 3 rounds, so one noisy round cannot decide
    ("onnx_encode.py", [], [], "onnx_encode", None),
    ("streaming_start.py", [], ["--lines", "1000000"], "streaming_start", None),
    # issue 36: every checkpoint is written to a temporary name, fsynced and renamed (whole or absent)
    ("checkpoint_write.py", [], [], "checkpoint_write", None),
    ("loss_study.py", [], ["--quick"], None, "loss_study_quick/loss_study.md"),
    ("encoder_variants.py", [], ["--quick"], None, "encoder_variants_quick/encoder_variants.md"),
]

TRAINING_STUDIES = ("loss_study.py", "encoder_variants.py")


def machine() -> str:
    cpu = cpu_name()
    gpu = f", GPU {torch.cuda.get_device_name(0)}" if torch.cuda.is_available() else ""
    return f"{cpu}, {os.cpu_count()} cores{gpu}, torch {torch.__version__}, Python {platform.python_version()}"


HAND_WRITTEN = "## Measured by hand"  # from this heading on, BENCHMARKS.md is kept as it is: figures no script makes


def kept_by_hand(out: Path) -> str:
    """The hand-measured section of an existing BENCHMARKS.md (its heading to the end), or ""."""
    text = out.read_text(encoding="utf-8") if out.is_file() else ""
    start = text.find(f"\n{HAND_WRITTEN}\n")
    return text[start + 1 :] if start >= 0 else ""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--full", action="store_true", help="the scripts' default (long) modes")
    parser.add_argument("--out", type=Path, default=ROOT / "BENCHMARKS.md")
    args = parser.parse_args()
    rows, runs, appendices = [], [], []
    for script, job, quick, rows_name, appendix in SCRIPTS:
        if rows_name:
            (RESULTS / f"{rows_name}.json").unlink(missing_ok=True)  # a failed script must not leave old rows
        if appendix:
            (RESULTS / appendix).unlink(missing_ok=True)
        # --full drops the quick arguments only: the job's own (step_time's --pooling) name another job
        command = [sys.executable, str(HERE / script), *job, *([] if args.full else quick)]
        print("$", " ".join(command[1:]), flush=True)
        started = time.perf_counter()
        completed = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
        seconds = time.perf_counter() - started
        runs.append((script, " ".join(command[2:]), completed.returncode, seconds))
        if completed.returncode not in (0, 1):  # 1: ran, a target missed (in the rows); else it broke
            print(completed.stdout[-2000:], completed.stderr[-3000:], file=sys.stderr)
        if rows_name and (RESULTS / f"{rows_name}.json").is_file():
            rows += [{**r, "script": script} for r in json.loads((RESULTS / f"{rows_name}.json").read_text())]
        if appendix and (RESULTS / appendix).is_file():
            appendices.append((script, (RESULTS / appendix).read_text()))
    lines = [
        "# Benchmarks",
        "",
        f"Written by `make bench` ({'full' if args.full else 'quick'} modes) on "
        f"{datetime.datetime.now().astimezone():%Y-%m-%d %H:%M %Z}; machine: {machine()}.",
        "Each figure is measured against its anchor in the same run; ratio = figure / anchor.",
        "",
        "| figure | value | anchor | anchor value | ratio | target | pass | script |",
        "|---|---|---|---|---|---|---|---|",
        *[
            f"| {r['figure']} | {r['value']:.4g} | {r['anchor']} | {r['anchor_value']:.4g} | {r['ratio']:.3f} | "
            f"{r['target']} | {'—' if r['passed'] is None else 'yes' if r['passed'] else '**no**'} | {r['script']} |"
            for r in rows
        ],
        "",
        "| script | arguments | exit | wall time |",
        "|---|---|---|---|",
        *[f"| {s} | `{a}` | {rc} | {t / 60:.1f} min |" for s, a, rc, t in runs],
    ]
    for script, table in appendices:
        note = " (quick: 30 steps per run, not the papers' setting)" if script in TRAINING_STUDIES else ""
        lines += ["", f"## {script}{note}", "", table.strip()]
    kept = kept_by_hand(args.out)
    args.out.write_text("\n".join(lines) + "\n" + (f"\n{kept}" if kept else ""))
    print("\n".join(lines))
    broken = [s for s, _, rc, _ in runs if rc not in (0, 1)]
    missed = [r["figure"] for r in rows if r["passed"] is False]
    return 1 if broken or missed else 0


if __name__ == "__main__":
    sys.exit(main())
