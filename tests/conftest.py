"""Shared fixtures: composing the real Hydra configs, a small corpus, the shared data root."""

from __future__ import annotations

from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, open_dict

import sentemb.config  # noqa: F401  (registers the resolvers conf/ uses)
from sentemb.paths import PROJECT_ROOT, resolve_data_root

CONF_DIR = PROJECT_ROOT / "conf"


@pytest.fixture(scope="session")
def data_root() -> Path:
    return resolve_data_root()


def compose_train(overrides: list[str], output_dir: Path | None = None) -> DictConfig:
    """conf/train.yaml with `overrides`, as `python -m sentemb.train` would compose it."""
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose("train", overrides=overrides, return_hydra_config=True)
    if output_dir is not None:
        with open_dict(cfg):
            cfg.hydra.runtime.output_dir = str(output_dir)
    HydraConfig.instance().set_config(cfg)
    return cfg


@pytest.fixture
def small_corpus(tmp_path: Path, data_root: Path) -> Path:
    """The first 300 sentences of the wiki sample, with two blank lines mixed in."""
    lines = (data_root / "wiki" / "wiki1m_head.txt").read_text(encoding="utf-8").splitlines()[:300]
    lines[10:10] = ["", "   "]
    path = tmp_path / "corpus.txt"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


@pytest.fixture
def tiny_overrides(small_corpus: Path) -> list[str]:
    """A seconds-long training job: tiny BERT, small corpus, CSV logs, dev evaluation every 2 steps."""
    return [
        "model=tiny",
        "logger=csv",
        f"data.corpus={small_corpus}",
        "data.batch_size=16",
        "trainer.max_steps=4",
        "eval.every_n_steps=2",
        "eval.at_start=false",
        "trainer.log_every_n_steps=1",
    ]
