"""Nothing a file names runs: checkpoints are read weights-only after one check, parts come from sentemb's registry.

Each payload below would create a folder if anything ran it; every test asserts that folder does not exist.
The checkpoints are small hand-made ones (sentemb's own layout), so every refusal here takes well under a second.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from sentemb.common.errors import SentembConfigError
from sentemb.common.hydra_plumbing import compose_config, resolved_container
from sentemb.common.paths import CONF_DIR
from sentemb.encoders.build import load_checkpoint_encoder
from sentemb.encoders.checkpoint import read_checkpoint
from sentemb.eval.suite import evaluate
from sentemb.export import export
from sentemb.runs.record import write_record
from sentemb.st_modules import SentembEncoder
from sentemb.train import train
from tests.conftest import compose_train, tree

pytestmark = pytest.mark.usefixtures("forbid_model_loading")


class Payload:
    """Unpickling this calls os.makedirs(folder): the proof that a loader ran a file's code."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder

    def __reduce__(self):
        return os.makedirs, (str(self.folder),)


def sentemb_checkpoint(path: Path, model: str | dict = "tiny", pooling: str | dict = "cls") -> Path:
    """A checkpoint in sentemb.train's layout (Lightning's keys, SentembModule's hyper-parameters), weights-only;
    `model` / `pooling`: a config option's name, or the config itself."""
    picks = [f"{key}={value}" for key, value in (("model", model), ("pooling", pooling)) if isinstance(value, str)]
    cfg = compose_train(picks)
    parts = {key: resolved_container(cfg[key]) for key in ("model", "pooling", "loss", "optimizer", "scheduler")}
    parts.update({key: value for key, value in (("model", model), ("pooling", pooling)) if isinstance(value, dict)})
    checkpoint = {
        "epoch": 0,
        "global_step": 2,
        "pytorch-lightning_version": "2.6.0",
        # as many weight bytes as the tiny model's layers need at least (a checkpoint whose config declares more
        # parameters than its weights hold is refused before its model is built)
        "state_dict": {"encoder.backbone.embeddings.word_embeddings.weight": torch.full((64, 64), 7.0)},
        "hyper_parameters": {**parts, "head": None},
    }
    torch.save(checkpoint, path)
    return path


def evil_pickle(path: Path, payload: Path) -> Path:
    torch.save({"state_dict": {}, "hyper_parameters": Payload(payload)}, path)
    return path


def compose_eval(overrides: list[str], tmp_path: Path):
    return compose_config(CONF_DIR, "eval", overrides, tmp_path / "eval")


# every way a checkpoint reaches sentemb: evaluate, export, train's ckpt_path, and the encoder loader itself
def through_evaluate(checkpoint: Path, tmp_path: Path, extra: tuple[str, ...] = ()) -> None:
    evaluate(compose_eval([f"checkpoint={checkpoint}", "tasks=[STS12]", *extra], tmp_path), tmp_path / "eval")


def through_export(checkpoint: Path, tmp_path: Path, extra: tuple[str, ...] = ()) -> None:
    export(compose_config(CONF_DIR, "export", [f"checkpoint={checkpoint}", f"out={tmp_path / 'st'}", *extra]))


def through_train(checkpoint: Path, tmp_path: Path, extra: tuple[str, ...] = ()) -> None:
    train(compose_train(["model=tiny", "logger=csv", f"ckpt_path={checkpoint}", *extra], output_dir=tmp_path))


def through_loader(checkpoint: Path, tmp_path: Path, extra: tuple[str, ...] = ()) -> None:
    load_checkpoint_encoder(checkpoint)


def through_dclr_complementary(checkpoint: Path, tmp_path: Path, extra: tuple[str, ...] = ()) -> None:
    # DCLR's complementary model may be a sentemb checkpoint: read by the same reader, before any model is built
    overrides = ["model=tiny", "logger=csv", "negatives=dclr", f"negatives.complementary={checkpoint}", *extra]
    train(compose_train(overrides, output_dir=tmp_path))


ENTRY_POINTS = [through_evaluate, through_export, through_train, through_loader, through_dclr_complementary]


