"""ESimCSE's word repetition: the count and the positions drawn as the spec says, the copy fixed per sentence."""

from __future__ import annotations

import math
import random
from collections import Counter

import pytest
from scipy.stats import chisquare

from sentemb.common.errors import SentembConfigError
from sentemb.data.repetition import check_dup_rate, repeat_tokens, sentence_rng
from sentemb.train import train
from tests.conftest import compose_train

DRAWS = 20_000
# fixed seeds make every draw below deterministic; the threshold says how unlikely a fair sampler's counts would be:
# a uniform sampler fails one of these tests once in 1,000 seeds
P_MIN = 1e-3


def ids_of(length: int) -> list[int]:
    """Distinct ids, so each output token names its position (100: [CLS]-like, 100 + L - 1: [SEP]-like)."""
    return list(range(100, 100 + length))


def repeated_positions(ids: list[int], out: list[int]) -> list[int]:
    """The positions of `ids` said twice in `out`, after checking `out` is `ids` with some tokens doubled in place."""
    positions, at = [], 0
    for position, token in enumerate(ids):
        assert out[at] == token, "the tokens keep their order"
        at += 1
        if at < len(out) and out[at] == token:
            positions.append(position)
            at += 1
    assert at == len(out), "nothing but doubled tokens is added"
    return positions


def draws(length: int, dup_rate: float, seed: int = 7) -> list[list[int]]:
    """The repeated positions of DRAWS sentences of `length` tokens, one generator per sentence as the data uses."""
    ids = ids_of(length)
    return [repeated_positions(ids, repeat_tokens(ids, dup_rate, sentence_rng(seed, index))) for index in range(DRAWS)]


@pytest.mark.parametrize(
    ("length", "dup_rate", "bound"),
    [(20, 0.3, 6), (32, 0.32, 10), (100, 0.5, 10)],  # ⌊rL⌋ = 6; ⌊10.24⌋ = 10; ⌊50⌋ capped at 10
)
def test_the_count_is_uniform_below_min_10_floor_rl(length, dup_rate, bound):
    counts = Counter(len(positions) for positions in draws(length, dup_rate))
    assert set(counts) == set(range(bound)), "n takes every value of {0, …, bound − 1} and no other (never 10)"
    assert chisquare([counts[n] for n in range(bound)]).pvalue > P_MIN


def test_positions_are_uniform_over_the_inner_tokens_never_the_first_or_last():
    length = 20
    chosen = draws(length, 0.3)
    counts = Counter(position for positions in chosen for position in positions)
    assert set(counts) == set(range(1, length - 1)), "positions 1 … L−2 only: never [CLS] (0) nor [SEP] (L−1)"
    assert all(len(set(positions)) == len(positions) for positions in chosen), "n distinct positions"
    # within a sentence the positions are drawn without replacement, which makes the counts' spread smaller than the
    # multinomial the chi-square assumes: the test is conservative, a uniform sampler passes it more often still
    assert chisquare([counts[p] for p in range(1, length - 1)]).pvalue > P_MIN


def test_each_chosen_token_is_doubled_in_place_and_the_copy_is_at_most_9_longer():
    ids = ids_of(32)
    for index in range(2000):
        out = repeat_tokens(ids, 0.32, sentence_rng(3, index))
        positions = repeated_positions(ids, out)  # checks the doubling
        assert all(out.count(ids[p]) == 2 for p in positions)
        assert len(out) == len(ids) + len(positions) <= len(ids) + 9


@pytest.mark.parametrize(("length", "dup_rate"), [(10, 0.09), (3, 0.3), (1, 0.9), (0, 0.5), (32, 0.0)])
def test_a_sequence_with_floor_rl_zero_is_unchanged(length, dup_rate):
    assert math.floor(dup_rate * length) == 0
    ids = ids_of(length)
    assert all(repeat_tokens(ids, dup_rate, sentence_rng(0, i)) == ids for i in range(50))


def test_two_tokens_leave_no_inner_position():
    """⌊r·2⌋ = 1: n ~ U{0}: nothing is repeated, though the rate is not 0."""
    assert repeat_tokens([101, 102], 0.6, random.Random(0)) == [101, 102]


def test_the_sentence_rng_fixes_a_sentences_copy_for_the_run():
    ids = ids_of(32)
    copy = [repeat_tokens(ids, 0.32, sentence_rng(42, index)) for index in range(200)]
    assert copy == [repeat_tokens(ids, 0.32, sentence_rng(42, index)) for index in reversed(range(200))][::-1], (
        "the same (seed, index) gives the same copy, whatever order the sentences are read in"
    )
    assert len({tuple(c) for c in copy}) > 150, "the indices draw differently"
    other_seed = [repeat_tokens(ids, 0.32, sentence_rng(43, index)) for index in range(200)]
    assert sum(a != b for a, b in zip(copy, other_seed, strict=True)) > 150, "another data seed, other copies"


@pytest.mark.parametrize("bad", [1.0, 1.5, -0.1, float("nan"), "0.3", True, None])
def test_a_bad_dup_rate_names_the_key_and_the_fix(bad):
    with pytest.raises(SentembConfigError, match=r"data\.dup_rate") as err:
        check_dup_rate(bad)
    assert "Fix: data.dup_rate=0.32" in str(err.value)
    with pytest.raises(SentembConfigError, match=r"data\.dup_rate"):
        repeat_tokens([1, 2, 3], bad, random.Random(0))


@pytest.mark.parametrize("good", [0, 0.0, 0.32, 0.999])
def test_a_good_dup_rate_passes(good):
    check_dup_rate(good)


@pytest.mark.usefixtures("forbid_model_loading")
def test_a_bad_dup_rate_fails_before_any_model_loads(small_corpus, tmp_path):
    cfg = compose_train(["model=tiny", "logger=csv", f"data.corpus={small_corpus}", "data.dup_rate=1.2"], tmp_path)
    with pytest.raises(SentembConfigError, match=r"data\.dup_rate=1\.2"):
        train(cfg)
