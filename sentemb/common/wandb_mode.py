"""Whether W&B logs online, offline or not at all, decided from the environment alone.

In common/ because both the evaluation suite (eval/) and the training jobs (runs/) open W&B runs
with it, and eval sits below runs.
"""

from __future__ import annotations

import os


def wandb_disabled() -> bool:
    """WANDB_MODE=disabled: W&B writes nothing at all (no offline run under the run folder's wandb/)."""
    return os.environ.get("WANDB_MODE", "").lower() == "disabled"


def wandb_offline() -> bool:
    """Offline unless the user configured W&B online (WANDB_MODE=online, or an API key in the environment)."""
    mode = os.environ.get("WANDB_MODE", "").lower()
    if mode in ("online", "run"):
        return False
    if mode in ("offline", "dryrun", "disabled"):
        return True
    return not os.environ.get("WANDB_API_KEY")


def wandb_mode() -> str:
    """wandb.init's mode, passed explicitly: wandb reads the environment only when its process singleton starts."""
    if wandb_disabled():  # passed on as wandb's own mode: its runs are no-ops that write no folder
        return "disabled"
    return "offline" if wandb_offline() else "online"
