"""Whether the chosen loss can learn from the labelled rows: refused before the run where it would be 0 at every step.

Each loss declares what it learns from (`Objective.learns_from`, read through `learning_need`): a contrastive loss
with a negatives' denominator needs in-batch negatives, which a labelled batch masks where they duplicate the
anchor's own texts (losses/inputs.py, `duplicate_mask`: another row's positive is masked when it is the anchor's
anchor or positive text, or that row has the same anchor; a hard negative when it is the anchor's anchor or positive
text); a ranking loss (CoSENT, AnglE) needs two pairs of unequal scores. Any two rows may meet in a batch (the rows
are shuffled), so a refusal here is certain: no batch, in any order, holds what the loss needs."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Any

from sentemb.common.errors import SentembConfigError
from sentemb.common.parts import lookup
from sentemb.data.labelled import LabelledSet
from sentemb.encoders.models.backbones import declared_hidden_size
from sentemb.losses.base import IN_BATCH_NEGATIVES, RANKED_SCORES, Objective
from sentemb.losses.registry import learning_need, width_refusal

SHOWN = 60  # characters of a text quoted in a message


def check_learnable(loss: Mapping[str, Any], labelled: LabelledSet, extra_negatives: bool = False) -> None:
    """Refuse rows from which `loss` (a loss config) cannot learn, with the reason. `extra_negatives`: a negatives
    part (a queue, noise) adds candidates the rows do not give, so in-batch negatives are not all it has."""
    need = learning_need(loss)
    reason, fix = None, ""
    if need == IN_BATCH_NEGATIVES and not extra_negatives:
        reason = no_usable_negative(labelled.texts[0], labelled.texts[1], labelled.texts[2:])
        fix = (
            "rows with different anchors whose positives are not other rows' anchors, hard negatives (a third "
            "column), or a loss without negatives (e.g. loss=barlow)"
        )
    elif need == RANKED_SCORES and labelled.scores is not None:
        reason = no_ranked_pair(labelled.scores)
        fix = "pairs scored differently (the scores rank them), or loss=cosine_mse (a regression to each score)"
    if reason is not None:
        name = loss.get("name")
        raise SentembConfigError(
            f"{labelled.source}: loss={name} learns from {need}, but {reason}, so loss={name} is exactly 0 at every "
            f"step and nothing trains. Fix: {fix}"
        )


def no_ranked_pair(scores: Sequence[float]) -> str | None:
    """Why no two pairs can be ranked (every score equal), or None."""
    if len(set(scores)) > 1:
        return None
    return f"all {len(scores)} scores are equal: no pair ranks above another"


def no_usable_negative(
    anchors: Sequence[str | None], positives: Sequence[str | None], hard: Sequence[Sequence[str | None]]
) -> str | None:
    """Why no anchor of any batch has a candidate left after the duplicates are masked, or None when one has."""
    if usable_hard_negative(anchors, positives, hard) or usable_positive(anchors, positives):
        return None
    distinct = set(anchors)
    if len(distinct) == 1:
        what = f"every one of its {len(anchors)} rows has the same anchor text ({shown(anchors[0])})"
    else:
        what = (
            f"each row's candidates are its own anchor or positive text or rows of its anchor ({len(distinct)} "
            f"distinct anchors, {len(set(positives))} distinct positives)"
        )
    return f"{what}: every candidate is masked as a duplicate, no negative to contrast"


def usable_hard_negative(
    anchors: Sequence[str | None], positives: Sequence[str | None], hard: Sequence[Sequence[str | None]]
) -> bool:
    """Some hard negative (of any row: it may share the batch) is neither some row's anchor nor its positive."""
    texts: set[str] = set()
    for column in hard:
        texts.update(text for text in column if text is not None)
        if len(texts) > 2:  # two texts (an anchor and its positive) mask at most two
            return True
    return bool(texts) and any(texts - {anchor, positive} for anchor, positive in zip(anchors, positives, strict=True))


def usable_positive(anchors: Sequence[str | None], positives: Sequence[str | None]) -> bool:
    """Some row j's positive is a negative of another row i's anchor: a different anchor, and neither of i's texts.

    Linear in the rows: an anchor with three or more other anchors' positives has one outside its two texts; the few
    anchors with fewer (at most 3 unless there are at most 2 positives) are checked one by one."""
    owners: dict[str | None, set[str | None]] = defaultdict(set)  # positive → its anchors (two are enough to know)
    own: dict[str | None, set[str | None]] = defaultdict(set)  # anchor → its positives
    for anchor, positive in zip(anchors, positives, strict=True):
        if len(owners[positive]) < 2:
            owners[positive].add(anchor)
        own[anchor].add(positive)
    only: dict[str | None, int] = defaultdict(int)  # anchor → the positives no other anchor has
    for holders in owners.values():
        if len(holders) == 1:
            only[next(iter(holders))] += 1
    for anchor, its in own.items():
        if len(owners) - only[anchor] > 2:
            return True
        others = [positive for positive, holders in owners.items() if holders != {anchor}]
        if any(positive != anchor and its != {positive} for positive in others):
            return True
    return False


def shown(text: str | None) -> str:
    """A text quoted in a message, cut to SHOWN characters."""
    text = text or ""
    return repr(text if len(text) <= SHOWN else f"{text[:SHOWN]}...")


def check_loss_width(loss: Mapping[str, Any], model: Mapping[str, Any], head: Any = None, name: str = "") -> None:
    """The sentence vector's width, where known before the model loads, is one the loss takes (AnglE: even). The
    width: a head's own (`output_size`, SARCSE's co_c·(co_t − 1), from its options), else the backbone's declared
    hidden size (every pooling keeps it). `head`: built from its options (`name`: its config's), or None."""
    rule = getattr(lookup("loss", loss.get("name")).build, "width_refusal", None)
    if rule is None or getattr(rule, "__func__", None) is Objective.width_refusal.__func__:
        return  # any width (no config.json is read to learn it)
    width = getattr(head, "output_size", None) if head is not None else None
    where = f"head={name}'s sentence vector" if width is not None else "the model's hidden size"
    if width is None:
        width = declared_hidden_size(model)
    refusal = None if width is None else width_refusal(loss, width)
    if refusal is None:
        return
    fix = "an even width"
    if hasattr(head, "co_t"):  # SARCSE: Z is co_c·(co_t − 1) wide
        fix = f"an even head width, e.g. head.co_t={head.co_t + 1} ({head.co_c * head.co_t} wide) or head.co_c=2"
    raise SentembConfigError(
        f"loss={loss.get('name')} with {where}: {refusal}, so it would fail at the first step. Fix: {fix}, "
        "or loss=cosent (any width)"
    )
