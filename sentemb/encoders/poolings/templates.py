"""Prompt templates applied at the token level (PromptBERT; SNCSE), so truncation never cuts them.

A template such as `This sentence : "[X]" means [MASK] .` is tokenised once per tokenizer into
a prefix and a suffix around [X]; each sentence's own tokens (special tokens stripped) are
truncated to what fits and wrapped: [CLS] prefix sentence suffix [SEP]. [MASK] becomes the
tokenizer's mask token (`[MASK]` for BERT, `<mask>` for RoBERTa) and its position is known
exactly. Tokenising the pieces apart gives the same ids as tokenising the filled template for
WordPiece, and for byte-level BPE too because the sentence follows a quote (no leading space).

The pieces are tokenised as the template writes them, spaces included: SNCSE's training tokenises
`This sentence : " ` (a trailing space) and ` " means <mask> .` (a leading one), which WordPiece
ignores but RoBERTa's byte-level BPE keeps (a lone-space token after the quote, a space-prefixed
closing quote); `SNCSE_REFERENCE_TEMPLATES` write exactly those pieces.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.nn.utils.rnn import pad_sequence
from transformers import PreTrainedTokenizerBase

from sentemb.common.errors import SentembConfigError
from sentemb.common.file_values import not_text

PROMPTBERT_TEMPLATE = 'This sentence : "[X]" means [MASK] .'
# SNCSE's training template of the positive and the soft negative (its anchor's is PROMPTBERT_TEMPLATE)
SNCSE_POSITIVE_TEMPLATE = 'This sentence of "[X]" means [MASK] .'
# SNCSE's released pieces (Sense-GVT/SNCSE train_SNCSE.py, prepare_features: s1 = 'This sentence : " ', ss1 = 'This
# sentence of " ', s2 = ' " means [MASK] .'), (anchor, positive and negation): auxiliary.sncse.convention=reference
SNCSE_REFERENCE_TEMPLATES = ('This sentence : " [X] " means [MASK] .', 'This sentence of " [X] " means [MASK] .')


def check_template(template: str, key: str = "pooling.template") -> str:
    """The template if it holds [X] and [MASK] exactly once each and is text (no lone surrogate), else a config error
    naming `key`."""
    if not isinstance(template, str) or template.count("[X]") != 1 or template.count("[MASK]") != 1:
        raise SentembConfigError(
            f"{key}={template!r} must contain [X] (the sentence) and [MASK] exactly once each. "
            f"Fix: e.g. {key}='{PROMPTBERT_TEMPLATE}'"
        )
    why = not_text(template)
    if why:
        raise SentembConfigError(f"{key} {why}. Fix: e.g. {key}='{PROMPTBERT_TEMPLATE}'")
    return template


@dataclass(frozen=True)
class TokenTemplate:
    """A template's token ids for one tokenizer."""

    start: list[int]  # [CLS] / <s>
    prefix: list[int]
    suffix: list[int]
    end: list[int]  # [SEP] / </s>
    mask_token_id: int
    unk_token_id: int | None
    strip_ids: frozenset[int]  # special tokens a tokenised sentence carries around its content
    has_mask: bool = True  # False: plain special tokens only (no template)

    @classmethod
    def build(cls, tokenizer: PreTrainedTokenizerBase, template: str) -> TokenTemplate:
        check_template(template)
        if tokenizer.mask_token_id is None:
            raise SentembConfigError(
                f"pooling=prompt needs a tokenizer with a mask token; {type(tokenizer).__name__} has none"
            )
        before, after = (part.replace("[MASK]", tokenizer.mask_token) for part in template.split("[X]"))
        pieces = [tokenizer(part, add_special_tokens=False)["input_ids"] for part in (before, after)]
        specials = tokenizer("")["input_ids"]  # the special tokens around any sentence: [CLS, SEP] or [<s>, </s>]
        start = [specials[0]] if specials else []
        end = specials[1:] if len(specials) > 1 else []
        strip = {tokenizer.cls_token_id, tokenizer.sep_token_id, tokenizer.bos_token_id, tokenizer.eos_token_id}
        strip.discard(None)
        return cls(start, pieces[0], pieces[1], end, tokenizer.mask_token_id, tokenizer.unk_token_id, frozenset(strip))

    @classmethod
    def plain(cls, tokenizer: PreTrainedTokenizerBase) -> TokenTemplate:
        """No template: just the tokenizer's own special tokens around the content."""
        specials = tokenizer("")["input_ids"]
        strip = {tokenizer.cls_token_id, tokenizer.sep_token_id, tokenizer.bos_token_id, tokenizer.eos_token_id}
        strip.discard(None)
        mask = tokenizer.mask_token_id if tokenizer.mask_token_id is not None else -1
        return cls(specials[:1], [], [], specials[1:], mask, tokenizer.unk_token_id, frozenset(strip), has_mask=False)

    @property
    def overhead(self) -> int:
        """Tokens the template adds around a sentence."""
        return len(self.start) + len(self.prefix) + len(self.suffix) + len(self.end)

    def content(self, ids: list[int]) -> list[int]:
        """A tokenised sentence's own tokens: specials stripped; a literal mask token becomes [UNK]."""
        kept = [i for i in ids if i not in self.strip_ids]
        if not self.has_mask:
            return kept
        return [self.unk_token_id if i == self.mask_token_id and self.unk_token_id is not None else i for i in kept]

    def wrap(self, content: list[int], max_length: int) -> list[int]:
        """[CLS] prefix content suffix [SEP], the content truncated so the whole fits in max_length."""
        room = check_room(self.overhead, max_length)
        return [*self.start, *self.prefix, *content[:room], *self.suffix, *self.end]


