"""`--help` of evaluate and export lists the groups they read, with every option conf/ has (no training groups)."""

from __future__ import annotations

import re

import pytest

from sentemb.common.hydra_plumbing import compose_config
from sentemb.common.paths import CONF_DIR

READS = {"eval": {"model", "pooling"}, "export": {"model", "pooling", "head"}}


@pytest.mark.parametrize(("command", "groups"), READS.items())
def test_help_lists_the_groups_the_command_reads_with_all_their_options(command, groups):
    template = compose_config(CONF_DIR, command, []).hydra.help.template
    section = template.split("== Config groups", 1)[1].split("==", 2)[1]
    listed = dict(re.findall(r"^(\w+): (.+)$", section, flags=re.MULTILINE))
    assert set(listed) == groups, "only the groups this command reads"
    for group in groups:
        options = sorted(path.stem for path in (CONF_DIR / group).glob("*.yaml"))
        assert listed[group].split(", ") == options, f"{command} --help: {group} options differ from conf/{group}/"
