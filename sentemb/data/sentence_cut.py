"""Sentences cut to what their kept tokens can span, before anything hashes or tokenises them.

A tokenizer truncates only after it has tokenised the whole text: one 20 MB sentence under data.max_length=32 would
cost gigabytes for 32 tokens. Every sentence a run reads (a corpus line, a streamed line, a labelled text) is
therefore cut to `char_limit(max_length)` characters first. The tokens kept are the same: each spans at most
`CHARS_PER_TOKEN` characters of ordinary text with its separator (WordPiece makes a word of over 100 characters one
[UNK], and the longest entry of the vocabularies sentemb's tests use is 18 characters), so max_length tokens end
before the cut, and the one word the cut falls in only gives tokens past them. Two texts alike up to the cut
then get one text id: their kept tokens are identical, so the model sees one input.
"""

from __future__ import annotations

from collections.abc import Sequence

# a kept token spans at most this many characters with its separator: 2.5x WordPiece's 100-character word (a longer
# word is one [UNK]), far above a BPE or SentencePiece vocabulary entry (the test tokenizers' longest: 18)
CHARS_PER_TOKEN = 256


def char_limit(max_length: int) -> int:
    """The characters a sentence keeps for `max_length` tokens: one token's more, for the word the cut falls in."""
    return CHARS_PER_TOKEN * (max_length + 1)


def cut_text(text: str, max_length: int) -> str:
    """`text` up to `char_limit(max_length)` characters (itself when shorter: no copy)."""
    limit = char_limit(max_length)
    return text if len(text) <= limit else text[:limit]


def cut_texts(texts: Sequence[str | None], max_length: int) -> list[str | None]:
    """Each text cut (`cut_text`); None (a row's absent hard negative) stays None."""
    return [None if text is None else cut_text(text, max_length) for text in texts]
