"""A config group's fields against the class it builds, and which options of a group have given fields.

A field the class does not take (e.g. `loss.m` that a sweep sets on a loss without m) otherwise surfaces as a
TypeError from deep inside Hydra's instantiate, without the key's group option or a fix.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from omegaconf import DictConfig, OmegaConf

from sentemb.common.errors import SentembConfigError
from sentemb.common.paths import CONF_DIR


def check_fields(node: DictConfig, group: str, builds: Callable[..., Any], option: str | None = None) -> None:
    """Every field of a `group` config is a parameter of `builds`, the class or loader it names (a stray one, e.g. a
    sweep's `loss.m` on a loss without m, would otherwise surface as a TypeError from inside the constructor)."""
    parameters = inspect.signature(builds).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()):
        return
    fields = [str(key) for key in node if not str(key).startswith("_") and key != "name"]
    stray = [key for key in fields if key not in parameters]
    if stray:
        name = f"{group}={option}" if option else group
        takes = ", ".join(k for k, p in parameters.items() if p.kind is p.POSITIONAL_OR_KEYWORD and k != "self")
        raise SentembConfigError(
            f"{', '.join(f'{group}.{key}' for key in stray)}: {name} ({builds.__name__}) has no such "
            f"field (it takes {takes}). Fix: {pick_advice(group, fields)}, or drop "
            f"{' '.join(f'~{group}.{key}' for key in stray)}"
        )


def options_with(group: str, fields: list[str]) -> list[str]:
    """The `conf/<group>/` options whose own fields include all of `fields`."""
    return [
        path.stem
        for path in sorted((CONF_DIR / group).glob("*.yaml"))
        if all(field in (OmegaConf.load(path) or {}) for field in fields)
    ]


def pick_advice(group: str, fields: list[str]) -> str:
    """'a loss with m, tau: loss=mmhe / ...' for a fix message, or that no option has them all."""
    found = options_with(group, fields) if (CONF_DIR / group).is_dir() else []
    if not found:
        return f"no {group}= option has all of {', '.join(fields)} (a typo?)"
    return f"a {group} with {', '.join(fields)}: {group}={' / '.join(found)}"


# the keys naming a file or folder to read whose empty value would otherwise read as "not given": `checkpoint=` typed
# with nothing after it would evaluate or export the default, untrained model in its place
GIVEN_PATHS = ("checkpoint", "onnx", "whitening")


def refuse_empty_paths(cfg: DictConfig) -> None:
    """A path key given empty (`checkpoint=`) is refused, naming the key; leaving it out (null) is not given."""
    for key in GIVEN_PATHS:
        value = cfg.get(key)
        if isinstance(value, str) and not value.strip():
            raise SentembConfigError(
                f"{key}= is given empty ({key}={value!r}): it names no file, and an empty value is not read as "
                f"'not given' (the default model would be used in its place). Fix: {key}=<path>, or leave {key}= "
                "out (null)"
            )
