"""The CPU's Gated DeltaNet ops against the float64 reference (tests/kernels/deltanet_reference.py), and the
reference's chunked form (the GPU prompt kernel's algorithm) against its per-token definition."""
import numpy as np
import pytest

from kernels.cpu import deltanet as cpu_deltanet
from tests.kernels import deltanet_reference as ref

EPS = 1e-6


def weight(a: np.ndarray) -> np.ndarray:
    """a read-only, as the file's mmap gives the engine its weights: the kernels compile once for those."""
    a.flags.writeable = False
    return a


def inputs(rng, n, n_k, n_v, S, K=4, decay=1.0):
    """Random inputs of one DeltaNet layer at the scales a model gives them; decay scales -a (larger: the state
    forgets faster)."""
    C = (2 * n_k + n_v) * S
    return dict(
        y=rng.standard_normal((n, C)).astype(np.float32),
        alpha=rng.standard_normal((n, n_v)).astype(np.float32),
        beta=rng.standard_normal((n, n_v)).astype(np.float32),
        dt_bias=weight(rng.standard_normal(n_v).astype(np.float32)),
        a=weight((-np.exp(rng.standard_normal(n_v) * 0.5) * decay).astype(np.float32)),
        z=rng.standard_normal((n, n_v * S)).astype(np.float32),
        norm_w=weight((1 + 0.1 * rng.standard_normal(S)).astype(np.float32)),
        state=(rng.standard_normal((n_v, S, S)) * 0.1).astype(np.float32),
    )


def reference(d, n_k):
    o, state = ref.delta_rule(d["y"], d["alpha"], d["beta"], d["dt_bias"], d["a"], d["state"], n_k, EPS)
    return ref.gated_norm(o, d["z"], d["norm_w"], EPS), state


def ours(d, n_k):
    state = d["state"].copy()
    out = cpu_deltanet.delta_rule(d["y"], d["alpha"], d["beta"], d["dt_bias"], d["a"], d["z"], d["norm_w"], state,
                                  n_k, EPS)
    return out, state


@pytest.mark.parametrize("n", [1, 3, 17])
@pytest.mark.parametrize("K", [4, 2])
def test_conv_silu_against_reference(n, K):
    rng = np.random.default_rng(n * 10 + K)
    C = 96
    x = rng.standard_normal((n, C)).astype(np.float32)
    state = rng.standard_normal((K - 1, C)).astype(np.float32)
    w = weight(rng.standard_normal((C, K)).astype(np.float32))
    want_y, want_state = ref.conv_silu(x, state, w)
    y = cpu_deltanet.conv_silu(x, state, cpu_deltanet.conv_taps(w))  # moves state on in place
    np.testing.assert_allclose(y, want_y, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(state, want_state, rtol=0, atol=0)


def test_conv_silu_token_by_token_equals_one_call():
    rng = np.random.default_rng(1)
    x = rng.standard_normal((9, 40)).astype(np.float32)
    w = weight(rng.standard_normal((40, 4)).astype(np.float32))
    s1, s2 = np.zeros((3, 40), np.float32), np.zeros((3, 40), np.float32)
    taps = cpu_deltanet.conv_taps(w)
    whole = cpu_deltanet.conv_silu(x, s1, taps)
    steps = np.concatenate([cpu_deltanet.conv_silu(x[t:t + 1], s2, taps) for t in range(9)])
    np.testing.assert_array_equal(steps, whole)  # the same floats: a verify step's tokens go one at a time
    np.testing.assert_array_equal(s1, s2)


@pytest.mark.parametrize("n,n_k,n_v,S", [(1, 2, 4, 16), (5, 2, 4, 32), (70, 2, 6, 16), (130, 1, 2, 64)])
def test_delta_rule_against_reference(n, n_k, n_v, S):
    """Value heads outnumber key heads, so reading key head h // r instead of h % Hk fails here."""
    d = inputs(np.random.default_rng(n + S), n, n_k, n_v, S)
    want, want_state = reference(d, n_k)
    got, state = ours(d, n_k)
    np.testing.assert_allclose(got, want, rtol=2e-3, atol=2e-3)
    np.testing.assert_allclose(state, want_state, rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("decay", [0.01, 1.0, 30.0])
def test_chunked_form_equals_the_definition(decay):
    """The reference's chunked form over a long prompt (several chunks and a partial one) equals its token by token
    definition, with decays near 0 (the state keeps everything), typical and strong (it forgets within a few
    tokens): the algorithm the GPU's prompt kernel runs, checked in float64."""
    n_k, n_v, S = 2, 4, 64
    d = inputs(np.random.default_rng(7), 3 * 64 + 21, n_k, n_v, S, decay=decay)
    args = (d["y"], d["alpha"], d["beta"], d["dt_bias"], d["a"], d["state"], n_k, EPS)
    o, state = ref.delta_rule(*args)
    o_chunked, state_chunked = ref.delta_rule_chunked(*args)
    assert np.abs(o).max() > 0.1
    np.testing.assert_allclose(o_chunked, o, rtol=1e-9, atol=1e-9 * np.abs(o).max())
    np.testing.assert_allclose(state_chunked, state, rtol=1e-9, atol=1e-9 * np.abs(state).max())


def test_decode_steps_equal_one_prompt():
    """Tokens fed one call at a time carry the state on exactly as one call over all of them."""
    n_k, n_v, S = 2, 4, 32
    d = inputs(np.random.default_rng(3), 24, n_k, n_v, S)
    whole, whole_state = ours(d, n_k)
    state = d["state"].copy()
    steps = [cpu_deltanet.delta_rule(d["y"][t:t + 1], d["alpha"][t:t + 1], d["beta"][t:t + 1], d["dt_bias"], d["a"],
                                     d["z"][t:t + 1], d["norm_w"], state, n_k, EPS) for t in range(24)]
    np.testing.assert_allclose(np.concatenate(steps), whole, rtol=2e-3, atol=2e-3)
    np.testing.assert_allclose(state, whole_state, rtol=1e-3, atol=1e-4)


def test_snapshots_are_the_states_a_token_at_a_time_gives():
    """A verify step's delta rule keeps the state after each of its tokens (snapshots) in one call: the same floats
    as calls of one token each (a decode step's), its outputs too, so that a rewind to any of them and the reply
    after it are decode's."""
    n_k, n_v, S, n = 2, 4, 32, 5
    d = inputs(np.random.default_rng(4), n, n_k, n_v, S)
    state, snapshots = d["state"].copy(), np.zeros((n, n_v, S, S), np.float32)
    whole = cpu_deltanet.delta_rule(d["y"], d["alpha"], d["beta"], d["dt_bias"], d["a"], d["z"], d["norm_w"], state,
                                    n_k, EPS, snapshots)
    state1 = d["state"].copy()
    for t in range(n):
        step = cpu_deltanet.delta_rule(d["y"][t:t + 1], d["alpha"][t:t + 1], d["beta"][t:t + 1], d["dt_bias"], d["a"],
                                       d["z"][t:t + 1], d["norm_w"], state1, n_k, EPS)
        np.testing.assert_array_equal(whole[t:t + 1], step)
        np.testing.assert_array_equal(snapshots[t], state1)
    np.testing.assert_array_equal(state, state1)
    with pytest.raises(ValueError, match="snapshots"):  # more rows than tokens
        cpu_deltanet.delta_rule(d["y"][:2], d["alpha"][:2], d["beta"][:2], d["dt_bias"], d["a"], d["z"][:2],
                                d["norm_w"], state, n_k, EPS, snapshots[:3])
