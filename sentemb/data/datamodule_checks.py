"""The datamodule's checks of data.* options and of a corpus against the batch, torch-free: the pre-run checks
(sentemb.training.checks) run them before torch and lightning are imported (sentemb.data.datamodule re-exports them)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from sentemb.common.errors import SentembConfigError
from sentemb.common.numbers import Bounds, is_whole, require_whole
from sentemb.common.parts import names
from sentemb.data.corpus import CorpusReport
from sentemb.data.labelled import source_part

# each step scores a batch x batch similarity matrix: 64 GiB of float32 at 2^17, 4x CLIP's batch of 32,768
MAX_BATCH_SIZE = 2**17
# tokens a sentence keeps: the longest decoder context sentemb's presets reach (a model's own positions bound it
# further, `check_length_fits`); sentences are cut to 256 characters a token (sentemb.data.sentence_cut)
MAX_LENGTH = 2**17
MAX_WORKERS = 256  # loader processes, each with its own copy of the dataset's state


def check_batching(batch_size: object, max_length: object, num_workers: object = None) -> None:
    """data.batch_size: a whole number from 2 (a batch is its own negatives) to MAX_BATCH_SIZE; data.max_length: a whole
    number from 1 to MAX_LENGTH; data.num_workers: a whole number from 0 to MAX_WORKERS (None: not checked)."""
    if batch_size is not None:
        if is_whole(batch_size) and batch_size < 2:  # a batch of one: why, not only the bounds
            raise SentembConfigError(
                f"data.batch_size={batch_size}: the other sentences of a batch are its negatives, so a batch of one "
                "has none and the contrastive loss is 0 at every step (nothing trains). Fix: data.batch_size=64 "
                "(SimCSE's; any >= 2; conf/data/), and grad_cache=<chunk> if a big batch does not fit in memory"
            )
        require_whole(
            "data.batch_size", batch_size, Bounds(2, MAX_BATCH_SIZE), "data.batch_size=64 (SimCSE's; conf/data/)"
        )
    if max_length is not None:
        if is_whole(max_length) and max_length < 1:
            raise SentembConfigError(f"data.max_length={max_length} must be >= 1 (conf/data/).")
        require_whole("data.max_length", max_length, Bounds(1, MAX_LENGTH), "data.max_length=32 (SimCSE's)")
    if num_workers is not None:
        require_whole(
            "data.num_workers",
            num_workers,
            Bounds(0, MAX_WORKERS),
            "data.num_workers=0 (reads in the training process)",
        )


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
    streaming: bool,
    views: Mapping[str, Any] | None,
    dup_rate: float = 0.0,
    source: str | None = "file",
    columns: Sequence[str] | None = None,
    score_range: Sequence[float] | None = None,
) -> None:
    """What labelled data does not do: stream a built-in set (small, read whole), make a view a training part asks
    for (SNCSE's negation), repeat words into a positive (ESimCSE's data.dup_rate: the positive is labelled), or read
    data.columns or data.score_range of a built-in set (`check_built_in_keys`)."""
    check_built_in_keys(source or "file", columns, score_range)
    if dup_rate:
        raise SentembConfigError(
            f"data.dup_rate={dup_rate} with labelled data: ESimCSE's word repetition makes the positive of an "
            "unlabelled sentence, and a labelled row has its own. Fix: data.dup_rate=0 (negatives=momentum keeps "
            "ESimCSE's queue)"
        )
    if streaming and not source_part(source).streams:
        streamed = ", ".join(f"data={name}" for name in streamed_sets())
        raise SentembConfigError(
            f"data.streaming=true with data.source={source}: a built-in set is small and read whole; a file is "
            f"streamed (data=labelled, {streamed}). Fix: data.streaming=false"
        )
    if views:
        raise SentembConfigError(
            f"labelled data cannot make the {', '.join(sorted(views))} view a training part asks for (only "
            "unlabelled corpora make views: data=wiki). Fix: drop that part (auxiliary=null), or train it on data=wiki"
        )


def streamed_sets() -> list[str]:
    """The built-in sets data.streaming=true reads as training goes (files, as data=labelled's)."""
    return names("data.set", lambda entry: entry.build.built_in and entry.build.streams)


def check_built_in_keys(source: str, columns: Sequence[str] | None, score_range: Sequence[float] | None) -> None:
    """A built-in set read by its own reader (data=stsb_train, sick_nli, mrpc: its `reads_columns` false) reads
    neither data.columns nor data.score_range: a value it would ignore (stsb_train's [0,1] trained on 0-5) is refused,
    naming the key."""
    declared = source_part(source)
    if declared.reads_columns:  # a file: its reader reads both
        return
    if columns is not None:
        raise SentembConfigError(
            f"data.columns={list(columns)} with data={source}: a built-in set's columns are fixed by its reader, which "
            f"does not read data.columns. Fix: drop it (data.columns=null), or data=labelled data.path=<your file> "
            "with those columns"
        )
    # its score scale, fixed by its reader: the only data.score_range it takes
    scale = None if declared.score_range is None else list(declared.score_range)
    given = None if score_range is None else list(score_range)
    if given is not None and given != scale:
        low, high = (f"{end:g}" for end in scale) if scale else ("", "")
        has = f"its scores are {low}-{high}, read on that scale" if scale else "it holds no scores"
        keep = f"data.score_range=[{low},{high}]" if scale else "data.score_range=null"
        raise SentembConfigError(
            f"data.score_range={given} with data={source}: {has}, and its reader does not read data.score_range. "
            f"Fix: {keep}, or data=labelled data.path=<your scored file> data.score_range={given}"
        )
