"""`python -m sentemb.sweep_report <multirun dir>`: a sweep's report (sweep.csv, sweep.md, sweep_tests.csv, figures,
the winner), again by hand (also while jobs still run); it is also written at the end of every multirun. An Optuna
study (hparams_search=optuna) gets Optuna's figures: optimisation history, parameter importances, slice."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from sentemb.common.errors import SentembConfigError
from sentemb.common.process import configure_process
from sentemb.runs.sweeps import TESTS_NAME, write_report


def main(argv: list[str] | None = None) -> int:
    configure_process()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("sweep_dir", type=Path, help="a multirun directory (holding <job>/metrics.json)")
    args = parser.parse_args(argv)
    try:
        result = write_report(args.sweep_dir)
    except SentembConfigError as err:
        print(f"sentemb: {err}", file=sys.stderr)
        return 1
    print(result["markdown"])
    tests = [TESTS_NAME] if result["tests"] else []
    written = ", ".join(["sweep.csv", "sweep.md", *tests, *(p.name for p in result["figures"])])
    print(f"written: {written} in {args.sweep_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
