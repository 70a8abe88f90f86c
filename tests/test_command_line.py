"""What Hydra's override grammar would refuse without a fix, named first; loader options from closed sets."""

from __future__ import annotations

import pytest

from sentemb.common.command_line import unquoted_non_ascii
from sentemb.common.errors import SentembConfigError
from sentemb.encoders.models.decoders import check_attention_options


@pytest.mark.parametrize("arg", ["hydra.run.dir=/tmp/héllo", "data.corpus=/data/語料.txt", "loss.tau=0.05,é"])
def test_an_unquoted_non_ascii_override_is_named_with_the_quoted_fix(arg):
    key, _, value = arg.partition("=")
    problem = unquoted_non_ascii(["model=tiny", arg])
    assert problem.startswith(f"{arg}: Hydra's override grammar reads non-ASCII characters")
    assert f"Fix: quote the value, e.g. \"{key}='{value}'\"" in problem


@pytest.mark.parametrize(
    "arg",
    ["hydra.run.dir='/tmp/héllo'", 'data.corpus="/data/語料.txt"', "tasks=['é']", "k={a: 'é'}", "model=tiny", "-m"],
)
def test_quoted_or_ascii_overrides_pass(arg):
    assert unquoted_non_ascii([arg]) is None


def test_a_flags_path_is_no_override():
    assert unquoted_non_ascii(["--config-dir", "/data/é", "model=tiny"]) is None


def test_the_train_command_exits_with_the_fix_before_hydra_parses(cli, tmp_path):
    with pytest.raises(SystemExit, match=r"sentemb: hydra\.run\.dir=.*/héllo: Hydra's override grammar .*Fix: quote"):
        cli(["model=tiny", f"hydra.run.dir={tmp_path}/héllo"])
    assert not (tmp_path / "héllo").exists()


@pytest.mark.parametrize(
    ("attention", "dtype", "key"),
    [
        ("kernels-community/flash-attn", None, "attn_implementation='kernels-community/flash-attn'"),
        (None, "load", "torch_dtype='load'"),
    ],
)
def test_decoder_loader_options_come_from_closed_sets(attention, dtype, key):
    # a hub kernel name would download and run code; a dtype is looked up on torch by name
    with pytest.raises(SentembConfigError, match=rf"model\.backbone\.{key} is not one of .*Fix:"):
        check_attention_options(attention, dtype)


def test_the_encoder_loader_takes_no_keyword_beyond_its_own():
    from sentemb.encoders.models.backbones import pretrained_backbone

    with pytest.raises(TypeError, match="trust_remote_code"):
        pretrained_backbone("bert-base-uncased", trust_remote_code=True)  # refused by Python before any look-up
