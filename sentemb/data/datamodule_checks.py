"""The datamodule's checks of data.* options and of a corpus against the batch, torch-free: the pre-run checks
(sentemb.training.checks) run them before torch and lightning are imported (sentemb.data.datamodule re-exports them)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sentemb.common.errors import SentembConfigError
from sentemb.data.corpus import CorpusReport
from sentemb.data.labelled import STREAMED_SOURCES


def check_batching(batch_size: int | None, max_length: int | None) -> None:
    """data.batch_size must be >= 2 (a batch is its own negatives) and data.max_length >= 1."""
    if batch_size is not None and batch_size < 2:
        raise SentembConfigError(
            f"data.batch_size={batch_size}: the other sentences of a batch are its negatives, so a batch of one has "
            "none and the contrastive loss is 0 at every step (nothing trains). Fix: data.batch_size=64 "
            "(SimCSE's; any >= 2; conf/data/), and grad_cache=<chunk> if a big batch does not fit in memory"
        )
    if max_length is not None and max_length < 1:
        raise SentembConfigError(f"data.max_length={max_length} must be >= 1 (conf/data/).")


def check_corpus_fills_batch(report: CorpusReport, batch_size: int | None, world: int = 1) -> None:
    """Every device gets at least one whole batch: data.batch_size sentences each, on `world` devices.

    One device trains a corpus shorter than its batch on one short batch per epoch (a one-sentence corpus: a batch
    of one, with no negatives, which data.batch_size=1 is refused for); several devices drop a ragged last round
    (DistributedSampler and the stream alike), so there would be no batch at all. A streamed corpus is counted
    only as far as its head was read (`check_corpus`): refused only when the head is the whole file.
    """
    if batch_size is None:
        return
    needed, sentences = batch_size * world, report.lines - report.blank_lines
    if sentences >= needed or not report.whole:  # a longer stream's rest was not read: it may hold enough
        return
    devices = f" on each of {world} devices ({needed} sentences)" if world > 1 else ""
    largest = sentences // world
    smaller = f"data.batch_size={largest} or less, or " if largest >= 2 else ""
    raise SentembConfigError(
        f"data.corpus={report.path}: {sentences} sentences, fewer than one batch of data.batch_size={batch_size}"
        f"{devices}, so no step would train on a whole batch. Fix: {smaller}a corpus of at least {needed} sentences"
    )


def check_labelled_options(
    streaming: bool, views: Mapping[str, Any] | None, dup_rate: float = 0.0, source: str | None = "file"
) -> None:
    """What labelled data does not do: stream a built-in set (small, read whole), make a view a training part asks
    for (SNCSE's negation), or repeat words into a positive (ESimCSE's data.dup_rate: the positive is labelled)."""
    if dup_rate:
        raise SentembConfigError(
            f"data.dup_rate={dup_rate} with labelled data: ESimCSE's word repetition makes the positive of an "
            "unlabelled sentence, and a labelled row has its own. Fix: data.dup_rate=0 (negatives=momentum keeps "
            "ESimCSE's queue)"
        )
    if streaming and (source or "file") not in STREAMED_SOURCES:
        raise SentembConfigError(
            f"data.streaming=true with data.source={source}: a built-in set is small and read whole; a file is "
            "streamed (data=labelled, data=nli). Fix: data.streaming=false"
        )
    if views:
        raise SentembConfigError(
            f"labelled data cannot make the {', '.join(sorted(views))} view a training part asks for (only "
            "unlabelled corpora make views: data=wiki). Fix: drop that part (auxiliary=null), or train it on data=wiki"
        )
