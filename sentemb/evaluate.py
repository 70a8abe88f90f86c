"""`python -m sentemb.evaluate [checkpoint=PATH | model=... pooling=...] tasks=sts|transfer|all|[...]`:
SentEval's STS and transfer tasks (sentemb.eval.suite); `results.json` and `results.md` in the run directory."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from sentemb.common import hydra_plumbing  # noqa: F401 - conf/'s resolvers (${packaged_model:...}) come with it
from sentemb.common.command_line import checked_command_line
from sentemb.common.config_fields import refuse_empty_paths
from sentemb.common.errors import SentembConfigError
from sentemb.common.paths import CONF_DIR
from sentemb.common.process import configure_process
from sentemb.encoders.checkpoint import check_checkpoint_file
from sentemb.runs.job_files import command_folder


def evaluate(cfg: DictConfig, output_dir: Path) -> dict[str, Any]:
    """sentemb.eval.suite's `evaluate`, imported when called: torch loads once Hydra has composed the config."""
    from sentemb.eval.suite import evaluate as run_suite

    return run_suite(cfg, output_dir)


@checked_command_line  # an unquoted non-ASCII override: named with its fix, before Hydra's lexer
@hydra.main(version_base="1.3", config_path=str(CONF_DIR), config_name="eval")
def main(cfg: DictConfig) -> None:
    configure_process()
    try:
        refuse_empty_paths(cfg)  # checkpoint= given empty: refused, never the default model evaluated instead
        if cfg.get("checkpoint"):  # a missing or non-checkpoint file named before torch is imported
            check_checkpoint_file(cfg.checkpoint, "checkpoint")
        else:  # model= with pooling=: a mistyped folder is named before anything loads
            from sentemb.encoders.models.backbones import check_model  # transformers: once the config composed

            check_model(cfg.model)
        # the folder's lock, its subfolders never links, .hydra/evaluate/ and evaluate.log (docs/evaluation.md#folder)
        with command_folder(cfg, HydraConfig.get(), "evaluate", ["wandb"] if cfg.get("wandb_run_id") else []):
            evaluate(cfg, Path(HydraConfig.get().runtime.output_dir))
    except SentembConfigError as err:
        sys.exit(f"sentemb: {err}")


if __name__ == "__main__":
    main()