@pytest.mark.parametrize("entry", ENTRY_POINTS, ids=lambda f: f.__name__)
def test_a_pickle_that_calls_code_is_refused_and_nothing_runs(entry, tmp_path):
    payload = tmp_path / "pwned"
    checkpoint = evil_pickle(tmp_path / "evil.ckpt", payload)
    with pytest.raises(SentembConfigError) as err:
        entry(checkpoint, tmp_path)
    assert not payload.exists(), "the checkpoint's pickle ran"
    assert str(checkpoint) in str(err.value) and "Nothing in it was run" in str(err.value)
    assert "it names os.makedirs" in str(err.value) and "weights_only` set to `False`" not in str(err.value)


@pytest.mark.parametrize("entry", ENTRY_POINTS, ids=lambda f: f.__name__)
def test_a_target_in_a_checkpoints_config_is_refused_and_nothing_runs(entry, tmp_path):
    # weights-only loadable (plain strings), but its pooling config names os.makedirs, nested as Hydra would build it
    payload = tmp_path / "pwned"
    pooling = {
        "_target_": "sentemb.encoders.pooling.CLSPooling",
        "mlp": {"_target_": "os.makedirs", "name": str(payload)},
    }
    checkpoint = sentemb_checkpoint(tmp_path / "evil.ckpt", pooling=pooling)
    with pytest.raises(SentembConfigError) as err:
        entry(checkpoint, tmp_path)
    assert not payload.exists(), "a _target_ from the checkpoint was built"
    assert "pooling.mlp" in str(err.value)


def test_a_top_level_target_outside_sentembs_parts_is_refused(tmp_path):
    payload = tmp_path / "pwned"
    backbone = {"_target_": "os.makedirs", "name": str(payload)}
    model = {**resolved_container(compose_train(["model=tiny"]).model), "backbone": backbone}
    checkpoint = sentemb_checkpoint(tmp_path / "evil.ckpt", model=model)
    with pytest.raises(SentembConfigError, match=r"model\.backbone\._target_='os\.makedirs' is not one of sentemb's"):
        load_checkpoint_encoder(checkpoint)
    assert not payload.exists()


def test_an_exported_folders_json_naming_code_is_refused_before_anything_loads(tmp_path):
    payload = tmp_path / "pwned"
    folder = tmp_path / "st"
    folder.mkdir()
    pooling = {
        "_target_": "sentemb.encoders.pooling.PromptPooling",
        "mlp": {"_target_": "os.makedirs", "name": "x"},
    }
    (folder / "sentemb_config.json").write_text(json.dumps({"pooling": pooling, "head": None}))
    with pytest.raises(SentembConfigError) as err:
        SentembEncoder.load(str(folder))
    assert str(folder / "sentemb_config.json") in str(err.value) and "pooling.mlp" in str(err.value)
    (folder / "sentemb_config.json").write_text(
        json.dumps({"pooling": {"_target_": "os.makedirs", "name": str(payload)}})
    )
    with pytest.raises(SentembConfigError, match="is not one of sentemb's pooling parts"):
        SentembEncoder.load(str(folder))
    assert not payload.exists()


def truncated(path: Path) -> Path:
    sentemb_checkpoint(path)
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    return path


def text_file(path: Path) -> Path:
    path.write_text("not a checkpoint\n")
    return path


def plain_state_dict(path: Path) -> Path:
    torch.save({"weight": torch.zeros(3)}, path)
    return path


def failing_its_crc(path: Path) -> Path:
    # one byte of the stored tensor (7.0 = 00 00 e0 40) changed: the zip's CRC of that member no longer holds
    data = bytearray(sentemb_checkpoint(path).read_bytes())
    at = data.index(bytes.fromhex("0000e040") * 4)
    data[at + 2] = 0xE1
    path.write_bytes(bytes(data))
    return path


def missing(path: Path) -> Path:
    return path


BROKEN = {
    truncated: "is truncated or corrupt",
    text_file: "is not a checkpoint: it is a text file",  # said as what it is, not as a truncated checkpoint
    failing_its_crc: "fails its CRC check",
    plain_state_dict: "is not a sentemb training checkpoint",
    missing: "no such checkpoint file",
}


