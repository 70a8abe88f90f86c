"""The command line, checked before Hydra parses it: what Hydra's override grammar would refuse with a lexer error.

Hydra's grammar takes non-ASCII characters (an accented folder name, a non-Latin path) only inside quoted
values; unquoted, its refusal (`LexerNoViableAltException`) names neither the reason nor the fix.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable, Sequence
from typing import Any

QUOTES = ("'", '"')


def unquoted_non_ascii(argv: Sequence[str]) -> str | None:
    """Why an override's non-ASCII characters stand outside quotes, with the fix; None if none does."""
    for arg in argv:
        if arg.isascii() or arg.startswith("-"):
            continue
        key, _, value = arg.partition("=")
        if value[:1] in QUOTES and value[-1:] == value[:1] and len(value) > 1:
            continue
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
