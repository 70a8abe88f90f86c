"""The command line, checked before Hydra parses it: what Hydra's override grammar would refuse with a lexer error,
and a preset named as it was before the presets moved into folders.

Hydra's grammar takes non-ASCII characters (an accented folder name, a non-Latin path) only inside quoted
values; unquoted, its refusal (`LexerNoViableAltException`) names neither the reason nor the fix. A preset's old
flat name (`experiment=sncse_tiny`) would get Hydra's list of every preset; it gets its new name instead.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from sentemb.common.paths import CONF_DIR

# Hydra's flags whose value is the next argument (a path, not an override)
FLAGS_WITH_VALUE = ("--config-path", "-cp", "--config-name", "-cn", "--config-dir", "-cd", "--experimental-rerun")
PRESETS = CONF_DIR / "experiment"
GROUPED = "presets are grouped in folders by the paper they reproduce: docs/objectives.md#paper-presets-experiment"
Check = Callable[[Sequence[str]], str | None]
Entry = Callable[..., Any]


def unquoted_non_ascii(argv: Sequence[str]) -> str | None:
    """Why an override holding non-ASCII characters is one Hydra's grammar refuses, with the fix; None if none is
    (quoted ones, in lists and dicts too, parse: Hydra's own parser decides)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import OverrideParseException

    flag_values = {i + 1 for i, arg in enumerate(argv) if arg in FLAGS_WITH_VALUE}
    for index, arg in enumerate(argv):
        if arg.isascii() or arg.startswith("-") or index in flag_values:
            continue
        try:
            OverridesParser.create().parse_overrides([arg])
            continue
        except OverrideParseException:
            pass
        key, _, value = arg.partition("=")
        odd = next(ch for ch in arg if not ch.isascii())
        return (
            f"{arg}: Hydra's override grammar reads non-ASCII characters (here {odd!r}) only inside quotes. "
            f"Fix: quote the value, e.g. \"{key}='{value}'\" in a shell"
        )
    return None


def preset_names(folder: Path = PRESETS) -> list[str]:
    """Every preset as `experiment=` names it: its YAML file's path under conf/experiment/ (`sncse/tiny`)."""
    return sorted(path.relative_to(folder).with_suffix("").as_posix() for path in folder.rglob("*.yaml"))


def moved_to(old: str, folder: Path = PRESETS) -> str | None:
    """The preset a name from before the folders is now, by their naming rule: `<folder>/<name>` was
    `<folder>_<name>` (`sncse/tiny`: `sncse_tiny`), or `<name>` where it did not begin with its folder's name
    (`labelled/cosent_minilm`: `cosent_minilm`); None unless exactly one preset answers (a name no preset had)."""
    presets = preset_names(folder)
    prefixed = [name for name in presets if name.replace("/", "_", 1) == old]
    kept = [name for name in presets if name.partition("/")[2] == old]
    found = prefixed or kept  # `sncse_tiny` is sncse/tiny, not hicl/sncse_tiny (hicl_sncse_tiny before)
    return found[0] if len(found) == 1 else None


def experiment_values(arg: str) -> list[str]:
    """The presets an `experiment=` override names: its value, or each of a sweep's (`-m experiment=a,b`); [] for a
    glob, a range or an override Hydra's grammar refuses (Hydra answers those)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.core.override_parser.types import ChoiceSweep
    from hydra.errors import OverrideParseException

    try:
        value = OverridesParser.create().parse_overrides([arg])[0].value()
    except OverrideParseException:
        return []
    values = value.list if isinstance(value, ChoiceSweep) else [value]
    return [str(v) for v in values if isinstance(v, str)]


def new_names(names: Sequence[str], folder: Path = PRESETS) -> dict[str, str]:
    """Each of `names` that is no preset now but was one before the folders: its new name."""
    answers = {name: moved_to(name, folder) for name in names if not (folder / f"{name}.yaml").is_file()}
    return {old: new for old, new in answers.items() if new}


def moved_presets(argv: Sequence[str], folder: Path = PRESETS) -> str | None:
    """An `experiment=` naming a preset as it was before the presets moved into folders, with its new name and the
    fixed override; None if none does (a name that was never a preset: Hydra lists the presets)."""
    for arg in argv:
        key = arg.partition("=")[0]
        if key.lstrip("+~") != "experiment":  # only experiment= is parsed: the check costs nothing otherwise
            continue
        names = experiment_values(arg)
        moved = new_names(names, folder)
        if moved:
            said = ", ".join(f"experiment={old} is now experiment={new}" for old, new in moved.items())
            fixed = ",".join(moved.get(name, name) for name in names)
            where = "" if len(names) == 1 else f"{arg}: "  # a sweep: which of its presets moved
            return f"{where}{said} ({GROUPED}). Fix: {key}={fixed}"
    return None


def command_line_checks(*checks: Check) -> Callable[[Entry], Entry]:
    """A decorator for a Hydra main that, called as a command (no arguments: Hydra reads sys.argv), first exits with
    the first problem `checks` find in the command line, each answer naming its fix."""

    def decorate(entry: Entry) -> Entry:
        @functools.wraps(entry)
        def run(*args: Any, **kwargs: Any) -> Any:
            argv = sys.argv[1:]
            problem = None if args or kwargs else next((p for check in checks if (p := check(argv))), None)
            if problem:
                sys.exit(f"sentemb: {problem}")
            return entry(*args, **kwargs)

        return run

    return decorate


# every command: an override Hydra's grammar would refuse without naming the fix
checked_command_line = command_line_checks(unquoted_non_ascii)
# train, the one command with presets (conf/experiment/): also a preset's name from before the folders
checked_train_command_line = command_line_checks(unquoted_non_ascii, moved_presets)
