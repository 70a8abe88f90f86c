"""The exceptions sentemb raises on purpose.

Every `SentembConfigError` message names the offending file, line or config key and says how to
fix it, so a researcher never has to read a traceback to know what went wrong.
"""


class SentembConfigError(ValueError):
    """Bad input detected before any expensive work (model loading, training) starts."""


class TrainingDiverged(RuntimeError):
    """A non-finite loss or gradient: the job stops (its sweep goes on) and is recorded as `diverged`."""


class Preempted(RuntimeError):
    """A preemption signal (SIGTERM, SIGUSR1, SIGUSR2) arrived: `checkpoints/last.ckpt` holds this step, the job is
    recorded as `preempted` and restarting it in the same run directory resumes it (sentemb.runs.rerun_policy)."""

    def __init__(self, signum: int, step: int, checkpoint: str) -> None:
        import signal

        self.signum, self.step, self.checkpoint = signum, step, checkpoint
        super().__init__(
            f"{signal.Signals(signum).name} at step {step}: {checkpoint} holds this step; run the same command "
            "again (same run directory) to resume"
        )
