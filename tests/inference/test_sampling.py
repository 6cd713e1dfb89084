import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from hypothesis.extra.numpy import arrays

from inference.sampling import (Sampler, SamplingParams, apply_repeat_penalty, min_p_keep, sample, top_k_candidates,
                                top_p_keep)

logit_arrays = arrays(np.float32, st.integers(2, 50), elements=st.floats(-20, 20, width=32), unique=True)


@given(logit_arrays)
def test_greedy_is_argmax(logits):
    rng = np.random.default_rng(0)
    assert sample(logits, SamplingParams(temperature=0), np.array([], np.int64), rng) == int(np.argmax(logits))


@given(logit_arrays, st.integers(1, 10), st.integers(0, 2**32 - 1))
@settings(max_examples=50)
def test_top_k_only_draws_from_the_k_best(logits, k, seed):
    best = set(np.argsort(-logits)[:k].tolist())
    token = sample(logits, SamplingParams(temperature=1.5, top_k=k, top_p=1.0, min_p=0.0), np.array([], np.int64),
                   np.random.default_rng(seed))
    assert token in best


def test_top_k_candidates_sorted():
    logits = np.array([0.1, 3.0, -1.0, 2.0], np.float32)
    assert top_k_candidates(logits, 2).tolist() == [1, 3]
    assert top_k_candidates(logits, 0).tolist() == [1, 3, 0, 2]


def test_top_p_and_min_p_cut_points():
    probs = np.array([0.5, 0.3, 0.15, 0.05])
    assert top_p_keep(probs, 0.5) == 1
    assert top_p_keep(probs, 0.8) == 2
    assert top_p_keep(probs, 0.81) == 3
    assert top_p_keep(probs, 1.0) == 4
    assert min_p_keep(probs, 0.3) == 3  # 0.15 >= 0.3 * 0.5
    assert min_p_keep(probs, 0.0) == 4


def test_repeat_penalty_pushes_recent_tokens_down():
    logits = np.array([2.0, -2.0, 1.0], np.float32)
    out = apply_repeat_penalty(logits, np.array([0, 1, 1]), 2.0)
    assert out.tolist() == [1.0, -4.0, 1.0]
    assert apply_repeat_penalty(logits, np.array([0]), 1.0) is logits


def test_seed_repeats_and_distribution_follows_temperature():
    logits = np.log(np.array([0.6, 0.3, 0.1], np.float32))
    params = SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0)
    a = [Sampler(params, seed=7)(logits, []) for _ in range(3)]
    s1, s2 = Sampler(params, seed=7), Sampler(params, seed=7)
    assert [s1(logits, []) for _ in range(50)] == [s2(logits, []) for _ in range(50)]
    assert len(set(a)) == 1
    draws = np.bincount([Sampler(params, seed=None)(logits, []) for _ in range(3000)], minlength=3) / 3000
    assert draws == pytest.approx([0.6, 0.3, 0.1], abs=0.04)


@pytest.mark.parametrize("n, k", [(262144, 40), (151936, 1), (100, 40), (4097, 64), (1000, 999)])
def test_top_k_candidates_are_the_k_largest_ties_to_the_lower_id(n, k):
    """Against a full stable sort, on logits with many ties (rounded) and a vocabulary not a multiple of the
    first pass's blocks."""
    logits = np.round(np.random.default_rng(n).standard_normal(n) * 4).astype(np.float32)
    logits[-1] = 99.0  # the largest in the last, partial block
    assert top_k_candidates(logits, k).tolist() == np.argsort(-logits, kind="stable")[:k].tolist()
