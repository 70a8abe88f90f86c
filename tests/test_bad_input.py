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


def test_cli_reports_unknown_group_value_without_traceback(cli, capsys):
    # the command's Hydra main in this process (the subprocess test below covers `python -m` and its exit status)
    with pytest.raises(SystemExit) as exited:
        cli(["pooling=nope"])
    assert exited.value.code != 0
    stderr = capsys.readouterr().err
    assert "Could not find 'pooling/nope'" in stderr and "Available options in 'pooling'" in stderr


def test_cli_reports_config_error_plainly(tmp_path):
    import subprocess
    import sys

    command = [sys.executable, "-m", "sentemb.train", "model=tiny", "loss.tau=0", f"hydra.run.dir={tmp_path}"]
    result = subprocess.run(command, capture_output=True, text=True)
    assert result.returncode == 1
    assert result.stderr.strip().splitlines()[-1].startswith("sentemb: loss.tau=0 must be a number > 0")
    assert "Traceback" not in result.stderr


# issue 51, finding 14: a float hyper-parameter of any part that is inf or nan passed a bare `>= 0` test (inf) and
# ended as "diverged ... Fix: a larger loss.tau"; each is refused by the one check (sentemb.losses.base.require_number)
NOT_FINITE = [
    (["head=diffcse", "pooling.mlp=none"], "head.weight"),
    (["head=diffcse", "pooling.mlp=none"], "head.masking_ratio"),
    (["model=tiny-llama", "pooling=last_token", "head=mntp"], "head.weight"),
    (["model=tiny-llama", "pooling=last_token", "head=mntp"], "head.rate"),
    (["head=sarcse", "pooling=cls", "pooling.mlp=none"], "head.alpha"),
    (["head=sarcse", "pooling=cls", "pooling.mlp=none"], "head.lam"),
    (["pooling=hicl"], "pooling.local_tau"),
    (["pooling=hicl"], "pooling.alpha"),
    (["+pooling.mlp_init_std=0.02"], "pooling.mlp_init_std"),
    (["adapter=lora"], "adapter.alpha"),
    (["negatives=dclr"], "negatives.step_size"),
    (["negatives=dclr"], "negatives.noise_times"),
    (["negatives=dclr", "negatives.ascent_tau=0.05"], "negatives.ascent_tau"),
    ([], "loss.tau"),
    (["loss=sum", "loss.terms={infonce: {weight: 1.0}}"], "loss.terms.infonce.weight"),
]


@pytest.mark.parametrize("value", ["inf", "nan"])
@pytest.mark.parametrize(("part", "key"), NOT_FINITE, ids=lambda item: item if isinstance(item, str) else None)
def test_an_infinite_or_nan_hyper_parameter_is_refused_naming_its_key(part, key, value, tmp_path):
    from sentemb.training.checks import check_parts

    with pytest.raises(SentembConfigError, match=rf"^{key}={value} must be .*Fix: ") as err:
        check_parts(compose_train(["model=tiny", *part, f"{key}={value}"], tmp_path))
    assert "not inf or nan" in str(err.value) or "finite" in str(err.value)


# issue 51, finding 13: sizes a config gives the parts, bounded before anything is allocated
@pytest.mark.parametrize(
    ("overrides", "refusal"),
    [
        (
            ["negatives=dclr", "negatives.noise_times=1e8"],
            r"negatives\.noise_times=100000000.0 must be a number in \[0, 64\]",
        ),
        (
            ["negatives=dclr", "negatives.noise_times=64", "data.batch_size=131072"],  # the largest batch allowed
            r"negatives\.noise_times=64 with data\.batch_size=131072: .* more than this machine allows",
        ),
        (["negatives=dclr", "negatives.ascent_steps=100000000"], r"negatives\.ascent_steps=100000000 must be a whole"),
        (["head=sarcse", "pooling.mlp=none", "head.co_t=100000000"], r"head\.co_t=100000000 must be a whole number"),
        (["adapter=lora", "adapter.r=100000000"], r"adapter\.r=100000000 must be a whole number in \[1, 16384\]"),
        (
            ["model=tiny-llama", "pooling=latent", "pooling.num_latents=100000000"],
            r"pooling\.num_latents=100000000 must be a whole number in \[1, 65536\]",
        ),
    ],
)
def test_a_size_beyond_what_the_machine_holds_is_refused_before_anything_is_allocated(overrides, refusal, tmp_path):
    from sentemb.training.checks import check_parts

    with pytest.raises(SentembConfigError, match=refusal) as err:
        check_parts(compose_train(["model=tiny", *overrides], tmp_path))
    assert "Fix: " in str(err.value)
