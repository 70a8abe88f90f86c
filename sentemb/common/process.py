"""Process-wide settings: what a command sets for its whole process, in one call, first thing in its `main`.

`configure_process()` makes each of them (a second call changes nothing):

- the library warnings and log lines a run need not show (sentemb.common.log_noise, each with its reason);
- matplotlib's file-only backend (Agg): the commands write figures and never show them, so a
  DISPLAY set on a login node never opens a window backend.

Three stay beside the library code that needs them, since a library user (a notebook, a test, a
benchmark) needs them without any command:

- the resolvers conf/ uses: registered when sentemb.common.hydra_plumbing is imported, as Hydra
  resolves `hydra.run.dir` before a command's `main` runs;
- the padding-free attention: registered when sentemb.encoders.models.padding_free is imported, so every
  process that holds such a backbone has it (a DDP rank that only unpickles one included), and with it the
  CPU attention guard (sentemb.encoders.models.cpu_attention: bf16 attention under a lowered ATEN_CPU_CAPABILITY);
- `torch.utils.deterministic.fill_uninitialized_memory = False`: set by
  sentemb.training.trainer.build_trainer beside the deterministic mode its Trainer switches on.
"""

from __future__ import annotations

import os
import sys

from sentemb.common.log_noise import silence_known_noise

FIGURE_BACKEND = "Agg"


def configure_process() -> None:
    """The settings above, for this whole process; idempotent (a multirun calls it once per job)."""
    silence_known_noise()  # each line silenced is listed, with its reason, in sentemb/common/log_noise.py
    matplotlib = sys.modules.get("matplotlib")
    if matplotlib is not None:
        matplotlib.use(FIGURE_BACKEND)  # figure files only, never a window
    else:  # read by matplotlib when first imported: its import (a third of a second) waits for a command's figure
        os.environ["MPLBACKEND"] = FIGURE_BACKEND
