"""`python -m sentemb`: the commands this package runs, as sentemb/__init__.py's docstring lists them."""

from __future__ import annotations

import sys

import sentemb  # its __init__ imports nothing heavy: this prints at once


def main() -> int:
    print(sentemb.__doc__.strip())  # the one list of the commands, kept beside the package it describes
    return 0


if __name__ == "__main__":
    sys.exit(main())
