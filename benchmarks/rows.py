"""Each benchmark's figures as rows (benchmarks/results/<name>.json), gathered by `make bench` into BENCHMARKS.md.

A row is a figure measured against its anchor in the same run: the value, the anchor's value,
their ratio, the target from the figure's issue and whether it holds.
"""

from __future__ import annotations

import json
import sys
import traceback
from collections.abc import Callable
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"


def row(figure: str, value: float, anchor: str, anchor_value: float, ratio: float, target: str, passed: bool | None):
    """`target` like "<= 1.05"; `passed` None where the figure has no target (reported for the record)."""
    return {
        "figure": figure,
        "value": value,
        "anchor": anchor,
        "anchor_value": anchor_value,
        "ratio": ratio,
        "target": target,
        "passed": passed,
    }


def write_rows(name: str, rows: list[dict]) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps(rows, indent=2) + "\n")
    return path


def exit_with(main: Callable[[], int]) -> None:
    """Exit with main()'s code (0: every target holds, 1: one missed), or 2 with the traceback when it crashes: a
    crash must not exit 1, which report.py reads as "ran, a target missed"."""
    try:
        code = main()
    except Exception:
        traceback.print_exc()
        code = 2
    sys.exit(code)
