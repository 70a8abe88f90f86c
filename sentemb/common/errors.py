"""The exceptions sentemb raises on purpose.

Every `SentembConfigError` message names the offending file, line or config key and says how to
fix it, so a researcher never has to read a traceback to know what went wrong.
"""


class SentembConfigError(ValueError):
    """Bad input detected before any expensive work (model loading, training) starts."""


class TrainingDiverged(RuntimeError):
    """A non-finite loss or gradient: the job stops (its sweep goes on) and is recorded as `diverged`."""
