"""`make bench` rewrites BENCHMARKS.md's generated part and keeps its hand-measured section."""

from __future__ import annotations

from pathlib import Path

from tests.conftest import load_benchmark

ROOT = Path(__file__).resolve().parents[1]


def test_the_hand_measured_section_is_kept_from_its_heading_to_the_end(tmp_path):
    report = load_benchmark("report")
    out = tmp_path / "BENCHMARKS.md"
    out.write_text(
        "# Benchmarks\n\n| old | table |\n\n## Measured by hand\n\n| make train | 84.7652 |\n", encoding="utf-8"
    )
    assert report.kept_by_hand(out) == "## Measured by hand\n\n| make train | 84.7652 |\n"
    assert report.kept_by_hand(tmp_path / "absent.md") == ""
    out.write_text("# Benchmarks\n\nno hand section\n", encoding="utf-8")
    assert report.kept_by_hand(out) == ""


def test_the_repository_benchmarks_file_has_the_hand_measured_section():
    assert load_benchmark("report").kept_by_hand(ROOT / "BENCHMARKS.md").startswith("## Measured by hand")
