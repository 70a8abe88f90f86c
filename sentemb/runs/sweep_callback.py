"""The sweep report's Hydra callback (conf/train.yaml's hydra.callbacks), light: Hydra instantiates it in every run,
a single one too, before the command's checks; the report's module (sentemb.runs.sweeps: scipy's tests, matplotlib's
figures) is imported when a multirun ends."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from sentemb.common.errors import SentembConfigError


class SweepReportCallback(Callback):
    """Hydra callback: the report (and its W&B run) at the end of every multirun."""

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        from sentemb.runs.sweeps import log_to_wandb, write_report

        sweep_dir = Path(str(config.hydra.sweep.dir))
        try:
            result = write_report(sweep_dir)
        except SentembConfigError as err:  # e.g. every job failed before writing anything
            print(f"sentemb: no sweep report: {err}", file=sys.stderr)
            return
        print(f"\n{result['markdown']}\n(sweep report in {sweep_dir})")
        wandb_cfg = (config.get("logger") or {}).get("wandb")
        if wandb_cfg:
            log_to_wandb(result, str(wandb_cfg.project), str(config.get("sweep_name") or sweep_dir.name), sweep_dir)