def check_room(overhead: int, max_length: int) -> int:
    """The tokens a template leaves a sentence within max_length, at least 1, else a config error with the fix."""
    if max_length - overhead < 1:
        raise SentembConfigError(
            f"pooling.template takes {overhead} tokens, leaving no room for the sentence within {max_length}. "
            "Fix: a shorter pooling.template or a larger pooling.max_length"
        )
    return max_length - overhead


def real_ids(batch: dict[str, torch.Tensor]) -> list[list[int]]:
    """Each row's real token ids, in order (padding on either side dropped)."""
    return [
        [i for i, k in zip(ids, keep, strict=True) if k]
        for ids, keep in zip(batch["input_ids"].tolist(), batch["attention_mask"].tolist(), strict=True)
    ]


def rebatch(
    rows: list[list[int]], like: dict[str, torch.Tensor], pad_id: int, mask_token_id: int | None = None
) -> dict[str, torch.Tensor]:
    """Right-padded input_ids / attention_mask (and token_type_ids if `like` has them) on `like`'s device;
    with `mask_token_id`, each row's `mask_position` (every templated row holds exactly one mask token)."""
    device = like["input_ids"].device
    ids = pad_sequence([torch.tensor(r, dtype=torch.long) for r in rows], batch_first=True, padding_value=pad_id)
    mask = pad_sequence([torch.ones(len(r), dtype=torch.long) for r in rows], batch_first=True)
    batch = {"input_ids": ids.to(device), "attention_mask": mask.to(device)}
    if "token_type_ids" in like:
        batch["token_type_ids"] = torch.zeros_like(batch["input_ids"])
    if mask_token_id is not None:
        batch["mask_position"] = (batch["input_ids"] == mask_token_id).int().argmax(dim=1)
    return batch


def model_max_length(tokenizer: PreTrainedTokenizerBase, fallback: int = 512) -> int:
    """The tokenizer's own limit when it states a real one (HF uses 1e30 for 'none')."""
    limit = getattr(tokenizer, "model_max_length", None)
    return int(limit) if isinstance(limit, int) and 0 < limit <= 100_000 else fallback
