"""ESimCSE's word repetition (Wu et al., COLING 2022; `dup_type=bpe`): the positive view is the sentence with a few
of its sub-word tokens said twice.

On a sentence's token ids after tokenisation and truncation to data.max_length, special tokens included, of
length L, with r = data.dup_rate:

1. when ⌊r·L⌋ = 0 the ids are left as they are;
2. otherwise a count n is drawn uniformly from {0, …, min(10, ⌊r·L⌋) − 1}: n may be 0 and is at most 9;
3. n distinct positions are drawn uniformly from {1, …, L − 2}, so neither the first token ([CLS], <s>) nor the
   last ([SEP], </s>) is ever repeated;
4. each chosen token is emitted twice, the copy right after it. The copy is not truncated again: it may be up to
   9 tokens longer than data.max_length.

The released code (caskcsg/sentemb ESimCSE/train.py, prepare_features) draws these once, when it preprocesses
the corpus with datasets.map, from Python's global `random` after set_seed(42): each sentence's repeated copy is
fixed for the whole run, never redrawn per step. Here each sentence draws from a generator of its own,
`sentence_rng(data.seed, index)` with the sentence's index among the corpus's non-blank lines: the same
distribution and still one fixed copy per sentence for the run, but independent of the order the sentences are
read in, so it is the same on every DDP rank, in the streamed and the in-memory corpus, and after a resume,
without any saved state.
"""

from __future__ import annotations

import math
import random
from numbers import Real

from sentemb.common.errors import SentembConfigError

MAX_REPEATS = 10  # n < MAX_REPEATS: the released code's exclusive bound (at most 9 tokens repeated)


def check_dup_rate(dup_rate: object) -> None:
    """data.dup_rate is a number with 0 <= r < 1 (0: no word repetition)."""
    if isinstance(dup_rate, Real) and not isinstance(dup_rate, bool) and 0 <= dup_rate < 1:
        return
    raise SentembConfigError(
        f"data.dup_rate={dup_rate!r}: ESimCSE's word repetition rate must be a number with 0 <= data.dup_rate < 1 "
        "(the share of a sentence's tokens that bounds how many are repeated). Fix: data.dup_rate=0.32 (ESimCSE's "
        "for BERT-base; 0.28-0.32 in the paper), or data.dup_rate=0 to turn word repetition off"
    )


def sentence_rng(seed: int, index: int) -> random.Random:
    """The generator sentence `index` (its row among the corpus's non-blank lines) draws its repetition from: a
    function of the run's data seed and that index alone (a string seed: hashed by sha512, the same on every
    platform and process), so the sentence's repeated copy is fixed for the run, whatever reads it and when."""
    return random.Random(f"sentemb.repetition:{seed}:{index}")


def repeat_tokens(ids: list[int], dup_rate: float, rng: random.Random) -> list[int]:
    """`ids` with n ~ U{0, …, min(10, ⌊dup_rate·L⌋) − 1} distinct tokens, uniform over positions 1 … L−2, said
    twice (each copy right after its token); unchanged when ⌊dup_rate·L⌋ = 0. See the module's docstring."""
    check_dup_rate(dup_rate)
    length = len(ids)
    # r < 1 makes ⌊r·L⌋ <= L − 1, so n <= L − 2 positions fit in {1, …, L − 2}; the min only guards float rounding
    bound = min(math.floor(dup_rate * length), MAX_REPEATS, length - 1)
    if bound <= 0:
        return list(ids)
    count = rng.randrange(bound)
    repeated = set(rng.sample(range(1, length - 1), count))
    out: list[int] = []
    for position, token in enumerate(ids):
        out.append(token)
        if position in repeated:
            out.append(token)
    return out
