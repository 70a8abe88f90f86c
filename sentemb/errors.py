"""The one exception type sentemb raises for bad user input.

Every message names the offending file, line or config key and says how to fix it, so a
researcher never has to read a traceback to know what went wrong.
"""


class SentembConfigError(ValueError):
    """Bad input detected before any expensive work (model loading, training) starts."""
