"""`python -m sentemb.mine model=<m> pooling=<p> data.path=<pairs file> out=<file> [mine.*=...]`: hard negatives for
(anchor, positive) pairs with sentence-transformers' `mine_hard_negatives` semantics (sentemb.data.mining), written
as a file `data=labelled data.path=<out>` reads unchanged, with `<out>.summary.json` beside it.

Everything is checked before the model loads: the `mine` options (sentemb.data.mining_options), every row of the
pairs file (the labelled reader's checks, file and line named), `out` (its folder, the pairs file, an existing file
without overwrite=true), and the model or checkpoint as sentemb.evaluate checks it. The output is written into a
temporary file beside `out` and renamed into place once whole (sentemb.common.published_files).
"""

from __future__ import annotations

import sys
from typing import Any

import hydra
from omegaconf import DictConfig

from sentemb.common import hydra_plumbing  # noqa: F401 - conf/'s resolvers (${packaged_model:...}) come with it
from sentemb.common.command_line import checked_command_line
from sentemb.common.config_fields import refuse_empty_paths
from sentemb.common.errors import SentembConfigError
from sentemb.common.folder_lock import enclosing_locks
from sentemb.common.hydra_plumbing import resolved_container
from sentemb.common.paths import CONF_DIR
from sentemb.common.process import configure_process
from sentemb.common.published_files import exit_on_sigterm
from sentemb.data.mining_files import checked_out, read_pairs
from sentemb.data.mining_options import MineOptions
from sentemb.encoders.checkpoint import check_checkpoint_file


@checked_command_line  # an unquoted non-ASCII override: named with its fix, before Hydra's lexer
@hydra.main(version_base="1.3", config_path=str(CONF_DIR), config_name="mine")
def main(cfg: DictConfig) -> None:
    configure_process()
    try:
        with exit_on_sigterm():  # SIGTERM: the temporary file goes as for any failure
            summary = mine(cfg)
    except SentembConfigError as err:
        sys.exit(f"sentemb: {err}")
    print(report(summary))


def mine(cfg: DictConfig) -> dict[str, Any]:
    """The checks (cheapest first, none needing the model), then the encoder, then sentemb.data.mining.mine_file."""
    refuse_empty_paths(cfg)
    options = MineOptions.checked(resolved_container(cfg.mine) or {}, cfg.get("seed"))
    data = cfg.get("data") or {}
    out = checked_out(cfg.get("out"), data.get("path"), bool(cfg.get("overwrite")))
    columns = list(data.get("columns")) if data.get("columns") is not None else None
    read_pairs(data.get("path"), columns)  # every row checked now, before anything loads (read again to mine)
    if cfg.get("checkpoint"):
        check_checkpoint_file(cfg.checkpoint, "checkpoint")
    else:
        from sentemb.encoders.models.backbones import check_model  # transformers: once the config composed

        check_model(cfg.model)
    import torch

    from sentemb.data.mining import mine_file
    from sentemb.eval.suite import load_encoder, served_checkpoint

    device = torch.device(("cuda" if torch.cuda.is_available() else "cpu") if cfg.device == "auto" else cfg.device)
    encoder, _, _ = load_encoder(cfg, device, served_checkpoint(cfg))
    with enclosing_locks(out, f"out={out}", "wait for it to finish, or name an out= outside it"):
        return mine_file(data.get("path"), out, encoder, options, columns=columns, overwrite=bool(cfg.overwrite))


def report(summary: dict[str, Any]) -> str:
    dropped = ", ".join(f"{rule} {count:,}" for rule, count in summary["candidates_dropped"].items())
    seconds = ", ".join(f"{stage} {value:.2f}" for stage, value in summary["seconds"].items())
    return (
        f"mine: {summary['rows_written']:,} {summary['output']} rows written to {summary['out']} "
        f"({summary['pairs_with_all_negatives']:,} of {summary['pairs_mined']:,} pairs found all their negatives; "
        f"{summary['seconds']['total']:.1f} s)\n"
        f"mine: candidates dropped: {dropped}\n"
        f"mine: seconds: {seconds}; summary in {summary['out']}.summary.json"
    )


if __name__ == "__main__":
    main()
