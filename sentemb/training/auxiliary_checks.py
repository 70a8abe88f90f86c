"""The auxiliary terms a config names (`auxiliary=[sncse,my_term]`), checked torch-free: their nodes in order, the
views each reads against those the data makes, and their labels against the pooling's and head's own terms."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from sentemb.common.errors import SentembConfigError

GLOBAL_LABEL = "global"  # the global loss's own logged term beside others: train/loss/global


def auxiliary_nodes(auxiliary: Mapping[str, Any] | Sequence[Mapping[str, Any]] | None) -> list[dict[str, Any]]:
    """Each configured term's node, in the config's order. `auxiliary=[a,b]` composes {a: {name: a, ...}, b: ...} (each
    conf/auxiliary/<name>.yaml is packaged under its own name); a list is taken as it is; a checkpoint written when
    one term could be configured stored that term's node alone ({name: sncse, ...})."""
    if not auxiliary:
        return []
    if isinstance(auxiliary, Sequence):
        return [dict(node) for node in auxiliary]
    if isinstance(auxiliary.get("name"), str):  # the one term of an older checkpoint
        return [dict(auxiliary)]
    nodes = []
    for key, node in auxiliary.items():
        if not isinstance(node, Mapping):
            raise SentembConfigError(
                f"auxiliary.{key}={node!r} is not a term's node. Fix: auxiliary=[{key}] (conf/auxiliary/{key}.yaml), "
                f"then auxiliary.{key}.<field>=<value>"
            )
        nodes.append({"name": key, **node})
    return nodes


def check_term_labels(terms: Iterable[tuple[str, str]], own: Iterable[str], parts: str) -> None:
    """(name, label) of each term: no two terms log under one label, none under a label the pooling's or head's own
    terms (`own`, of `parts`) or the global loss use: its value would silently replace theirs in the sum and logs."""
    seen: dict[str, str] = {}
    taken = set(own)
    for name, label in terms:
        if label in seen:
            raise SentembConfigError(
                f"auxiliary={seen[label]} and auxiliary={name} both log their term as train/loss/{label}: one would "
                f"replace the other. Fix: configure each term once, or give one another label"
            )
        if label in taken or label == GLOBAL_LABEL:
            whose = f"{parts}'s own term" if label in taken else "the global loss's"
            raise SentembConfigError(
                f"auxiliary={name} logs its term as train/loss/{label}, which is {whose}: it would silently replace "
                f"it in the summed loss and the logs. Fix: drop auxiliary={name}, or give its term another label"
            )
        seen[label] = name


def check_term_views(terms: Iterable[tuple[str, Sequence[str]]], made: Sequence[str], data: str) -> None:
    """(name, the views it reads) of each term against the views the data makes (`made`, of `data`), before any
    model loads: a view no row has would fail at the first step."""
    for name, reads in terms:
        missing = [role for role in reads if role not in made]
        if missing:
            raise SentembConfigError(
                f"auxiliary={name} reads the training view {missing[0]!r}, which {data} does not make (its views: "
                f"{', '.join(made)}). Fix: data that has it (a hard_negative_<k> view: data=labelled with an "
                f"anchor,positive,negative file, or data=nli), or drop {name} from auxiliary="
            )
