"""Bad input stops before any model is loaded, with an error naming the file/line/key and the fix."""

from __future__ import annotations

from pathlib import Path

import pytest

import sentemb.common.paths
from sentemb.common.errors import SentembConfigError
from sentemb.train import train
from tests.conftest import compose_train

pytestmark = pytest.mark.usefixtures("forbid_model_loading")


def fails(overrides: list[str], tmp_path: Path) -> str:
    with pytest.raises(SentembConfigError) as err:
        train(compose_train(["model=tiny", "logger=csv", *overrides], output_dir=tmp_path))
    return str(err.value)


def test_missing_corpus(tmp_path):
    message = fails([f"data.corpus={tmp_path}/nope.txt"], tmp_path)
    assert "data.corpus" in message and f"{tmp_path}/nope.txt" in message and "make data" in message


def test_missing_configured_data_root(tmp_path):
    message = fails([f"paths.data_dir={tmp_path}/no_such_root"], tmp_path)
    assert "no_such_root" in message and "SENTEMB_DATA" in message


def test_no_data_root_anywhere(tmp_path, monkeypatch):
    monkeypatch.delenv("SENTEMB_DATA", raising=False)
    monkeypatch.setattr(sentemb.common.paths, "data_root_candidates", lambda: [tmp_path / "data"])
    message = fails([], tmp_path)
    assert "No data root found" in message and "SENTEMB_DATA" in message and "make data" in message


def test_empty_corpus(tmp_path):
    corpus = tmp_path / "empty.txt"
    corpus.write_text("\n  \n\n", encoding="utf-8")
    message = fails([f"data.corpus={corpus}"], tmp_path)
    assert str(corpus) in message and "no sentences" in message


def test_non_utf8_line(tmp_path):
    corpus = tmp_path / "latin1.txt"
    corpus.write_bytes("first line\nsecond line\ncaf\xe9 au lait\n".encode("latin-1"))
    message = fails([f"data.corpus={corpus}"], tmp_path)
    assert f"{corpus}:3:" in message and "UTF-8" in message and "iconv" in message


@pytest.mark.parametrize("tau", ["0", "-0.05"])
def test_non_positive_temperature(tau, tmp_path):
    message = fails([f"loss.tau={tau}"], tmp_path)
    assert "loss.tau" in message and "> 0" in message


def test_missing_stsb_files(tmp_path):
    message = fails([f"eval.stsb_dir={tmp_path}/STSBenchmark"], tmp_path)
    assert "sts-dev.csv" in message


def test_cli_reports_unknown_group_value_without_traceback():
    import subprocess
    import sys

    result = subprocess.run([sys.executable, "-m", "sentemb.train", "pooling=nope"], capture_output=True, text=True)
    assert result.returncode != 0
    assert "Could not find 'pooling/nope'" in result.stderr and "Available options in 'pooling'" in result.stderr


def test_cli_reports_config_error_plainly(tmp_path):
    import subprocess
    import sys

    command = [sys.executable, "-m", "sentemb.train", "model=tiny", "loss.tau=0", f"hydra.run.dir={tmp_path}"]
    result = subprocess.run(command, capture_output=True, text=True)
    assert result.returncode == 1
    assert result.stderr.strip().splitlines()[-1].startswith("sentemb: loss.tau=0 must be a number > 0")
    assert "Traceback" not in result.stderr
