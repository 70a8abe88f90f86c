"""JSON lines: one flat JSON object a line, every object with the first one's keys (the columns)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from sentemb.common.errors import SentembConfigError
from sentemb.common.parts import part
from sentemb.data.corpus import decoded
from sentemb.data.echo import echo
from sentemb.data.formats.base import Format, Rows


@part("data.format", "json")
class JSONLines(Format):
    extensions = (".jsonl", ".json")
    label = "JSON lines"
    described = "one JSON object a line"

    def rows(self, path: Path) -> Rows:
        return json_rows(path)


def json_rows(path: Path) -> Rows:
    """The keys of the first object, and every object with its line, read as iterated (a streamed file too); every
    object must have the first one's keys (a key the first lacks would be dropped, a missing one read as empty)."""

    def objects() -> Iterator[tuple[int, dict[str, Any]]]:
        with path.open("rb") as handle:
            for number, raw in enumerate(handle, start=1):
                if raw.strip():
                    yield number, json_object(raw, path, number)

    first = next(objects(), None)
    if first is None:
        raise SentembConfigError(f"{path}: the file has no rows. Fix: one JSON object a line")
    keys = list(first[1])

    def rows() -> Iterator[tuple[int, dict[str, Any]]]:
        for number, value in objects():
            if value.keys() != set(keys):
                raise keys_differ(path, number, first[0], keys, list(value))
            yield number, value

    return keys, rows()


def keys_differ(path: Path, number: int, first: int, keys: list[str], found: list[str]) -> SentembConfigError:
    missing = [key for key in keys if key not in found]
    extra = [key for key in found if key not in keys]
    named = (("lacks", missing), ("adds", extra))
    parts = [f"{label} {', '.join(map(echo, names))}" for label, names in named if names]
    return SentembConfigError(
        f"{path}:{number}: the object's keys differ from the first object's (line {first}: "
        f"{', '.join(map(echo, keys))}): it {' and '.join(parts)} (a key the first object lacks would be dropped). "
        f"Fix: give every line the same keys as line {first}, or delete line {number}"
    )


class RepeatedKey(Exception):
    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key


def unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """An object's fields, a repeated key refused (json.loads keeps the last silently: a shadowed name)."""
    value = dict(pairs)
    if len(value) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise RepeatedKey(key)
            seen.add(key)
    return value


def json_object(raw: bytes, path: Path, number: int) -> dict[str, Any]:
    text = decoded(raw, path, number)
    fix = 'Fix: one flat JSON object a line, {"anchor": "...", "positive": "..."}'
    try:
        value = json.loads(text.removeprefix("\ufeff") if number == 1 else text, object_pairs_hook=unique_keys)
    except RepeatedKey as err:
        raise SentembConfigError(
            f"{path}:{number}: the object names {echo(err.key)} twice: json keeps the last, the first is lost. "
            f"Fix: give each field its own name"
        ) from None
    except json.JSONDecodeError as err:
        raise SentembConfigError(f"{path}:{number}: not a JSON object ({err}). {fix}") from None
    except ValueError as err:  # an integer past Python's 4,300 digits: no score, no sentence
        raise SentembConfigError(f"{path}:{number}: a number that cannot be read ({err}). {fix}") from None
    except RecursionError:
        raise SentembConfigError(f"{path}:{number}: lists or objects nested too deep to parse. {fix}") from None
    if not isinstance(value, dict):
        raise SentembConfigError(f"{path}:{number}: a JSON {type(value).__name__}, not an object. {fix}")
    return value
