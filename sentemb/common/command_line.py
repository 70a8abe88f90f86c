"""The command line, checked before Hydra parses it: what Hydra's override grammar would refuse with a lexer error.

Hydra's grammar takes non-ASCII characters (an accented folder name, a non-Latin path) only inside quoted
values; unquoted, its refusal (`LexerNoViableAltException`) names neither the reason nor the fix.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable, Sequence
from typing import Any

# Hydra's flags whose value is the next argument (a path, not an override)
FLAGS_WITH_VALUE = ("--config-path", "-cp", "--config-name", "-cn", "--config-dir", "-cd", "--experimental-rerun")


def unquoted_non_ascii(argv: Sequence[str]) -> str | None:
    """Why an override holding non-ASCII characters is one Hydra's grammar refuses, with the fix; None if none is
    (quoted ones, in lists and dicts too, parse: Hydra's own parser decides)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import OverrideParseException

    flag_values = {i + 1 for i, arg in enumerate(argv) if arg in FLAGS_WITH_VALUE}
    for index, arg in enumerate(argv):
        if arg.isascii() or arg.startswith("-") or index in flag_values:
            continue
        try:
            OverridesParser.create().parse_overrides([arg])
            continue
        except OverrideParseException:
            pass
        key, _, value = arg.partition("=")
        odd = next(ch for ch in arg if not ch.isascii())
        return (
            f"{arg}: Hydra's override grammar reads non-ASCII characters (here {odd!r}) only inside quotes. "
            f"Fix: quote the value, e.g. \"{key}='{value}'\" in a shell"
        )
    return None


def checked_command_line(entry: Callable[..., Any]) -> Callable[..., Any]:
    """`entry` (a Hydra main) that, called as a command (no arguments: Hydra reads sys.argv), first exits with the
    fix for an override Hydra's grammar would refuse without one."""

    @functools.wraps(entry)
    def run(*args: Any, **kwargs: Any) -> Any:
        problem = None if args or kwargs else unquoted_non_ascii(sys.argv[1:])
        if problem:
            sys.exit(f"sentemb: {problem}")
        return entry(*args, **kwargs)

    return run
