"""`build(name, **overrides)`: an objective from conf/loss/<name>.yaml, for researchers' own scripts.

    from sentemb.losses import build
    loss = build("mmhe", m=0.3, tau=0.05, r=1.75)
    out = loss(z1, z2)            # out.loss (scalar), out.stats (floats by name, computed when read)

The YAML files are the one source of each loss's defaults, for the CLI and for `build` alike.
`negatives_refusal(config)` says, before anything is built, whether a loss config takes extra
negatives (ESimCSE's momentum queue): None, or the reason it does not.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from omegaconf import DictConfig, OmegaConf

from sentemb.common.errors import SentembConfigError
from sentemb.common.parts import lookup, part_config
from sentemb.common.paths import CONF_DIR

LOSS_CONF_DIR = CONF_DIR / "loss"


def available() -> list[str]:
    """Names accepted by `build` and by `loss=<name>`."""
    return sorted(path.stem for path in LOSS_CONF_DIR.glob("*.yaml"))


def loss_config(name: str, **overrides: Any) -> DictConfig:
    """conf/loss/<name>.yaml with `overrides` merged in; unknown names and keys are config errors."""
    path = LOSS_CONF_DIR / f"{name}.yaml"
    if name not in available():  # a name, never a path (a checkpoint's weighted-sum term names one)
        raise SentembConfigError(f"no loss named {name!r} (looked for {path}). Choose one of: {', '.join(available())}")
    config = OmegaConf.load(path)
    unknown = sorted(set(overrides) - set(config) - {"name"})
    if unknown:
        fields = ", ".join(key for key in config if key != "name")
        raise SentembConfigError(f"{path.name} has no field {', '.join(unknown)}; its fields are: {fields}")
    return OmegaConf.merge(config, overrides)


def build(name: str, **overrides: Any) -> Any:
    """The objective `name` with the defaults of conf/loss/<name>.yaml overridden by `overrides`."""
    return build_loss(OmegaConf.to_container(loss_config(name, **overrides), resolve=True))


def build_loss(config: dict[str, Any]) -> Any:
    """The objective a loss config names (`{name: <registered loss>, field: value, ...}`), built with its fields."""
    return part_config("loss", config).build()


def negatives_refusal(config: Mapping[str, Any]) -> str | None:
    """Whether the loss a config names (`{name: <registered loss>, field: value, ...}`, e.g. conf/loss/<name>.yaml
    merged) takes extra negatives (a momentum queue): None if it does, else the reason as one sentence.
    Reads the loss's class (`Objective.negatives_refusal`) and the config; builds nothing, loads no model."""
    name = config.get("name")
    declared = lookup("loss", name).build
    refusal = getattr(declared, "negatives_refusal", None)
    if refusal is None:  # a registered loader function, not an Objective class
        return f"loss={name} takes no extra negatives: it does not declare them (no negatives_refusal)."
    return refusal(config)


def learning_need(config: Mapping[str, Any]) -> str | None:
    """What the rows must hold for the loss a config names to learn (`Objective.learning_need`: in-batch negatives,
    scores to rank), or None; a registered loader function that is no Objective declares nothing."""
    declared = getattr(lookup("loss", config.get("name")).build, "learning_need", None)
    return None if declared is None else declared(config)


def hard_negative_settings(config: Mapping[str, Any], key: str = "loss") -> list[str]:
    """The loss config's settings that act on labelled hard negatives only and are set (`key.field=value` each)."""
    declared = getattr(lookup("loss", config.get("name")).build, "hard_negative_settings", None)
    return [] if declared is None else declared(config, key)


def width_refusal(config: Mapping[str, Any], width: int) -> str | None:
    """Why the loss a config names cannot take embeddings `width` wide (AnglE: an odd width), or None."""
    declared = getattr(lookup("loss", config.get("name")).build, "width_refusal", None)
    return None if declared is None else declared(width)
