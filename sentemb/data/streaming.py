"""data.streaming=true: the corpus read, shuffled and tokenised as training goes, never loaded whole.

Hugging Face `datasets` streams the file (10 MB blocks, Arrow), drops blank lines and shuffles
through a buffer seeded by data.seed (reshuffled every epoch from the seed and the epoch). The
stream is cut into rounds of world_size x batch_size lines and rank r takes the r-th batch of every
round: the ranks' shares are disjoint and every rank gets exactly as many batches (a partial last
round is dropped), which DDP needs, since the ranks all_gather embeddings at every step.

A position is (epoch, batches trained). A resumed stream replays the seeded stream from the start
of that epoch and skips those rounds as Arrow blocks, before anything is tokenised, so it goes on
with exactly the batches the uninterrupted run would have seen. datasets' own `state_dict` cannot
do this: it saves the file position but not the shuffle buffer, which it refills after a resume
with other lines in another order.

The views (`sentemb.data.views`) are made per batch as it is read: each line carries its index among the
corpus's non-blank lines (numbered before the shuffle, so the in-memory corpus numbers it alike), which seeds its
word repetition (data.dup_rate); an extra view (`sentemb.data.view_makers`) is made from the batch's lines.
"""

from __future__ import annotations

import functools
import random
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from datasets import load_dataset
from torch.utils.data import IterableDataset
from transformers import PreTrainedTokenizerBase

from sentemb.data.corpus import undecodable_line_error
from sentemb.data.labelled import SCORES, TEXT_IDS, LabelledFile, LabelledSet, encode_labelled, labelled_roles
from sentemb.data.sentence_cut import char_limit, cut_texts
from sentemb.data.streaming_checks import MAX_SHUFFLE_BUFFER, check_streaming  # noqa: F401 - importable here as before
from sentemb.data.views import ViewMakers, encode_views


@dataclass(frozen=True)
class StreamPosition:
    epoch: int
    batches: int  # batches of that epoch already trained (every rank alike)


def non_blank(lines: pa.Table) -> list[bool]:
    return [bool(line.strip()) for line in lines["text"].to_pylist()]


def numbered(lines: pa.Table, indices: Sequence[int], limit: int | None = None) -> pa.Table:
    """The lines with their index among the non-blank lines (the `index` column), as `map(with_indices=True)`
    passes them: numbered before the shuffle, they keep it through the buffer; each cut to `limit` characters
    (`sentence_cut.char_limit`), so the buffer holds at most shuffle_buffer x limit characters."""
    if limit is not None:
        lines = lines.set_column(0, "text", pc.utf8_slice_codeunits(lines["text"], 0, limit))  # code points
    return lines.append_column("index", pa.array(indices, pa.int64()))


class ShuffledLineStream(IterableDataset):
    """This rank's tokenised sentences, batch_size at a time, from `resume_at` (once) or the start of the epoch."""

    def __init__(
        self,
        corpus: Path,
        tokenizer: PreTrainedTokenizerBase,
        batch_size: int,
        max_length: int,
        seed: int,
        shuffle_buffer: int | None,
        rank: int = 0,
        world_size: int = 1,
        epoch: Callable[[], int] = lambda: 0,
        dup_rate: float = 0.0,
        view_makers: ViewMakers | None = None,
    ) -> None:
        super().__init__()
        self.corpus = Path(corpus)
        self.tokenizer = tokenizer
        self.batch_size = batch_size
        self.max_length = max_length
        self.seed = seed
        self.shuffle_buffer = shuffle_buffer  # None: the file's order
        self.rank = rank
        self.world_size = world_size
        self.epoch = epoch  # asked at each new iteration (Lightning iterates the loader once an epoch)
        self.resume_at: StreamPosition | None = None
        self.dup_rate = dup_rate
        self.view_makers = view_makers

    def batches(self, position: StreamPosition) -> Iterator[list[str]]:
        """This rank's batches of lines from `position` on (not tokenised)."""
        for lines, _ in self.numbered_batches(position):
            yield lines

    def numbered_batches(self, position: StreamPosition) -> Iterator[tuple[list[str], list[int]]]:
        """This rank's batches of lines from `position` on, each line with its index among the non-blank lines."""
        text = load_dataset("text", data_files=str(self.corpus), split="train", streaming=True).with_format("arrow")
        cut = functools.partial(numbered, limit=char_limit(self.max_length))  # blank as a whole line: as in memory
        text = text.filter(non_blank, batched=True).map(cut, batched=True, with_indices=True)
        if self.shuffle_buffer is not None:
            text = text.shuffle(seed=self.seed, buffer_size=self.shuffle_buffer)
        per_round = self.world_size * self.batch_size
        # skip() even of 0 rounds: datasets then builds a fresh stream exactly as a resumed one
        text = text.skip(position.batches * per_round)
        text.set_epoch(position.epoch)  # on the last dataset of the chain: it shifts the shuffle's seed by the epoch
        try:
            for rows in text.iter(batch_size=per_round, drop_last_batch=True):
                mine = rows.slice(self.rank * self.batch_size, self.batch_size)
                yield mine["text"].to_pylist(), mine["index"].to_pylist()
        except UnicodeDecodeError as err:
            raise undecodable_line_error(self.corpus, err) from err

    def __iter__(self) -> Iterator[dict[str, list[int]]]:
        position, self.resume_at = self.resume_at or StreamPosition(self.epoch(), 0), None
        for lines, indices in self.numbered_batches(position):
            encoded = encode_views(
                lines, indices, self.tokenizer, self.max_length, self.dup_rate, self.seed, self.view_makers
            )
            for index in range(len(lines)):
                yield {key: values[index] for key, values in encoded.items()}


