"""The views a training batch carries, and the collator that pads them.

View 1, the anchor, is every batch's rows under the tokenizer's own names (`input_ids`, `attention_mask`, and
`token_type_ids` when the tokenizer gives them). More views are optional:

- data.dup_rate > 0 (ESimCSE): the positive view, each sentence with a few tokens repeated
  (`sentemb.data.repetition`), under `positive_input_ids`, `positive_attention_mask` (all 1) and, when the tokenizer
  gives token types, `positive_token_type_ids` (all 0);
- each extra view a training part asks for (`ViewMakers`: its role's `data.view` part, sentemb/data/view_makers/),
  tokenised and truncated to data.max_length under its role's prefix: e.g. the `negation` view SNCSE's margin term
  reads (`auxiliary=sncse`), each sentence's negation (`sentemb.data.negation`), under `negation_input_ids`,
  `negation_attention_mask` (+ `negation_token_type_ids`). A maker may say what the anchor is made of: under
  auxiliary.sncse.convention=reference the anchor (and so the positive made from it) is the sentence as SNCSE's training
  reads it, " ." appended when it lacks final punctuation (`NegationView.anchors`).

Without them a batch holds exactly the anchor's keys. A view other than the anchor is keyed by its role
(`sentemb.common.batch_views.prefix`); the parts that read it ask for it by that role. Each view is padded on its
own, to its own longest row, on the tokenizer's padding side with its pad id (`ViewCollator`); `view_batch` reads
one view back under the plain names.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from transformers import PreTrainedTokenizerBase
from transformers.data.data_collator import pad_without_fast_tokenizer_warning

from sentemb.common.batch_views import POSITIVE, carried_roles, prefix
from sentemb.common.errors import SentembConfigError
from sentemb.common.parts import names, registered
from sentemb.data.repetition import repeat_tokens, sentence_rng
from sentemb.data.sentence_cut import cut_text
from sentemb.data.view_makers import ViewMaker

# a labelled batch's per-row labels beside its views (sentemb.data.labelled): each text's id (B, views), the score (B,)
ROW_LABELS = ("text_ids", "scores")


@dataclass(frozen=True)
class ViewMakers:
    """The makers of the extra views the training parts ask for, each with its role (a `data.view` part:
    sentemb/data/view_makers/). Frozen: datasets keys its cache of the tokenised corpus by it."""

    makers: tuple[tuple[str, ViewMaker], ...] = ()

    @classmethod
    def asked(cls, views: Mapping[str, Mapping[str, Any]] | None) -> ViewMakers:
        """The makers of the views asked for (role → the asking part's options); a role no registered maker makes is
        refused before any data is read."""
        views = dict(views or {})
        known = registered("data.view")
        unknown = sorted(set(views) - set(known))
        if unknown:
            raise SentembConfigError(
                f"a training part asks for a {unknown[0]!r} view, which sentemb.data cannot make (it makes: "
                f"{', '.join(names('data.view'))}). Fix: a part that reads the views the data makes, or a maker of "
                f"that view: a ViewMaker with @part('data.view', {unknown[0]!r}) in sentemb/data/view_makers/"
            )
        made = ((role, known[role].build.from_options(options)) for role, options in views.items())
        return cls(tuple((role, maker) for role, maker in made if maker is not None))

    def anchors(self, sentences: list[str]) -> list[str]:
        """The sentences the anchor view is made of, as each maker reads them (as given, unless one says otherwise)."""
        for _, maker in self.makers:
            sentences = maker.anchors(sentences)
        return sentences


def encode_views(
    sentences: list[str],
    indices: Sequence[int],
    tokenizer: PreTrainedTokenizerBase,
    max_length: int,
    dup_rate: float = 0.0,
    seed: int = 0,
    view_makers: ViewMakers | None = None,
) -> dict[str, list[list[int]]]:
    """Sentences → the columns of their views: the anchor's (cut and truncated to `max_length`; the sentences as the
    view makers read them, `ViewMakers.anchors`), the positive's when `dup_rate` > 0 (sentence `indices[i]` repeats
    from `sentence_rng(seed, indices[i])`), and each extra view's (`view_makers`)."""
    makers = view_makers or ViewMakers()
    anchors = makers.anchors(list(sentences))
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
    for role, maker in makers.makers:
        texts = maker.texts(list(sentences))
        if len(texts) != len(sentences):
            raise RuntimeError(f"{len(texts)} texts of the {role} view for {len(sentences)} sentences")
        view = tokenizer([cut_text(text, max_length) for text in texts], truncation=True, max_length=max_length)
        encoded.update({f"{prefix(role)}{key}": values for key, values in view.items()})
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
