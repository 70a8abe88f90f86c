"""The one registry of parts: every loss, pooling, head and model loader says here, beside its own class, what it is.

    @part("pooling", "cls", serves=ENCODERS, why_not="the first token of a decoder has seen nothing of the sentence")
    class CLSPooling(Pooling): ...

A config names a part by its registry name (`pooling: {name: cls, mlp: train}`): files can name only
registered parts, and a name is looked up here, never imported. The declaration holds the facts that
used to live in tables far from the part: which backbones it serves (and why not the others), how it
exports, how a loader's position limit is read. A package's parts register when the package is
imported (`import_parts`: every module of the package, so a new file is found without editing a list), and a
kind's package is imported when the kind is first looked up (`KIND_PACKAGES`).
Parts of your own register from Python the same way (`register_part`) before you build.
"""

from __future__ import annotations

import importlib
import pkgutil
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from sentemb.common.errors import SentembConfigError

# each kind of part and the package whose modules declare its parts, imported when the kind is first looked up
# (`registered`): a part is found wherever a config names it (a checkpoint loaded in a fresh process too), and a new
# module of the package registers without an import added anywhere
KIND_PACKAGES = {
    "loss": "sentemb.losses",
    "pooling": "sentemb.encoders.poolings",
    "head": "sentemb.encoders.heads",
    "model.backbone": "sentemb.encoders.models",
    "model.tokenizer": "sentemb.encoders.models",
    "negatives": "sentemb.training.negatives",
    "auxiliary": "sentemb.training.auxiliary",
    "data.set": "sentemb.data.sets",  # where labelled rows come from (data.source): a file, or a built-in set
    "data.format": "sentemb.data.formats",  # a labelled file's format, picked by its extension
    "data.view": "sentemb.data.view_makers",  # the makers of the extra views training parts ask for, by role
}
KINDS = tuple(KIND_PACKAGES)
ENCODERS, DECODERS, BOTH = "encoders", "decoders", "both"
# how a pooling or head leaves in an exported folder: sentence-transformers' own modules (no sentemb needed to load),
# sentemb's module (sentemb_config.json), or left out because it only trains (the folder embeds with its pooling)
NATIVE, SENTEMB, TRAINS_ONLY = "native", "sentemb", "trains_only"


@dataclass(frozen=True)
class Part:
    """What a part declares about itself; `build` is its class or loader function."""

    kind: str
    name: str
    declared: Callable[..., Any]  # the class or loader as registered
    serves: str = BOTH  # ENCODERS, DECODERS or BOTH: the backbones it works with
    why_not: str = ""  # why it cannot serve the other backbones (said when refused)
    export: str = SENTEMB  # NATIVE, SENTEMB or TRAINS_ONLY (poolings and heads)
    positions: Callable[..., int | None] | None = None  # a backbone loader's position limit from its options alone
    # the settings it runs only beside (overrides, e.g. a scored loss's scored data): what a run must add to pick it
    companions: tuple[str, ...] = ()

    @property
    def build(self) -> Callable[..., Any]:
        """Its class or loader, looked up in its module when used (a test's monkeypatch of a loader is seen)."""
        module = sys.modules.get(self.declared.__module__)
        return getattr(module, self.declared.__qualname__, self.declared)

    @property
    def path(self) -> str:
        """Its Python path, as configs written before registry names named it (`_target_`)."""
        return f"{self.declared.__module__}.{self.declared.__qualname__}"

    def fits(self, decoder: bool) -> bool:
        """Whether it serves a decoder LLM (`decoder`) or an encoder."""
        return self.serves == BOTH or self.serves == (DECODERS if decoder else ENCODERS)


REGISTRY: dict[str, dict[str, Part]] = {kind: {} for kind in KINDS}


def check_kind(kind: str) -> None:
    if kind not in REGISTRY:
        raise SentembConfigError(f"{kind!r} is not a part kind. Fix: one of {', '.join(KINDS)}")


def registered(kind: str) -> dict[str, Part]:
    """The `kind` parts by name, once the kind's package (`KIND_PACKAGES`, sentemb's own: never a name read from a
    file) has been imported, so its every module has registered."""
    check_kind(kind)
    importlib.import_module(KIND_PACKAGES[kind])  # Python's module cache: imported once
    return REGISTRY[kind]


def register_part(
    kind: str,
    build: Any,
    name: str | None = None,
    serves: str = BOTH,
    why_not: str = "",
    export: str = SENTEMB,
    positions: Callable[..., int | None] | None = None,
    companions: tuple[str, ...] = (),
) -> str:
    """Lets configs name `build` (a class or loader of your own) as a `kind` part, by `name` (default: its Python
    name), with the facts of `Part`. Call it before building. Returns the name configs use.

    The older form `register_part(kind, module, attribute)` registers `module.attribute` under its attribute name."""
    check_kind(kind)
    if isinstance(build, ModuleType):  # register_part("pooling", my_module, "MyPooling")
        build = getattr(build, str(name))
    if serves not in (ENCODERS, DECODERS, BOTH) or export not in (NATIVE, SENTEMB, TRAINS_ONLY):
        raise SentembConfigError(
            f"register_part({kind!r}, {name!r}): serves={serves!r}, export={export!r}. Fix: serves one of "
            f"{ENCODERS}, {DECODERS}, {BOTH}; export one of {NATIVE}, {SENTEMB}, {TRAINS_ONLY}"
        )
    name = name or build.__name__
    entry = Part(kind, name, build, serves, why_not, export, positions, tuple(companions))
    existing = REGISTRY[kind].get(name)
    if existing is not None and existing.path != entry.path:
        raise SentembConfigError(f"register_part: {kind} name {name!r} is taken by {existing.path}. Fix: another name")
    REGISTRY[kind][name] = entry
    if isinstance(build, type):  # an instance can say what it is (`declared_part`)
        build.sentemb_part = entry
    return name


