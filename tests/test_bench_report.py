"""`make bench` rewrites BENCHMARKS.md's generated part and keeps its hand-measured section."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def load_report():
    spec = importlib.util.spec_from_file_location("bench_report", ROOT / "benchmarks" / "report.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_hand_measured_section_is_kept_from_its_heading_to_the_end(tmp_path):
    report = load_report()
    out = tmp_path / "BENCHMARKS.md"
    out.write_text(
        "# Benchmarks\n\n| old | table |\n\n## Measured by hand\n\n| make train | 84.7652 |\n", encoding="utf-8"
    )
    assert report.kept_by_hand(out) == "## Measured by hand\n\n| make train | 84.7652 |\n"
    assert report.kept_by_hand(tmp_path / "absent.md") == ""
    out.write_text("# Benchmarks\n\nno hand section\n", encoding="utf-8")
    assert report.kept_by_hand(out) == ""


def test_the_repository_benchmarks_file_has_the_hand_measured_section():
    assert load_report().kept_by_hand(ROOT / "BENCHMARKS.md").startswith("## Measured by hand")
