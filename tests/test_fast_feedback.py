"""Config and data errors are answered before torch and lightning are imported (issue 62, finding 14).

Each case runs `python -X importtime -m sentemb.<command> ...` in a fresh process: Python's own record of every
module it imported (stderr), so nothing in the package reports on itself. The bound is generous (a slow CI CPU
passes); the measured time is printed (`pytest -s`).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sentemb.common.paths import resolve_data_root

REPO = Path(__file__).resolve().parents[1]
BOUND_S = 5.0  # here about 1 to 2 s; with torch and lightning imported it was 8 to 10 s
HEAVY = ("torch", "lightning", "transformers")


def run_command(command: str, overrides: list[str], cwd: Path) -> tuple[subprocess.CompletedProcess, float, set[str]]:
    """The command's exit, its wall time and the top-level packages it imported (from -X importtime)."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "SENTEMB_DATA": str(resolve_data_root()), "WANDB_MODE": "offline"}
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", f"sentemb.{command}", *overrides],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    seconds = time.perf_counter() - start
    imported = {
        line.split("|")[2].strip().split(".")[0] for line in done.stderr.splitlines() if line.startswith("import time:")
    }
    return done, seconds, imported


def assert_fast_refusal(command: str, overrides: list[str], cwd: Path, expected: str) -> None:
    done, seconds, imported = run_command(command, overrides, cwd)
    print(f"sentemb.{command} {' '.join(overrides)}: answered in {seconds:.2f} s")
    message = "\n".join(line for line in done.stderr.splitlines() if not line.startswith("import time:"))
    assert done.returncode != 0
    assert expected in message, message
    assert not imported & set(HEAVY), f"imported before answering: {sorted(imported & set(HEAVY))}"
    assert seconds < BOUND_S, f"{seconds:.2f} s"


def test_a_mistyped_key_is_answered_without_torch(tmp_path):
    assert_fast_refusal("train", ["loss.taux=1"], tmp_path, "Key 'taux' is not in struct")


def test_a_presets_old_flat_name_is_answered_with_its_new_one_without_torch(tmp_path):
    expected = "experiment=sncse_tiny is now experiment=sncse/tiny (presets are grouped in folders by the paper"
    assert_fast_refusal("train", ["experiment=sncse_tiny", "logger=csv"], tmp_path, expected)


def test_a_seed_that_is_not_whole_is_answered_without_torch(tmp_path):
    assert_fast_refusal("train", ["seed=1.5"], tmp_path, "seed=1.5 is not a seed")


def test_a_bad_data_value_is_answered_without_torch(tmp_path):
    assert_fast_refusal("train", ["data.batch_size=1"], tmp_path, "data.batch_size=1: the other sentences")


def test_a_missing_corpus_is_answered_without_torch(tmp_path):
    missing = tmp_path / "absent.txt"
    assert_fast_refusal("train", [f"data.corpus={missing}"], tmp_path, f"training corpus {missing} does not exist")


def test_a_bad_labelled_csv_line_is_answered_without_torch(tmp_path):
    path = tmp_path / "pairs.csv"
    path.write_text("anchor,positive\na cat sat,a cat sits\nthe dog ran,the dog runs,extra\n", encoding="utf-8")
    expected = f"{path}:3: 3 fields, but the header has 2 (anchor, positive)"
    assert_fast_refusal("train", ["data=labelled", f"data.path={path}"], tmp_path, expected)


def test_a_mistyped_evaluate_key_is_answered_without_torch(tmp_path):
    assert_fast_refusal("evaluate", ["taskz=sts"], tmp_path, "Key 'taskz' is not in struct")


@pytest.mark.parametrize("tau", ["0", "-0.05"])
def test_tau_not_above_zero_is_answered_without_lightning(tmp_path, tau):
    """The loss's own constructor refuses it: an nn.Module, so torch is imported (the one check here that needs it),
    but neither lightning nor transformers, and no model."""
    done, seconds, imported = run_command("train", [f"loss.tau={tau}"], tmp_path)
    print(f"sentemb.train loss.tau={tau}: answered in {seconds:.2f} s")
    assert done.returncode != 0
    assert f"loss.tau={tau} must be a number > 0" in done.stderr
    assert not imported & {"lightning", "transformers"}, sorted(imported & {"lightning", "transformers"})


def test_a_missing_evaluate_checkpoint_is_answered_without_torch(tmp_path):
    missing = tmp_path / "best.ckpt"
    expected = f"checkpoint={missing}: no such checkpoint file"
    assert_fast_refusal("evaluate", [f"checkpoint={missing}"], tmp_path, expected)


def test_a_mistyped_export_key_is_answered_without_torch(tmp_path):
    assert_fast_refusal("export", ["outt=folder"], tmp_path, "Key 'outt' is not in struct")


def test_a_missing_export_checkpoint_is_answered_without_torch(tmp_path):
    missing = tmp_path / "best.ckpt"
    expected = f"checkpoint={missing}: no such checkpoint file"
    assert_fast_refusal("export", [f"checkpoint={missing}", f"out={tmp_path / 'out'}"], tmp_path, expected)


def test_the_light_commands_still_register_the_resolvers_conf_uses():
    """evaluate and export import no library module before Hydra composes: the resolvers (model=tiny's
    ${packaged_model:...}) are registered by their own import of sentemb.common.hydra_plumbing."""
    script = "import sentemb.evaluate, sentemb.export; from omegaconf import OmegaConf; "
    script += "print(OmegaConf.has_resolver('packaged_model'), OmegaConf.has_resolver('checkpoint_dir'))"
    done = subprocess.run(
        [sys.executable, "-c", script], env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True, text=True
    )
    assert done.stdout.split() == ["True", "True"], done.stderr[-2000:]