def part(kind: str, name: str, **declared: Any) -> Callable[[Any], Any]:
    """Class or function decorator: `register_part(kind, it, name, **declared)`."""

    def register(build: Any) -> Any:
        register_part(kind, build, name, **declared)
        return build

    return register


def lookup(kind: str, name: Any) -> Part:
    """The registered `kind` part called `name`, else refused naming the key and the names it may be."""
    found = registered(kind).get(name) if isinstance(name, str) else None
    if found is None:
        raise unknown_part(kind, "name", name)
    return found


def plain_value(value: Any) -> bool:
    """A JSON-like value with no `_target_` anywhere inside (nothing in it names code to build)."""
    if isinstance(value, dict):
        return "_target_" not in value and all(isinstance(k, str) and plain_value(v) for k, v in value.items())
    if isinstance(value, list | tuple):
        return all(plain_value(v) for v in value)
    return value is None or isinstance(value, str | int | float | bool)


@dataclass(frozen=True)
class PartConfig:
    """A checked part config: its registry entry and its plain options."""

    entry: Part
    options: dict[str, Any]

    @property
    def name(self) -> str:
        return self.entry.name

    def build(self, **extra: Any) -> Any:
        """The part, called with its options and `extra`; an option it does not take is named with the fix."""
        try:
            return self.entry.build(**self.options, **extra)
        except TypeError as err:  # an option the class does not take: named, as Hydra's instantiate would not
            fix = "Fix: remove the option or correct its name"
            raise SentembConfigError(f"{self.entry.kind}={self.name}: {err}. {fix}") from None


def part_config(kind: str, node: Any) -> PartConfig:
    """A `kind` part config with today's registry names (`{name: <registered name>, option: value, ...}`) as a
    `PartConfig`, else refused naming the key and the names it may be. Nothing is built or imported."""
    entry = lookup(kind, node.get("name") if isinstance(node, dict) else None)
    options = {name: value for name, value in node.items() if name != "name"}
    odd = [name for name, value in options.items() if name.startswith("_") or not plain_value(value)]
    if odd:
        raise SentembConfigError(
            f"{kind}.{odd[0]}: sentemb builds {kind} parts from plain options only (no `_` keys, no nested "
            f"`_target_`): refused, nothing was run. Fix: remove {kind}.{odd[0]}"
        )
    return PartConfig(entry, options)


def unknown_part(kind: str, key: str, value: Any) -> SentembConfigError:
    """The refusal of a `kind` part config whose `key` (its name, or an old `_target_`) names no registered part."""
    return SentembConfigError(
        f"{kind}.{key}={value!r} is not one of sentemb's {kind} parts ({', '.join(sorted(registered(kind)))}): "
        f"refused, nothing was imported or run. Fix: one of those names (conf/{kind.split('.')[0]}/ has a config "
        f"for each); a part of your own is a class with @part({kind!r}, <name>) in a module sentemb imports "
        "(docs/layout.md: adding a part), or sentemb.common.parts.register_part from your own script"
    )


def named_by_path(kind: str, target: str) -> str | None:
    """The registry name of the `kind` part an old config's `_target_` path named: the registered part with that exact
    path, or a sentemb part whose class or loader has that Python name (sentemb's modules have moved over time; a
    path is matched against the registry, never imported). None: no registered part."""
    for entry in registered(kind).values():
        if entry.path == target:
            return entry.name
    if not target.startswith("sentemb."):
        return None
    leaf = target.rsplit(".", 1)[-1]
    return next(
        (
            e.name
            for e in registered(kind).values()
            if e.build.__module__.startswith("sentemb.") and e.build.__name__ == leaf
        ),
        None,
    )


def declared_part(obj: Any) -> Part | None:
    """The declaration of the class `obj` is an instance of (its own, not one inherited from a registered parent)."""
    return vars(type(obj)).get("sentemb_part")


def names(kind: str, where: Callable[[Part], bool] = lambda _: True) -> list[str]:
    """The registered names of `kind` (those `where` keeps), sorted."""
    return sorted(name for name, entry in registered(kind).items() if where(entry))


def import_parts(package: str, path: Iterable[str]) -> None:
    """Imports every module of `package` (its `__path__`), so the parts they declare register; a module whose name
    starts with `_` is left alone. Only the package's own files are imported, never a name read from a config."""
    for module in pkgutil.iter_modules(path):
        if not module.name.startswith("_"):
            importlib.import_module(f"{package}.{module.name}")
