"""The views a training batch carries, and the collator that pads them.

View 1, the anchor, is every batch's rows under the tokenizer's own names (`input_ids`, `attention_mask`, and
`token_type_ids` when the tokenizer gives them). Two more views are optional:

- data.dup_rate > 0 (ESimCSE): the positive view, each sentence with a few tokens repeated
  (`sentemb.data.repetition`), under `positive_input_ids`, `positive_attention_mask` (all 1) and, when the tokenizer
  gives token types, `positive_token_type_ids` (all 0);
- a `negation` view (asked for by SNCSE's margin term, `auxiliary=sncse`): each sentence's negation
  (`sentemb.data.negation`), tokenised and truncated to data.max_length, under `negation_input_ids`,
  `negation_attention_mask` (+ `negation_token_type_ids`).
  Under auxiliary.sncse.convention=reference the anchor (and so the positive made from it) is the sentence as
  SNCSE's training reads it, " ." appended when it lacks final punctuation (`SoftNegatives.anchors`).

Without them a batch holds exactly the anchor's keys. A view other than the anchor is keyed by its role
(`sentemb.common.batch_views.prefix`); the parts that read it ask for it by that role. Each view is padded on its
own, to its own longest row, on the tokenizer's padding side with its pad id (`ViewCollator`); `view_batch` reads
one view back under the plain names.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from transformers import PreTrainedTokenizerBase
from transformers.data.data_collator import pad_without_fast_tokenizer_warning

from sentemb.common.batch_views import POSITIVE, carried_roles, prefix
from sentemb.common.errors import SentembConfigError
from sentemb.data.repetition import repeat_tokens, sentence_rng
from sentemb.data.sentence_cut import cut_text

NEGATION = "negation"  # the view of each sentence's negation (SNCSE's soft negative)
# a labelled batch's per-row labels beside its views (sentemb.data.labelled): each text's id (B, views), the score (B,)
ROW_LABELS = ("text_ids", "scores")


@dataclass(frozen=True)
class SoftNegatives:
    """The `soft_negatives` config node's data-side fields: where each sentence's negation comes from
    (`sentemb.data.negation.soft_negatives`), and under `convention=reference` the released training's sentences
    (`anchors`) and lookup (`lookup_quirk`, unless set). `stamp`: the negation file's size and mtime, so datasets'
    cache of the tokenised corpus (keyed by the mapped function and its arguments) is not reused once the file
    changed."""

    source: str
    path: str | None = None
    lookup_quirk: bool = False
    spacy_model: str = "en_core_web_sm"
    stamp: tuple[int, int] | None = None
    convention: str = "paper"

    @classmethod
    def from_config(cls, node: Mapping[str, Any] | None) -> SoftNegatives | None:
        """None when the node is absent (null); its loss-side fields (alpha, beta, weight, ...) are not read here."""
        if not node:
            return None
        path = node.get("path")
        path = None if path is None else os.path.expanduser(str(path))
        stamp = None
        if path is not None and os.path.isfile(path):
            status = os.stat(path)
            stamp = (status.st_size, status.st_mtime_ns)
        convention = node.get("convention") or "paper"
        quirk = node.get("lookup_quirk")  # null: the convention's (the released lookup under reference)
        return cls(
            source=node.get("source"),
            path=path,
            lookup_quirk=convention == "reference" if quirk is None else bool(quirk),
            spacy_model=node.get("spacy_model") or "en_core_web_sm",
            stamp=stamp,
            convention=convention,
        )

    def anchors(self, sentences: list[str]) -> list[str]:
        """The sentences the anchor view is made of: as given (`paper`), or as SNCSE's training reads them
        (`reference`: `with_final_period`, for its anchor's and positive's prompts alike)."""
        if self.convention != "reference":
            return sentences
        from sentemb.data.negation import with_final_period

        return [with_final_period(sentence) for sentence in sentences]

    def negations(self, sentences: list[str]) -> list[str]:
        from sentemb.data.negation import soft_negatives  # the negation parser (spaCy) loads only when used

        return soft_negatives(
            sentences, self.source, path=self.path, lookup_quirk=self.lookup_quirk, spacy_model=self.spacy_model
        )


def view_makers(views: Mapping[str, Mapping[str, Any]] | None) -> SoftNegatives | None:
    """The data's makers of the extra views the training parts ask for (role → the asking part's options): the
    `negation` view from its source; a role no maker here knows is refused before any data is read."""
    views = dict(views or {})
    unknown = sorted(set(views) - {NEGATION})
    if unknown:
        raise SentembConfigError(
            f"a training part asks for a {unknown[0]!r} view, which sentemb.data cannot make (it makes: {NEGATION}). "
            "Fix: a part that reads the views the data makes, or a maker for that view in sentemb/data/views.py"
        )
    return SoftNegatives.from_config(views.get(NEGATION))


def encode_views(
    sentences: list[str],
    indices: Sequence[int],
    tokenizer: PreTrainedTokenizerBase,
    max_length: int,
    dup_rate: float = 0.0,
    seed: int = 0,
    soft_negatives: SoftNegatives | None = None,
) -> dict[str, list[list[int]]]:
    """Sentences → the columns of their views: the anchor's (cut and truncated to `max_length`; under SNCSE's reference
    convention the sentence as its training reads it, `SoftNegatives.anchors`), the positive's when `dup_rate` > 0
    (sentence `indices[i]` repeats from `sentence_rng(seed, indices[i])`), the soft negative's."""
    anchors = sentences if soft_negatives is None else soft_negatives.anchors(list(sentences))
    # cut before tokenising: a tokenizer truncates only after tokenising the whole text (sentemb.data.sentence_cut)
    anchors = [cut_text(anchor, max_length) for anchor in anchors]
    encoded = dict(tokenizer(anchors, truncation=True, max_length=max_length))
    if dup_rate > 0:
        ids = [
            repeat_tokens(row, dup_rate, sentence_rng(seed, index))
            for row, index in zip(encoded["input_ids"], indices, strict=True)
        ]
        positive = prefix(POSITIVE)
        encoded[f"{positive}input_ids"] = ids
        encoded[f"{positive}attention_mask"] = [[1] * len(row) for row in ids]
        if "token_type_ids" in encoded:
            encoded[f"{positive}token_type_ids"] = [[0] * len(row) for row in ids]
    if soft_negatives is not None:
        negations = soft_negatives.negations(list(sentences))
        if len(negations) != len(sentences):
            raise RuntimeError(f"{len(negations)} soft negatives for {len(sentences)} sentences")
        negative = tokenizer([cut_text(text, max_length) for text in negations], truncation=True, max_length=max_length)
        encoded.update({f"{prefix(NEGATION)}{key}": values for key, values in negative.items()})
    return encoded


