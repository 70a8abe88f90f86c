"""Unsupervised training data: one sentence per line (SimCSE's wiki1m format).

The corpus is checked by `sentemb.data.corpus.check_corpus` before anything expensive (the
pre-run checks call it), then read here through Hugging Face `datasets`, blank lines dropped
and counted, tokenised once (max 32 tokens, SimCSE) and padded per batch. ESimCSE's word
repetition (data.dup_rate) and SNCSE's soft negatives (the `soft_negatives` node) add a positive
and a third view to each row, made with the tokens and each padded on its own (`sentemb.data.views`).
With data.streaming=true nothing is read up front: `sentemb.data.streaming` reads, shuffles and
tokenises the corpus (and makes the views) as training goes.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import lightning as L
import torch
from datasets import Dataset, load_dataset
from torch.utils.data import DataLoader, DistributedSampler
from torchdata.stateful_dataloader import StatefulDataLoader
from transformers import PreTrainedTokenizerBase

from sentemb.common.errors import SentembConfigError
from sentemb.common.numbers import Bounds, is_whole, require_whole
from sentemb.data.corpus import CorpusReport
from sentemb.data.labelled import STREAMED_SOURCES, LabelledFile, encode_labelled, labelled_source, read_labelled
from sentemb.data.repetition import check_dup_rate
from sentemb.data.streaming import LabelledRowStream, ShuffledLineStream, StreamPosition
from sentemb.data.views import SoftNegatives, ViewCollator, encode_views, view_makers

log = logging.getLogger(__name__)


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


def tokenize_rows(
    rows: dict[str, list[str]],
    indices: Sequence[int],
    tokenizer: PreTrainedTokenizerBase,
    max_length: int,
    dup_rate: float = 0.0,
    seed: int = 0,
    soft_negatives: SoftNegatives | None = None,
) -> dict:
    """A batch of corpus lines (rows `indices` of the non-blank corpus) → token ids truncated to `max_length`, and
    the positive and soft-negative views when asked (`encode_views`), as `datasets.map(with_indices=True)` takes it."""
    return encode_views(rows["text"], indices, tokenizer, max_length, dup_rate, seed, soft_negatives)


class UnsupervisedTextDataModule(L.LightningDataModule):
    """Batches of tokenised sentences; the module encodes each batch twice (two dropout views), or its own views:
    with `dup_rate` > 0 ESimCSE's repeated copy as the positive, and the extra views the training parts ask for
    (`views`: role → the asking part's options, `view_makers`; e.g. SNCSE's `negation`, made from its source, path,
    lookup_quirk and spacy_model). The batch's keys: `sentemb.data.views`."""

    def __init__(
        self,
        corpus: str | Path,
        tokenizer: PreTrainedTokenizerBase,
        batch_size: int = 64,
        max_length: int = 32,
        num_workers: int = 0,
        shuffle: bool = True,
        seed: int = 0,
        streaming: bool = False,
        shuffle_buffer: int = 10_000,
        dup_rate: float = 0.0,
        views: Mapping[str, Mapping[str, Any]] | None = None,
    ) -> None:
        super().__init__()
        check_batching(batch_size, max_length, num_workers)
        check_dup_rate(dup_rate)
        self.corpus = Path(corpus)
        self.tokenizer = tokenizer
        self.batch_size = batch_size
        self.max_length = max_length
        self.num_workers = num_workers
        self.shuffle = shuffle
        self.seed = seed
        self.streaming = streaming
        self.shuffle_buffer = shuffle_buffer
        self.dup_rate = dup_rate
        self.soft_negatives = view_makers(views)
        self.train_set: Dataset | None = None
        self._resumed_position: dict | None = None

    def setup(self, stage: str | None = None) -> None:
        if self.streaming or self.train_set is not None:  # streaming: nothing is read before the first batch
            return
        text = load_dataset("text", data_files={"train": str(self.corpus)}, split="train")
        lines = len(text)
        text = text.filter(lambda row: bool(row["text"].strip()), desc="drop blank lines")
        # datasets fingerprints the function it maps by pickling it: a function of `self` would pickle the trainer,
        # its model and its loggers (W&B's then starts its run early and warns)
        # with_indices: a row's index among the non-blank lines seeds its word repetition (sentemb.data.repetition)
        self.train_set = text.map(
            functools.partial(
                tokenize_rows,
                tokenizer=self.tokenizer,
                max_length=self.max_length,
                dup_rate=self.dup_rate,
                seed=self.seed if self.dup_rate > 0 else 0,  # without repetition a new seed reuses datasets' cache
                soft_negatives=self.soft_negatives,
            ),
            batched=True,
            with_indices=True,
            remove_columns=["text"],
            desc="tokenize",
        )
        log.info("corpus %s: %d sentences, %d blank lines skipped", self.corpus, len(self.train_set), lines - len(text))

    def train_dataloader(self) -> StatefulDataLoader | DataLoader:
        """Shuffled by its own generator (the order never depends on dropout's RNG), and stateful: a resumed
        run continues mid-epoch with the very next batch (`state_dict` / `load_state_dict` below)."""
        if self.streaming:
            return self.stream_loader()
        assert self.train_set is not None, "call setup() first"
        world = self.trainer.world_size if self.trainer is not None else 1
        # under DDP each rank reads its share through a DistributedSampler made here, so Lightning keeps this
        # loader (it rebuilds loaders only to insert one) and the resumed position stays loaded; drop_last: every
        # rank must gather equally many embeddings, no ragged last batch
        sampler = (
            DistributedSampler(
                self.train_set, world, self.trainer.global_rank, shuffle=self.shuffle, seed=self.seed, drop_last=True
            )
            if world > 1
            else None
        )
        loader = StatefulDataLoader(
            self.train_set,
            batch_size=self.batch_size,
            shuffle=self.shuffle if sampler is None else None,
            sampler=sampler,
            generator=torch.Generator().manual_seed(self.seed),
            num_workers=self.num_workers,
            collate_fn=ViewCollator(self.tokenizer),
            persistent_workers=self.num_workers > 0,
            drop_last=world > 1,
        )
        if self._resumed_position is not None:
            loader.load_state_dict(self._resumed_position)
            self._resumed_position = None
        return loader

    def stream_loader(self) -> DataLoader:
        """data.streaming=true: this rank's share of the stream, from the resumed position if there is one.

        A plain DataLoader: Lightning prefetches a batch from a loader without a length, so a StatefulDataLoader's
        state (which Lightning saves and restores too) would be one untrained batch ahead; the position is the
        trainer's count of trained batches instead (`state_dict` below).
        """
        stream = self.stream()
        if self._resumed_position is not None:
            stream.resume_at = StreamPosition(**self._resumed_position)
            self._resumed_position = None
        return DataLoader(
            stream,
            batch_size=self.batch_size,
            collate_fn=ViewCollator(self.tokenizer),
            # each iteration draws a base seed: from its own generator, not the global RNG dropout draws from
            generator=torch.Generator().manual_seed(self.seed),
        )

    def stream(self) -> ShuffledLineStream:
        """The corpus's stream, this rank's share of it (`share`)."""
        log.info("corpus %s: streamed (blank lines skipped as read)", self.corpus)
        return ShuffledLineStream(
            self.corpus, self.tokenizer, self.batch_size, self.max_length, self.seed,
            self.shuffle_buffer if self.shuffle else None, dup_rate=self.dup_rate, soft_negatives=self.soft_negatives,
            **self.share(),
        )  # fmt: skip

    def share(self) -> dict[str, Any]:
        """This process's place in the stream: its rank, the world size, and the trainer's epoch (asked per epoch)."""
        trainer = self.trainer
        return {
            "rank": trainer.global_rank if trainer is not None else 0,
            "world_size": trainer.world_size if trainer is not None else 1,
            "epoch": lambda: self.trainer.current_epoch if self.trainer is not None else 0,
        }

    # Lightning restores the datamodule before it first builds the loader (it builds it early, to count the
    # scheduler's steps, before it would restore the loader's own saved state), so the position lives here
    def state_dict(self) -> dict:
        if self.trainer is None:
            return {}
        if self.streaming:
            # the batches this epoch has trained (on_train_batch_end: this step's included); saved on an epoch's last
            # batch, the next epoch's start, since Lightning's resumed loop then goes on with that epoch
            progress, epoch = self.trainer.fit_loop.epoch_loop.batch_progress, self.trainer.current_epoch
            last = progress.is_last_batch
            position = StreamPosition(epoch + 1, 0) if last else StreamPosition(epoch, progress.current.processed)
            return {"stream_position": asdict(position)}
        loader = self.trainer.train_dataloader
        return {"train_position": loader.state_dict()} if isinstance(loader, StatefulDataLoader) else {}

    def load_state_dict(self, state_dict: dict) -> None:
        key, other = ("stream_position", "train_position") if self.streaming else ("train_position", "stream_position")
        if other in state_dict:
            raise SentembConfigError(
                f"ckpt_path: the checkpoint was written with data.streaming={str(not self.streaming).lower()}; "
                f"its data position means nothing to data.streaming={str(self.streaming).lower()}. "
                f"Fix: resume with data.streaming={str(not self.streaming).lower()}"
            )
        self._resumed_position = state_dict.get(key)


