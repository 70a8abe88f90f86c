"""benchmarks/checkpoint_write.py (issue 36's `make bench` row): both writers run on the tiny model, and its row."""

from __future__ import annotations

import json
import sys

import torch

from tests.conftest import load_benchmark


def test_the_benchmark_writes_both_checkpoints_and_its_row(monkeypatch, tmp_path, capsys):
    script = load_benchmark("checkpoint_write")
    monkeypatch.setattr(sys.modules["rows"], "RESULTS", tmp_path / "results")
    monkeypatch.setattr(
        sys, "argv", ["checkpoint_write.py", "--model", "tiny", "--rounds", "2", "--out", str(tmp_path)]
    )
    code = script.main()
    (result,) = json.loads((tmp_path / "results" / "checkpoint_write.json").read_text())
    assert result["ratio"] > 0 and result["anchor"] == "Lightning's TorchCheckpointIO"
    assert code == (0 if result["ratio"] <= script.TARGET else 1)  # the verdict follows the measured ratio
    assert "tiny: weights" in capsys.readouterr().out


def test_both_writers_write_the_same_checkpoint(tmp_path):
    script = load_benchmark("checkpoint_write")
    checkpoint = script.checkpoint_of("tiny")
    for name, writer in (("lightning", script.TorchCheckpointIO()), ("atomic", script.AtomicCheckpointIO())):
        writer.save_checkpoint(checkpoint, tmp_path / f"{name}.ckpt")
    plain, atomic = (torch.load(tmp_path / f"{n}.ckpt", weights_only=True) for n in ("lightning", "atomic"))
    assert all(torch.equal(plain["state_dict"][k], atomic["state_dict"][k]) for k in plain["state_dict"])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["atomic.ckpt", "lightning.ckpt"]  # no partial file left