class LabelledRowStream(IterableDataset):
    """data.streaming=true on a labelled file: its rows read, checked (file:line), shuffled through a seeded buffer
    and shared out as the corpus stream shares its lines (rank r takes the r-th batch of every round of
    world_size x batch_size rows, a partial last round dropped); a resumed stream replays the epoch's seeded order
    and skips the rounds already trained before tokenising anything."""

    def __init__(
        self,
        source: LabelledFile,
        tokenizer: PreTrainedTokenizerBase,
        batch_size: int,
        max_length: int,
        seed: int,
        shuffle_buffer: int | None,
        rank: int = 0,
        world_size: int = 1,
        epoch: Callable[[], int] = lambda: 0,
    ) -> None:
        super().__init__()
        self.source = source
        self.tokenizer = tokenizer
        self.batch_size = batch_size
        self.max_length = max_length
        self.seed = seed
        self.shuffle_buffer = shuffle_buffer  # None: the file's order
        self.rank = rank
        self.world_size = world_size
        self.epoch = epoch
        self.resume_at: StreamPosition | None = None

    def shuffled(self, epoch: int) -> Iterator[tuple[list[str], float | None]]:
        """The file's checked rows through a buffer of `shuffle_buffer` rows, drawn by a generator seeded by the seed
        and the epoch (each epoch its own order, the same in every run)."""
        # cut as read: the buffer holds at most shuffle_buffer rows of char_limit(max_length) characters a text
        rows = ((cut_texts(texts, self.max_length), score) for texts, score in self.source.rows())
        if self.shuffle_buffer is None:
            yield from rows
            return
        draw = random.Random(self.seed * 1_000_003 + epoch)
        buffer: list[tuple[list[str], float | None]] = []
        for row in rows:
            if len(buffer) < self.shuffle_buffer:
                buffer.append(row)
                continue
            index = draw.randrange(len(buffer))
            buffer[index], row = row, buffer[index]
            yield row
        draw.shuffle(buffer)
        yield from buffer

    def rounds(self, position: StreamPosition) -> Iterator[list[tuple[list[str], float | None]]]:
        """This rank's batches of rows from `position` on (not tokenised)."""
        per_round, skipped, current = self.world_size * self.batch_size, 0, []
        for row in self.shuffled(position.epoch):
            current.append(row)
            if len(current) < per_round:
                continue
            if skipped < position.batches:
                skipped += 1
            else:
                yield current[self.rank * self.batch_size : (self.rank + 1) * self.batch_size]
            current = []

    def __iter__(self) -> Iterator[dict[str, Any]]:
        position, self.resume_at = self.resume_at or StreamPosition(self.epoch(), 0), None
        roles = labelled_roles(len(self.source.layout.texts))
        for rows in self.rounds(position):
            texts = tuple(list(views) for views in zip(*(row for row, _ in rows), strict=True))
            scores = None if self.source.layout.score is None else [score for _, score in rows]
            columns = LabelledSet(texts, scores, str(self.source.path)).columns(self.max_length)
            encoded = encode_labelled(columns, self.tokenizer, self.max_length, roles)
            labels = {key: columns[key] for key in (TEXT_IDS, SCORES) if key in columns}
            for index in range(len(rows)):
                yield {key: values[index] for key, values in {**encoded, **labels}.items()}
