"""Unsupervised training data: one sentence per line (SimCSE's wiki1m format).

The corpus is checked by `sentemb.data.corpus.check_corpus` before anything expensive (the
pre-run checks call it), then read here through Hugging Face `datasets`, blank lines dropped
and counted, tokenised once (max 32 tokens, SimCSE) and padded per batch.
"""

from __future__ import annotations

import logging
import warnings
from pathlib import Path

import lightning as L
import torch
from datasets import Dataset, load_dataset
from torch.utils.data import DistributedSampler
from torchdata.stateful_dataloader import StatefulDataLoader
from transformers import DataCollatorWithPadding, PreTrainedTokenizerBase

from sentemb.common.errors import SentembConfigError

log = logging.getLogger(__name__)
# torchdata's StatefulDataLoader calls a torch API that torch now marks deprecated; nothing for us to act on
warnings.filterwarnings("ignore", message=r".*'set_vital' is deprecated.*")


def check_batching(batch_size: int | None, max_length: int | None) -> None:
    """data.batch_size and data.max_length must be >= 1."""
    for key, value in (("batch_size", batch_size), ("max_length", max_length)):
        if value is not None and value < 1:
            raise SentembConfigError(f"data.{key}={value} must be >= 1 (conf/data/).")


class UnsupervisedTextDataModule(L.LightningDataModule):
    """Batches of tokenised sentences; the module encodes each batch twice (two dropout views)."""

    def __init__(
        self,
        corpus: str | Path,
        tokenizer: PreTrainedTokenizerBase,
        batch_size: int = 64,
        max_length: int = 32,
        num_workers: int = 0,
        shuffle: bool = True,
        seed: int = 0,
    ) -> None:
        super().__init__()
        check_batching(batch_size, max_length)
        self.corpus = Path(corpus)
        self.tokenizer = tokenizer
        self.batch_size = batch_size
        self.max_length = max_length
        self.num_workers = num_workers
        self.shuffle = shuffle
        self.seed = seed
        self.train_set: Dataset | None = None
        self._resumed_position: dict | None = None

    def setup(self, stage: str | None = None) -> None:
        if self.train_set is not None:
            return
        text = load_dataset("text", data_files={"train": str(self.corpus)}, split="train")
        lines = len(text)
        text = text.filter(lambda row: bool(row["text"].strip()), desc="drop blank lines")
        self.train_set = text.map(
            lambda rows: self.tokenizer(rows["text"], truncation=True, max_length=self.max_length),
            batched=True,
            remove_columns=["text"],
            desc="tokenize",
        )
        log.info("corpus %s: %d sentences, %d blank lines skipped", self.corpus, len(self.train_set), lines - len(text))

    def train_dataloader(self) -> StatefulDataLoader:
        """Shuffled by its own generator (the order never depends on dropout's RNG), and stateful: a resumed
        run continues mid-epoch with the very next batch (`state_dict` / `load_state_dict` below)."""
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
            collate_fn=DataCollatorWithPadding(self.tokenizer),
            persistent_workers=self.num_workers > 0,
            drop_last=world > 1,
        )
        if self._resumed_position is not None:
            loader.load_state_dict(self._resumed_position)
            self._resumed_position = None
        return loader

    # Lightning restores the datamodule before it first builds the loader (it builds it early, to count the
    # scheduler's steps, before it would restore the loader's own saved state), so the position lives here
    def state_dict(self) -> dict:
        loader = self.trainer.train_dataloader if self.trainer is not None else None
        return {"train_position": loader.state_dict()} if isinstance(loader, StatefulDataLoader) else {}

    def load_state_dict(self, state_dict: dict) -> None:
        self._resumed_position = state_dict.get("train_position")
