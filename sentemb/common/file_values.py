"""The one rule for every value sentemb reads from a file: data, never code.

Run records (metrics.json), a sweep's winner (from_sweep=), checkpoints' hyper-parameters, exported and
adapter folders' JSON, ONNX recipes and Hydra's saved .hydra/*.yaml all pass through `checked` before
anything uses them. It lets through:
- None, booleans, numbers and strings, and lists and string-keyed dicts of them (nothing else a parser or an
  unpickler could build);
- no interpolation: no string holds `${` (OmegaConf would resolve it: call a resolver, read the environment),
  except in the fields a reader declares opaque text (compared or shown, never put into a config);
- no `_target_` key, except at the nodes a reader names, and there a dotted name only: a part that
  configs written before registry names named by path (matched against the registry, never imported), or the
  record of what a run trained with, never built;
- where a reader knows the keys a node may hold, those only;
- nesting at most `MAX_DEPTH` lists or dicts deep (no file sentemb writes nests deeper than a few levels; a deeper
  one would only exhaust Python's recursion in the parser or the checks);
- strings that are text (`not_text`): no lone surrogate, which a JSON escape (`"\\ud800"`) or a pickled string can
  carry, UTF-8 cannot encode and a tokenizer fails on with no file or key named.
A refusal is a SentembConfigError naming the file, the key and the fix, raised before anything is built.
"""

from __future__ import annotations

import json
import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sentemb.common.errors import SentembConfigError

INTERPOLATION = "${"
TARGET = "_target_"
DOTTED_NAME = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)+")
MAX_DEPTH = 32  # lists and dicts within each other; sentemb's own files nest at most 5 deep
SURROGATE = re.compile("[\ud800-\udfff]")  # half of a UTF-16 pair: in a Python str only by an escape or a pickle
REWRITE = "Fix: restore the file as sentemb wrote it, or write it again with the sentemb command that made it"


@dataclass(frozen=True)
class Shape:
    """What a reader knows of a file's values. Paths are dotted keys (`model.backbone`), "" the top; list items
    share their list's path."""

    keys: Mapping[str, Collection[str]] = field(default_factory=dict)  # node path → the keys it may hold
    targets: Collection[str] = ()  # node paths where a `_target_` (a dotted name) may stand
    text: Collection[str] = ()  # paths of opaque text: `${` allowed (never resolved: compared or shown)


PLAIN = Shape()


def checked(value: Any, source: str | Path, shape: Shape = PLAIN, fix: str = REWRITE) -> Any:
    """`value` itself if it obeys the rule (see the module's docstring), else a SentembConfigError naming `source`
    (the file), the key and `fix`."""
    _check(value, "", shape, lambda key, why: _refuse(source, key, why, fix), 0)
    return value


def _check(value: Any, path: str, shape: Shape, refuse: Any, depth: int) -> None:
    if depth >= MAX_DEPTH and isinstance(value, list | tuple | dict):
        refuse(path, f"nests lists or dicts more than {MAX_DEPTH} deep")
    if value is None or isinstance(value, bool | int | float):
        return
    if isinstance(value, str):
        if INTERPOLATION in value and not _is_text(path, shape):
            refuse(path, f"holds an interpolation ({_clip(value)}), which sentemb never resolves from a file")
        why = not_text(value)
        if why:
            refuse(path, why)
        return
    if isinstance(value, list | tuple):
        for item in value:
            _check(item, path, shape, refuse, depth + 1)
        return
    if isinstance(value, dict):
        _check_node(value, path, shape, refuse, depth + 1)
        return
    refuse(path, f"holds a {type(value).__name__}, not a plain value (null, bool, number, string, list or dict)")


def _check_node(node: dict, path: str, shape: Shape, refuse: Any, depth: int) -> None:
    allowed = shape.keys.get(path)
    for key, item in node.items():
        where = f"{path}.{key}" if path else str(key)
        if not isinstance(key, str):
            refuse(path, f"has a non-string key {key!r}")
        if key == TARGET:
            if path not in shape.targets:
                refuse(where, "names code to build (a `_target_`), which no sentemb file may hold there")
            if not (isinstance(item, str) and DOTTED_NAME.fullmatch(item)):
                refuse(where, f"must be a dotted name (module.Name), not {_clip(item)}")
            continue
        if allowed is not None and key not in allowed:
            refuse(where, f"is not a key sentemb reads there ({', '.join(sorted(allowed))})")
        _check(item, where, shape, refuse, depth)


def not_text(value: str) -> str | None:
    """Why `value` is not text (a lone surrogate, e.g. from the JSON escape `"\\ud800"`: UTF-8 cannot encode it and a
    tokenizer fails on it), or None: what every reader of text from a file checks before a tokenizer sees it."""
    found = SURROGATE.search(value)
    if found is None:
        return None
    return (
        f"holds a lone surrogate (U+{ord(found.group()):04X} at character {found.start()}, half of a UTF-16 pair, "
        "as a JSON escape such as \\ud800 writes it), which is not text"
    )


