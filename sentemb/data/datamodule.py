"""Unsupervised training data: one sentence per line (SimCSE's wiki1m format).

The corpus is checked by `sentemb.data.corpus.check_corpus` before anything expensive (the
pre-run checks call it), then read here through Hugging Face `datasets`, blank lines dropped
and counted, tokenised once (max 32 tokens, SimCSE) and padded per batch. ESimCSE's word
repetition (data.dup_rate) and the extra views the training parts ask for (SNCSE's negation view: `data.view`
parts, sentemb/data/view_makers/) add a positive and more views to each row, each padded on its own
(`sentemb.data.views`).
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
from sentemb.data.datamodule_checks import (  # noqa: F401 - the checks, importable here as before
    check_batching,
    check_built_in_keys,
    check_corpus_fills_batch,
    check_labelled_options,
)
from sentemb.data.labelled import encode_labelled, open_labelled, read_labelled
from sentemb.data.repetition import check_dup_rate
from sentemb.data.streaming import LabelledRowStream, ShuffledLineStream, StreamPosition
from sentemb.data.views import ViewCollator, ViewMakers, encode_views

log = logging.getLogger(__name__)


def tokenize_rows(
    rows: dict[str, list[str]],
    indices: Sequence[int],
    tokenizer: PreTrainedTokenizerBase,
    max_length: int,
    dup_rate: float = 0.0,
    seed: int = 0,
    view_makers: ViewMakers | None = None,
) -> dict:
    """A batch of corpus lines (rows `indices` of the non-blank corpus) → token ids truncated to `max_length`, and
    the positive and extra views when asked (`encode_views`), as `datasets.map(with_indices=True)` takes it."""
    return encode_views(rows["text"], indices, tokenizer, max_length, dup_rate, seed, view_makers)


class UnsupervisedTextDataModule(L.LightningDataModule):
    """Batches of tokenised sentences; the module encodes each batch twice (two dropout views), or its own views:
    with `dup_rate` > 0 ESimCSE's repeated copy as the positive, and the extra views the training parts ask for
    (`views`: role → the asking part's options, `ViewMakers.asked`; e.g. SNCSE's `negation`, made from its source, path,
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
        self.view_makers = ViewMakers.asked(views)
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
                view_makers=self.view_makers,
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
            self.shuffle_buffer if self.shuffle else None, dup_rate=self.dup_rate, view_makers=self.view_makers,
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
        opened = open_labelled(self.config)
        log.info("labelled data %s: streamed (each row checked as read)", opened.path)
        buffer = self.shuffle_buffer if self.shuffle else None
        return LabelledRowStream(
            opened, self.tokenizer, self.batch_size, self.max_length, self.seed, buffer, **self.share()
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
