"""The exceptions sentemb raises on purpose.

Every `SentembConfigError` message names the offending file, line or config key and says how to
fix it, so a researcher never has to read a traceback to know what went wrong.
"""


class SentembConfigError(ValueError):
    """Bad input detected before any expensive work (model loading, training) starts."""


class TrainingDiverged(RuntimeError):
    """A non-finite loss or gradient: the job stops (its sweep goes on) and is recorded as `diverged`."""


class CheckpointNotWritten(OSError):
    """A checkpoint could not be written (a full disk, a quota, a permission): the message names the file, the
    system's reason and the fix; no partial file is left behind. The job is recorded as `failed`."""


class Preempted(RuntimeError):
    """A preemption signal (SIGTERM, SIGUSR1, SIGUSR2) arrived: the job is recorded as `preempted`, exits with
    128 + the signal's number, and restarting it in the same run directory resumes it (sentemb.runs.rerun_policy).

    During training `checkpoints/last.ckpt` then holds the step it stopped at (`step`, `checkpoint`); outside a
    training step (the model's build, the dev evaluation at start, the closing test) nothing was saved for it.
    """

    def __init__(self, signum: int, step: int | None = None, checkpoint: str | None = None) -> None:
        import signal

        self.signum, self.step, self.checkpoint = signum, step, checkpoint
        name = signal.Signals(signum).name
        if checkpoint is None:
            message = (
                f"{name} outside a training step: nothing was saved for it; run the same command again (same run "
                "directory) to restart the job, from its checkpoints/last.ckpt if it has one"
            )
        else:
            message = (
                f"{name} at step {step}: {checkpoint} holds this step; run the same command again (same run "
                "directory) to resume"
            )
        super().__init__(message)