class LabelledDataModule(UnsupervisedTextDataModule):
    """Batches of labelled rows (sentemb.data.labelled): the anchor, its labelled positive as view 2, its hard
    negatives as views `hard_negative_1` ..., and the labels (`text_ids`: each text's id, which the module masks
    duplicates by; `scores`: a scored pair's score in [0, 1]). Shuffling, DDP shares and resume: the unsupervised
    datamodule's (the same loader)."""

    def __init__(
        self,
        path: str | Path | None,
        tokenizer: PreTrainedTokenizerBase,
        source: str = "file",
        columns: Sequence[str] | None = None,
        score_range: Sequence[float] | None = None,
        score_column: str | None = None,
        batch_size: int = 64,
        max_length: int = 32,
        num_workers: int = 0,
        shuffle: bool = True,
        seed: int = 0,
        streaming: bool = False,
        shuffle_buffer: int = 10_000,
        views: Mapping[str, Mapping[str, Any]] | None = None,
        dup_rate: float = 0.0,
    ) -> None:
        check_labelled_options(streaming, views, dup_rate, source, columns, score_range)
        super().__init__(
            path or "", tokenizer, batch_size, max_length, num_workers, shuffle, seed, streaming, shuffle_buffer
        )
        self.config = {
            "source": source,
            "path": path,
            "columns": columns,
            "score_range": score_range,
            "score_column": score_column,
        }

    def setup(self, stage: str | None = None) -> None:
        if self.streaming or self.train_set is not None:  # streaming: read as training goes
            return
        labelled = read_labelled(self.config)
        self.train_set = Dataset.from_dict(labelled.columns(self.max_length)).map(
            functools.partial(
                encode_labelled, tokenizer=self.tokenizer, max_length=self.max_length, roles=labelled.roles
            ),
            batched=True,
            remove_columns=labelled.roles,
            desc="tokenize",
        )
        log.info(
            "labelled data %s: %d rows, views %s%s",
            labelled.source,
            len(labelled),
            ", ".join(labelled.roles),
            ", scored" if labelled.scores is not None else "",
        )

    def stream(self) -> LabelledRowStream:
        """data.streaming=true: the file's rows, read, checked and tokenised as training goes, this rank's share."""
        source = labelled_source(self.config)
        log.info("labelled data %s: streamed (each row checked as read)", source.path)
        return LabelledRowStream(
            LabelledFile.open(
                source.path, self.config["columns"], self.config["score_range"], source.required,
                self.config["score_column"],
            ),
            self.tokenizer, self.batch_size, self.max_length, self.seed, self.shuffle_buffer if self.shuffle else None,
            **self.share(),
        )  # fmt: skip


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


