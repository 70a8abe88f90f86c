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
from sentemb.losses.base import Objective

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


def declared_loss(config: Mapping[str, Any]) -> type[Objective]:
    """The Objective class a loss config names (`{name: <registered loss>, ...}`); a registered part that is no
    Objective declares nothing of what it reads and takes, so it is refused."""
    name = config.get("name")
    declared = lookup("loss", name).build
    if not (isinstance(declared, type) and issubclass(declared, Objective)):
        raise SentembConfigError(
            f"loss={name} is registered as {getattr(declared, '__name__', declared)!r}, which is no Objective: what a "
            "loss reads and takes is declared on its class. Fix: subclass sentemb.losses.Objective"
        )
    return declared


def negatives_refusal(config: Mapping[str, Any]) -> str | None:
    """Whether the loss a config names (`{name: <registered loss>, field: value, ...}`, e.g. conf/loss/<name>.yaml
    merged) takes extra negatives (a momentum queue): None if it does, else the reason as one sentence.
    Reads the loss's class (`Objective.negatives_refusal`) and the config; builds nothing, loads no model."""
    return declared_loss(config).negatives_refusal(config)


def negatives_losses() -> list[str]:
    """The registered losses of their own (not a wrapper of losses) that take extra negatives with their defaults (a
    negatives' denominator), by name: what a refusal's fix names."""
    return [
        name
        for name in available()
        if not declared_loss({"name": name}).wraps_losses and negatives_refusal(loss_config(name)) is None
    ]


def learning_need(config: Mapping[str, Any]) -> str | None:
    """What the rows must hold for the loss a config names to learn (`Objective.learning_need`: in-batch negatives,
    scores to rank), or None."""
    return declared_loss(config).learning_need(config)


def hard_negative_settings(config: Mapping[str, Any], key: str = "loss") -> list[str]:
    """The loss config's settings that act on labelled hard negatives only and are set (`key.field=value` each)."""
    return declared_loss(config).hard_negative_settings(config, key)


def width_refusal(config: Mapping[str, Any], width: int) -> str | None:
    """Why the loss a config names cannot take embeddings `width` wide (AnglE: an odd width), or None."""
    return declared_loss(config).width_refusal(width)


def loss_reads(config: Mapping[str, Any]) -> frozenset[str]:
    """The roles the loss a config names reads (`Objective.reads_of`: a sum's terms' too), read from the classes."""
    return declared_loss(config).reads_of(config)
