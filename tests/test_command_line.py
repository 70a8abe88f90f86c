"""What Hydra's override grammar would refuse without a fix, and a preset's name from before the presets moved into
folders, named first; loader options from closed sets."""

from __future__ import annotations

import pytest

from sentemb.common.command_line import moved_presets, moved_to, preset_names, unquoted_non_ascii
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
    ("old", "new"),
    [
        ("sncse_tiny", "sncse/tiny"),  # not hicl/sncse_tiny, which was hicl_sncse_tiny
        ("hicl_sncse_roberta_large", "hicl/sncse_roberta_large"),
        ("simcse_bert_base", "simcse/bert_base"),
        ("dclr_tiny", "dclr/tiny"),  # not focal/dclr_tiny
        ("focal_dclr_tiny", "focal/dclr_tiny"),
        ("paradigm_table5_barlow_gd", "paradigm/table5_barlow_gd"),
        ("paradigm_reference/bert", "paradigm/reference/bert"),  # the shared recipe moved with its presets
        ("cosent_minilm", "labelled/cosent_minilm"),  # labelled/ kept its presets' names
        ("sup_simcse_bert_base_tiny", "labelled/sup_simcse_bert_base_tiny"),
    ],
)
def test_a_presets_name_from_before_the_folders_is_answered_with_its_new_one(old, new):
    assert moved_to(old) == new
    problem = moved_presets(["model=tiny", f"experiment={old}", "logger=csv"])
    assert problem.startswith(f"experiment={old} is now experiment={new} (presets are grouped in folders by the paper")
    assert problem.endswith(f"Fix: experiment={new}")


def test_every_preset_answers_for_its_flat_name_alone():
    # `<folder>_<name>` names one preset: no two presets would claim the same old name
    for name in preset_names():
        assert moved_to(name.replace("/", "_", 1)) == name


def test_a_sweep_names_the_presets_that_moved_and_the_whole_fixed_sweep():
    problem = moved_presets(["-m", "experiment=sncse_tiny,esimcse/tiny,cosent_minilm_tiny", "seed=1,2"])
    assert problem.startswith(
        "experiment=sncse_tiny,esimcse/tiny,cosent_minilm_tiny: experiment=sncse_tiny is now experiment=sncse/tiny, "
        "experiment=cosent_minilm_tiny is now experiment=labelled/cosent_minilm_tiny ("
    )
    assert problem.endswith("Fix: experiment=sncse/tiny,esimcse/tiny,labelled/cosent_minilm_tiny")


@pytest.mark.parametrize(
    "arg",
    [
        "experiment=sncse/tiny",  # a preset
        "experiment=nosuch",  # never one: Hydra lists the presets
        "experiment=tiny",  # the name of several presets in their folders, and never a preset's: no one answer
        "experiment=glob(sncse_*)",  # a glob: Hydra matches it
        "experiment=null",
        "model=sncse_tiny",  # another group
        "experiment=[unclosed",  # Hydra's grammar refuses it, with its own message
    ],
)
def test_what_is_no_old_preset_name_is_left_to_hydra(arg):
    assert moved_presets([arg]) is None


def test_the_train_command_answers_an_old_preset_name_before_hydra_composes(cli):
    with pytest.raises(SystemExit, match=r"sentemb: experiment=sncse_tiny is now experiment=sncse/tiny .*Fix: "):
        cli(["-m", "experiment=sncse_tiny", "seed=1,2"])


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