def _is_text(path: str, shape: Shape) -> bool:
    return any(path == text or path.startswith(f"{text}.") for text in shape.text)


def _clip(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _refuse(source: str | Path, key: str, why: str, fix: str) -> None:
    raise SentembConfigError(f"{source}: {key or 'the file'} {why}: refused, nothing in it was run. {fix}")


def read_json(path: Path, shape: Shape = PLAIN, fix: str = REWRITE) -> Any:
    """A JSON file's value through `checked`; unreadable or invalid JSON is named with its line."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise SentembConfigError(f"{path}: unreadable ({err}). {fix}") from None
    return checked(parse_json(text, path, fix), path, shape, fix)


# digits an integer read from a file may have: Python's own limit on converting text to int (a longer one raises a
# bare ValueError), far past any count sentemb writes
MAX_DIGITS = 4300


class TooManyDigits(ValueError):
    """An integer literal past MAX_DIGITS, met before it is converted."""

    def __init__(self, literal: str, line: int | None = None) -> None:
        super().__init__(literal)
        self.literal, self.line = literal, line


def bounded_int(literal: str) -> int:
    """A JSON or YAML integer literal converted only when it has at most MAX_DIGITS digits."""
    if len(literal) > MAX_DIGITS + 1:  # + 1: a sign
        raise TooManyDigits(literal)
    return int(literal)


def too_many_digits(source: str | Path, text: str, err: TooManyDigits, fix: str) -> SentembConfigError:
    """The refusal of an integer past MAX_DIGITS, at its line (YAML's mark; in JSON the first line holding it)."""
    literal, at = err.literal, text.find(err.literal)
    line = f":{err.line}" if err.line else f":{text.count(chr(10), 0, at) + 1}" if at >= 0 else ""
    return SentembConfigError(
        f"{source}{line}: an integer of {len(literal.lstrip('+-'))} digits, more than the {MAX_DIGITS} sentemb reads "
        f"(no file sentemb writes holds one). {fix}"
    )


def parse_json(text: str, source: str | Path, fix: str = REWRITE) -> Any:
    """JSON text parsed, its errors a SentembConfigError naming `source` (a file, or a file and line) and `fix`: invalid
    JSON with its line, nesting too deep for the parser (json raises RecursionError, not a JSON error, there), and an
    integer past MAX_DIGITS digits (refused before it is converted). A reader still passes the value through
    `checked`, or checks its exact shape itself."""
    try:
        return json.loads(text, parse_int=bounded_int)
    except TooManyDigits as err:
        raise too_many_digits(source, text, err, fix) from None
    except json.JSONDecodeError as err:
        raise SentembConfigError(f"{source}:{err.lineno}: not valid JSON ({err.msg}). {fix}") from None
    except RecursionError:
        raise SentembConfigError(
            f"{source}: nests lists or dicts more than {MAX_DEPTH} deep: not JSON that sentemb writes. {fix}"
        ) from None


def read_yaml(path: Path, shape: Shape = PLAIN, fix: str = REWRITE) -> Any:
    """A YAML file's value through `checked`, parsed by `parse_yaml`."""
    return checked(parse_yaml(path, fix), path, shape, fix)


def parse_yaml(path: Path, fix: str = REWRITE) -> Any:
    """A YAML file parsed by PyYAML's safe loader (a `!!python/...` tag builds nothing: it is refused with its line),
    for a reader that passes the parts it uses through `checked` (Hydra's hydra.yaml holds its own interpolations)."""
    import yaml

    text = ""
    try:
        text = Path(path).read_text(encoding="utf-8")
        value = yaml.load(text, Loader=bounded_yaml_loader())
    except TooManyDigits as err:
        raise too_many_digits(path, text, err, fix) from None
    except RecursionError:
        raise SentembConfigError(
            f"{path}: nests lists or dicts more than {MAX_DEPTH} deep: not YAML that sentemb writes. {fix}"
        ) from None
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        line = f":{mark.line + 1}" if mark is not None else ""
        problem = getattr(err, "problem", None) or type(err).__name__
        raise SentembConfigError(f"{path}{line}: not YAML that sentemb reads ({problem}). {fix}") from None
    except (OSError, UnicodeDecodeError) as err:
        raise SentembConfigError(f"{path}: unreadable ({err}). {fix}") from None
    return value


def bounded_yaml_loader() -> type:
    """PyYAML's safe loader whose integers are converted only within MAX_DIGITS digits (its own int() raises a bare
    ValueError past Python's limit); everything else as `yaml.safe_load` reads it."""
    import yaml

    class BoundedLoader(yaml.SafeLoader):
        def construct_yaml_int(self, node: Any) -> int:
            if len(str(node.value).replace("_", "")) > MAX_DIGITS + 1:
                raise TooManyDigits(str(node.value), node.start_mark.line + 1)
            return super().construct_yaml_int(node)

    BoundedLoader.add_constructor("tag:yaml.org,2002:int", BoundedLoader.construct_yaml_int)
    return BoundedLoader
