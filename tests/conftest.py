"""Shared fixtures: composing the real Hydra configs, a small corpus, the shared data root."""

from __future__ import annotations

import hashlib
import importlib.util
import logging
import os
import random
import sys
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest
import torch
from hydra.core.global_hydra import GlobalHydra
from omegaconf import DictConfig

from sentemb.common.hydra_plumbing import compose_config
from sentemb.common.paths import CONF_DIR, resolve_data_root
from sentemb.common.process import configure_process


def pytest_configure(config: pytest.Config) -> None:
    configure_process()  # the library runs under the settings every command makes (warning filters, Agg)
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))  # set in each worker by pytest-xdist
    if workers > 1:
        # the cores shared out: two workers x two torch threads on two cores spin in OpenMP's barriers (~10x slower)
        threads = max(1, len(os.sched_getaffinity(0)) // workers)
        torch.set_num_threads(threads)
        os.environ["OMP_NUM_THREADS"] = str(threads)  # the commands a test runs in a subprocess share them too


@pytest.fixture(autouse=True)
def restore_random_state():
    """A test seeds torch's, numpy's and Python's generators as it needs (process-wide state): the next test finds
    them as this one found them."""
    states = random.getstate(), np.random.get_state(), torch.random.get_rng_state()
    yield
    random.setstate(states[0])
    np.random.set_state(states[1])
    torch.random.set_rng_state(states[2])


@pytest.fixture(scope="session")
def data_root() -> Path:
    return resolve_data_root()


def compose_train(overrides: list[str], output_dir: Path | None = None) -> DictConfig:
    """conf/train.yaml with `overrides`, as `python -m sentemb.train` would compose it."""
    return compose_config(CONF_DIR, "train", overrides, output_dir)


def write_small_corpus(folder: Path, data_root: Path) -> Path:
    """The first 300 sentences of the wiki sample, with two blank lines mixed in, as <folder>/corpus.txt."""
    lines = (data_root / "wiki" / "wiki1m_head.txt").read_text(encoding="utf-8").splitlines()[:300]
    lines[10:10] = ["", "   "]
    path = folder / "corpus.txt"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def write_small_stsb(folder: Path, data_root: Path) -> Path:
    """The first 200 pairs of STS-B dev and test in <folder>/stsb."""
    source = data_root / "senteval" / "downstream" / "STS" / "STSBenchmark"
    stsb = folder / "stsb"
    stsb.mkdir()
    for split in ("dev", "test"):
        lines = (source / f"sts-{split}.csv").read_text(encoding="utf-8").splitlines(keepends=True)[:200]
        (stsb / f"sts-{split}.csv").write_text("".join(lines), encoding="utf-8")
    return stsb


def tiny_job(corpus: Path, stsb: Path) -> list[str]:
    """A seconds-long training job: tiny BERT, `corpus`, CSV logs, dev evaluation every 2 steps on `stsb`'s 200 pairs
    of STS-B dev (and the final test on its 200 of STS-B test): scoring the full sets was most of such a run's time."""
    return [
        "model=tiny",
        "logger=csv",
        f"data.corpus={corpus}",
        f"eval.stsb_dir={stsb}",
        "data.batch_size=16",
        "trainer.max_steps=4",
        "eval.every_n_steps=2",
        "eval.at_start=false",
        "trainer.log_every_n_steps=1",
    ]


@pytest.fixture
def small_corpus(tmp_path: Path, data_root: Path) -> Path:
    """The first 300 sentences of the wiki sample, with two blank lines mixed in."""
    return write_small_corpus(tmp_path, data_root)


@pytest.fixture
def tiny_overrides(small_corpus: Path, small_stsb: Path) -> list[str]:
    """`tiny_job` on this test's small corpus and small STS-B."""
    return tiny_job(small_corpus, small_stsb)


@pytest.fixture
def small_stsb(tmp_path: Path, data_root: Path) -> Path:
    """The first 200 pairs of STS-B dev and test: for runs that score dev often, not for the scores themselves."""
    return write_small_stsb(tmp_path, data_root)


@pytest.fixture
def forbid_model_loading(monkeypatch):
    """Any backbone or tokenizer load fails the test: bad input must be reported before one."""

    def loaded(*args, **kwargs):
        raise AssertionError("a model was loaded before the bad input was reported")

    import sentemb.encoders.models.backbones

    for loader in (
        "tiny_bert",
        "tiny_roberta",
        "pretrained_backbone",
        "pretrained_tokenizer",
        "tiny_roberta_tokenizer",
    ):
        monkeypatch.setattr(sentemb.encoders.models.backbones, loader, loaded)


def tree(root: Path) -> dict[str, str]:
    """Every folder and file under `root` (relative path → sha256 of a file's bytes, "dir" for a folder)."""
    return {
        str(p.relative_to(root)): "dir" if p.is_dir() else hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
    }


@pytest.fixture
def fake_training(monkeypatch):
    """`train` replaced by one log line and a metric: the job around it (lock, restart plan, files, record) is real."""
    import sentemb.train
    from sentemb.common.metric_names import DEV_SPEARMAN_BEST_LOGGED

    def train(cfg, before_build=None):
        logging.getLogger("sentemb.train").info("training %s", cfg.trainer.max_steps)
        return {DEV_SPEARMAN_BEST_LOGGED: 0.25}

    monkeypatch.setattr(sentemb.train, "train", train)


@pytest.fixture
def command(monkeypatch):
    """`run("evaluate", overrides)`: `python -m sentemb.<command> <overrides>` in this process (its Hydra app); the
    logging Hydra configures is undone afterwards."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level

    def run(name: str, overrides: list[str]) -> None:
        GlobalHydra.instance().clear()  # a test before may have composed a config
        monkeypatch.setattr(sys, "argv", [f"sentemb.{name}", *overrides])
        importlib.import_module(f"sentemb.{name}").main()

    yield run
    GlobalHydra.instance().clear()
    for handler in set(root.handlers) - set(handlers):
        root.removeHandler(handler)
    root.handlers[:] = handlers
    root.setLevel(level)


@pytest.fixture
def cli(command):
    """`python -m sentemb.train <overrides>` in this process (`command`'s train)."""
    return lambda overrides: command("train", overrides)


def load_benchmark(script: str) -> ModuleType:
    """benchmarks/<script>.py imported as a module (benchmarks/ is not a package)."""
    path = Path(__file__).resolve().parents[1] / "benchmarks" / f"{script}.py"
    spec = importlib.util.spec_from_file_location(script, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