@pytest.mark.parametrize("entry", ENTRY_POINTS, ids=lambda f: f.__name__)
@pytest.mark.parametrize("broken", BROKEN, ids=lambda f: f.__name__)
def test_a_broken_checkpoint_is_refused_naming_the_file_and_the_fix(broken, entry, tmp_path):
    checkpoint = broken(tmp_path / "model.ckpt")
    with pytest.raises(SentembConfigError) as err:
        entry(checkpoint, tmp_path)
    message = str(err.value)
    assert str(checkpoint) in message and BROKEN[broken] in message and "Fix:" in message
    # training afresh fixes a resume only (issue 51, finding 18: a DCLR complementary model was told to)
    assert ("train afresh" in message) == (broken in (truncated, failing_its_crc) and entry is through_train)


def test_the_crc_check_reads_no_pickle_and_a_whole_checkpoint_passes(tmp_path):
    checkpoint = read_checkpoint(sentemb_checkpoint(tmp_path / "ok.ckpt"), mmap=True)
    assert checkpoint["hyper_parameters"]["pooling"]["name"] == "cls"


def test_resuming_a_checkpoint_of_another_model_is_refused_before_the_corpus_is_read(tmp_path):
    checkpoint = sentemb_checkpoint(tmp_path / "bert.ckpt", model="tiny")
    with pytest.raises(SentembConfigError) as err:
        through_train(checkpoint, tmp_path, ("model=tiny-roberta", f"data.corpus={tmp_path}/never_read.txt"))
    message = str(err.value)
    assert f"ckpt_path={checkpoint} was trained with another model" in message
    assert "backbone.name: 'tiny_bert' -> 'tiny_roberta'" in message
    assert "Fix: resume with the run's own model=" in message


def test_resuming_with_another_pooling_is_refused(tmp_path):
    checkpoint = sentemb_checkpoint(tmp_path / "cls.ckpt", pooling="cls")
    with pytest.raises(SentembConfigError, match=r"was trained with another pooling .*name: 'cls' -> 'mean'"):
        through_train(checkpoint, tmp_path, ("pooling=mean",))


@pytest.mark.parametrize("entry", [through_evaluate, through_export], ids=lambda f: f.__name__)
@pytest.mark.parametrize("override", ["pooling=mean", "pooling.mlp=always", "model=tiny-roberta"])
def test_serving_a_checkpoint_with_other_parts_is_refused(override, entry, tmp_path):
    checkpoint = sentemb_checkpoint(tmp_path / "cls.ckpt", pooling="cls")
    with pytest.raises(SentembConfigError) as err:
        entry(checkpoint, tmp_path, (override,))
    part = override.split("=")[0].split(".")[0]
    assert f"checkpoint={checkpoint} was trained with another {part}" in str(err.value)
    assert "Fix: drop the model= / pooling= / head= overrides" in str(err.value)


def test_the_same_parts_as_the_checkpoint_may_be_named(tmp_path, monkeypatch):
    # pooling=cls on a CLS checkpoint is no contradiction: the checks pass and the (forbidden) model load is reached
    checkpoint = sentemb_checkpoint(tmp_path / "cls.ckpt", pooling="cls")
    with pytest.raises(AssertionError, match="a model was loaded"):
        through_evaluate(checkpoint, tmp_path, ("pooling=cls", "model=tiny"))


def test_export_refuses_an_out_that_is_a_file(tmp_path):
    out = tmp_path / "model.txt"
    out.write_text("keep")
    with pytest.raises(SentembConfigError, match=r"out=.*model\.txt is a file, not a folder"):
        export(compose_config(CONF_DIR, "export", ["model=tiny", f"out={out}"]))
    assert out.read_text() == "keep"


def test_auto_resume_refuses_a_last_checkpoint_that_calls_code_and_changes_nothing(cli, tmp_path):
    # a preempted run's folder whose last.ckpt was replaced: the same command would resume from it
    payload = tmp_path / "pwned"
    run = tmp_path / "run"
    overrides = ["model=tiny", "logger=csv", "trainer.max_steps=2"]
    write_record(run, {"status": "preempted", "message": "", "metrics": {}, "overrides": overrides})
    (run / "checkpoints").mkdir()
    evil_pickle(run / "checkpoints" / "last.ckpt", payload)
    before = tree(run)
    with pytest.raises(SystemExit, match=r"last\.ckpt was refused: it holds objects .*Nothing in it was run"):
        cli([*overrides, f"hydra.run.dir={run}"])
    assert not payload.exists() and tree(run) == before