@dataclass
class ViewCollator:
    """Pads each view of a batch on its own (to its own longest row, the tokenizer's padding side and pad id) and
    returns them together: the anchor under the plain names, the others under their prefixes. A batch without
    views comes out as DataCollatorWithPadding's would."""

    tokenizer: PreTrainedTokenizerBase

    def __call__(self, features: list[Mapping[str, Any]]) -> Mapping[str, torch.Tensor]:
        # a labelled row's per-row labels (its texts' ids, its score): one value or list a row, stacked, not padded
        labels = {key: torch.tensor([feature[key] for feature in features]) for key in ROW_LABELS if key in features[0]}
        groups: dict[str, list[dict[str, Any]]] = {}
        for feature in features:
            starts = [prefix(role) for role in carried_roles(feature)]  # every view's but the anchor's (no prefix)
            split: dict[str, dict[str, Any]] = {}
            for key, value in feature.items():
                if key in ROW_LABELS:
                    continue
                start = next((p for p in starts if key.startswith(p)), "")
                split.setdefault(start, {})[key[len(start) :]] = value
            for start, rows in split.items():
                groups.setdefault(start, []).append(rows)
        batch = self.pad(groups.pop(""))
        for start, rows in groups.items():
            for key, value in self.pad(rows).items():
                batch[f"{start}{key}"] = value
        batch.update(labels)
        return batch

    def pad(self, rows: list[dict[str, Any]]) -> Mapping[str, torch.Tensor]:
        return pad_without_fast_tokenizer_warning(self.tokenizer, rows, padding=True, return_tensors="pt")
