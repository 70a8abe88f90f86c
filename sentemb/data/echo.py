"""`echo`: a value read from a data file as a refusal quotes it, bounded (a sentence, a score, a JSON key)."""

from __future__ import annotations

import math
import reprlib
from typing import Any

ECHO_CHARS = 40  # a value a refusal quotes is cut to this many characters (and says how long it was)


def echo(value: Any) -> str:
    """`value` as a refusal quotes it: at most ECHO_CHARS characters, saying how long it was."""
    if isinstance(value, str):
        return repr(value) if len(value) <= ECHO_CHARS else f"{value[:ECHO_CHARS]!r}... ({len(value):,} characters)"
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 128:
        return f"an integer of about {int(value.bit_length() * math.log10(2)):,} digits"  # repr fails past 4,300
    text = reprlib.repr(value)
    return text if len(text) <= ECHO_CHARS else f"{text[:ECHO_CHARS]}..."