# a built-in set's score scale, fixed by its reader (sentemb.data.labelled): the only data.score_range it takes
BUILT_IN_SCORES = {"stsb_train": [0, 5]}


def check_built_in_keys(source: str, columns: Sequence[str] | None, score_range: Sequence[float] | None) -> None:
    """A built-in set (data=stsb_train, sick_nli, mrpc) is read by its own reader, which reads neither data.columns
    nor data.score_range: a value it would ignore (stsb_train's [0,1] trained on 0-5) is refused, naming the key."""
    if source in STREAMED_SOURCES:  # a file: its reader reads both
        return
    if columns is not None:
        raise SentembConfigError(
            f"data.columns={list(columns)} with data={source}: a built-in set's columns are fixed by its reader, which "
            f"does not read data.columns. Fix: drop it (data.columns=null), or data=labelled data.path=<your file> "
            "with those columns"
        )
    scale = BUILT_IN_SCORES.get(source)
    given = None if score_range is None else list(score_range)
    if given is not None and given != scale:
        has = f"its scores are {scale[0]}-{scale[1]}, read on that scale" if scale else "it holds no scores"
        keep = f"data.score_range={scale}".replace(" ", "") if scale else "data.score_range=null"
        raise SentembConfigError(
            f"data.score_range={given} with data={source}: {has}, and its reader does not read data.score_range. "
            f"Fix: {keep}, or data=labelled data.path=<your scored file> data.score_range={given}"
        )


def check_data_fields(data: Mapping[str, Any], labelled: bool, option: str | None = None) -> None:
    """Every data.<key> is one the datamodule takes: a labelled-only key (data.columns, data.score_range, data.source)
    on one sentence per line, or data.corpus on labelled rows, would be a TypeError after the model loaded."""
    import inspect

    builds = LabelledDataModule if labelled else UnsupervisedTextDataModule
    takes = set(inspect.signature(builds).parameters) - {"tokenizer", "views"}
    stray = [str(key) for key in data if not str(key).startswith("_") and key not in takes]
    if stray:
        kind = "labelled rows" if labelled else "one sentence per line"
        other = "one sentence per line (data=wiki)" if labelled else "labelled rows (data=labelled)"
        raise SentembConfigError(
            f"{', '.join(f'data.{key}' for key in stray)}: data={option or builds.__name__} reads {kind} and takes "
            f"no such key (its keys: {', '.join(sorted(takes))}), so it would not be used. Fix: drop it "
            f"({' '.join(f'~data.{key}' for key in stray)}), or data for {other} if it is one of its keys"
        )
