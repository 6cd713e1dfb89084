"""The Gated DeltaNet kernels (kernels/cuda/deltanet.py) against the float64 reference
(tests/kernels/deltanet_reference.py). Needs a GPU.

Fresh random inputs every run, outputs poisoned with NaN first so an unwritten element fails; errors are
||out - ref|| / ||ref|| (an indexing or race bug gives errors of order 1: planting kh = h // (Hv / Hk) for
h % Hk failed 63 of these tests). Bounds, a few times the largest error measured on an H200:
- conv_silu: four float32 products and a sum a value: CONV_TOL; its state is a copy of inputs (exact).
- delta_rule token by token: float32 arithmetic on a state carried over the tokens, up to 1.2e-6 over 1100
  tokens: REC_TOL.
- delta_rule in chunks: the products on tensor cores with every float32 split into two tf32 parts (float32
  accuracy), T = (I + A)^-1 by float32 forward substitution, the sums in another order than token by token:
  up to 7.4e-6 over 1100 tokens, against the reference and against the token-by-token kernel alike: CHUNK_TOL.
  Plain tf32 (one product of the rounded operands) measured 5e-4 and would fail it.
"""
import numpy as np
import pytest

from tests.kernels import deltanet_reference as ref
from tests.kernels.test_cuda_ops import rel_err, rng  # noqa: F401 (rng: the fixture, fresh every run)

pytestmark = pytest.mark.gpu

CONV_TOL = 1e-6
REC_TOL = 5e-6
CHUNK_TOL = 3e-5
EPS = 1e-6
DECAYS = ("typical", "weak", "strong")


@pytest.fixture(scope="module")
def cuda():
    import cupy as cp

    import kernels.cuda.deltanet as dn

    return cp, dn


def layer_inputs(rng, n, Hk, Hv, S, decay):
    """float32 inputs of delta_rule for n tokens. decay (per token, g = softplus(alpha + dt_bias) * a):
    typical ~ -0.5, weak ~ -0.01 (a state that hardly forgets over a chunk), strong ~ -10 (exp(g) ~ 5e-5)."""
    C = (2 * Hk + Hv) * S
    log_a = {"typical": (-1.0, 0.0), "weak": (-5.5, -4.5), "strong": (1.5, 2.0)}[decay]
    shift = 2.0 if decay == "strong" else 0.0
    f32 = lambda x: np.asarray(x, np.float32)  # noqa: E731
    return dict(y=f32(rng.standard_normal((n, C))), alpha=f32(rng.standard_normal((n, Hv)) + shift),
                beta=f32(rng.standard_normal((n, Hv))), dt_bias=f32(rng.standard_normal(Hv) * 0.5),
                a=f32(-np.exp(rng.uniform(*log_a, Hv))), z=f32(rng.standard_normal((n, Hv * S))),
                norm_w=f32(1 + 0.1 * rng.standard_normal(S)), state=f32(0.5 * rng.standard_normal((Hv, S, S))))


def reference(x, Hk):
    o, state = ref.delta_rule(x["y"], x["alpha"], x["beta"], x["dt_bias"], x["a"], x["state"], Hk, EPS)
    return ref.gated_norm(o, x["z"], x["norm_w"], EPS), state


def run_delta_rule(cp, dn, x, Hk, chunked, stream=None):
    """(out, state after) of one delta_rule call on x, as numpy."""
    d = {k: cp.asarray(v) for k, v in x.items()}
    n, Hv, S = len(x["y"]), x["state"].shape[0], x["state"].shape[1]
    out = cp.full((n, Hv * S), cp.nan, dtype=cp.float32)
    dn.delta_rule(d["y"], d["alpha"], d["beta"], d["dt_bias"], d["a"], d["z"], d["norm_w"], d["state"], out, Hk,
                  EPS, stream=stream, chunked=chunked)
    return cp.asnumpy(out), cp.asnumpy(d["state"])


# ---- conv ----

@pytest.mark.parametrize("n", [1, 2, 3, 64, 65, 200])
@pytest.mark.parametrize("C", [768, 1000])
def test_conv_silu_matches_reference(cuda, rng, n, C):
    cp, dn = cuda
    x = rng.standard_normal((n, C)).astype(np.float32)
    state = rng.standard_normal((3, C)).astype(np.float32)
    w = rng.standard_normal((C, 4)).astype(np.float32)
    expect, expect_state = ref.conv_silu(x, state, w)
    d_state, out = cp.asarray(state), cp.full((n, C), cp.nan, dtype=cp.float32)
    dn.conv_silu(cp.asarray(x), d_state, cp.asarray(w), out)
    assert rel_err(cp.asnumpy(out), expect) < CONV_TOL
    np.testing.assert_array_equal(cp.asnumpy(d_state), expect_state.astype(np.float32))


# ---- delta rule ----

@pytest.mark.parametrize("chunked", [False, True], ids=["tokens", "chunks"])
@pytest.mark.parametrize("decay", DECAYS)
@pytest.mark.parametrize("n", [1, 3, 64, 65, 200])
@pytest.mark.parametrize("S", [64, 128])
def test_delta_rule_matches_reference(cuda, rng, S, n, decay, chunked):
    cp, dn = cuda
    Hk, Hv = 2, 4
    x = layer_inputs(rng, n, Hk, Hv, S, decay)
    expect, expect_state = reference(x, Hk)
    out, state = run_delta_rule(cp, dn, x, Hk, chunked)
    tol = CHUNK_TOL if chunked else REC_TOL
    e_out, e_state = rel_err(out, expect), rel_err(state, expect_state)
    print(f"S {S} n {n} {decay} {'chunks' if chunked else 'tokens'}: out {e_out:.2e} state {e_state:.2e}")
    assert e_out < tol and e_state < tol


def test_decode_steps_equal_one_prompt_call(cuda, rng):
    """n decode steps (one token a call) give what one call over the n tokens does: bit for bit token by token
    (the same arithmetic), within CHUNK_TOL in chunks."""
    cp, dn = cuda
    Hk, Hv, S, n = 2, 6, 128, 70
    x = layer_inputs(rng, n, Hk, Hv, S, "typical")
    d = {k: cp.asarray(v) for k, v in x.items()}
    out = cp.full((n, Hv * S), cp.nan, dtype=cp.float32)
    for t in range(n):
        dn.delta_rule(d["y"][t:t + 1], d["alpha"][t:t + 1], d["beta"][t:t + 1], d["dt_bias"], d["a"],
                      d["z"][t:t + 1], d["norm_w"], d["state"], out[t:t + 1], Hk, EPS)
    steps, steps_state = cp.asnumpy(out), cp.asnumpy(d["state"])
    tokens, tokens_state = run_delta_rule(cp, dn, x, Hk, chunked=False)
    np.testing.assert_array_equal(steps, tokens)
    np.testing.assert_array_equal(steps_state, tokens_state)
    chunks, chunks_state = run_delta_rule(cp, dn, x, Hk, chunked=True)
    assert rel_err(chunks, steps) < CHUNK_TOL and rel_err(chunks_state, steps_state) < CHUNK_TOL


@pytest.mark.parametrize("n", [1, 5, 40])
def test_snapshots_are_the_states_after_each_token(cuda, rng, n):
    """A call over n tokens with snapshots (a verify step's) writes, into row t, the conv and delta states that
    t + 1 one-token calls leave: bit for bit (the same arithmetic), and its outputs and final states are the call's
    without them. n 40 takes two of conv_silu's token blocks; rows past n stay as they were."""
    cp, dn = cuda
    Hk, Hv, S, C = 2, 6, 128, (2 * 2 + 6) * 128
    x = layer_inputs(rng, n, Hk, Hv, S, "typical")
    conv_in = rng.standard_normal((n, C)).astype(np.float32)
    conv_state, conv_w = rng.standard_normal((3, C)).astype(np.float32), rng.standard_normal((C, 4)).astype(np.float32)
    d = {k: cp.asarray(v) for k, v in x.items()}
    conv_rows = cp.full((n + 1, 3, C), cp.nan, dtype=cp.float32)
    delta_rows = cp.full((n + 1, Hv, S, S), cp.nan, dtype=cp.float32)
    y, out = cp.empty((n, C), dtype=cp.float32), cp.empty((n, Hv * S), dtype=cp.float32)
    c_state = cp.asarray(conv_state)
    dn.conv_silu(cp.asarray(conv_in), c_state, cp.asarray(conv_w), y, snapshots=conv_rows)
    dn.delta_rule(d["y"], d["alpha"], d["beta"], d["dt_bias"], d["a"], d["z"], d["norm_w"], d["state"], out, Hk,
                  EPS, snapshots=delta_rows)
    plain, plain_state = run_delta_rule(cp, dn, x, Hk, chunked=False)
    np.testing.assert_array_equal(cp.asnumpy(out), plain)
    np.testing.assert_array_equal(cp.asnumpy(d["state"]), plain_state)
    step_conv, step_delta = cp.asarray(conv_state), cp.asarray(x["state"])
    for t in range(n):
        dn.conv_silu(cp.asarray(conv_in[t:t + 1]), step_conv, cp.asarray(conv_w), y[t:t + 1])
        dn.delta_rule(d["y"][t:t + 1], d["alpha"][t:t + 1], d["beta"][t:t + 1], d["dt_bias"], d["a"],
                      d["z"][t:t + 1], d["norm_w"], step_delta, out[t:t + 1], Hk, EPS)
        np.testing.assert_array_equal(cp.asnumpy(conv_rows[t]), cp.asnumpy(step_conv))
        np.testing.assert_array_equal(cp.asnumpy(delta_rows[t]), cp.asnumpy(step_delta))
    assert np.isnan(cp.asnumpy(conv_rows[n])).all() and np.isnan(cp.asnumpy(delta_rows[n])).all()
    with pytest.raises(ValueError, match="token by token"):
        dn.delta_rule(d["y"], d["alpha"], d["beta"], d["dt_bias"], d["a"], d["z"], d["norm_w"], d["state"], out, Hk,
                      EPS, chunked=True, snapshots=delta_rows)
    with pytest.raises(ValueError, match="snapshots must be"):
        dn.conv_silu(cp.asarray(conv_in), c_state, cp.asarray(conv_w), y, snapshots=conv_rows[:n - 1])


@pytest.mark.parametrize("decay", DECAYS)
def test_chunks_equal_tokens_on_a_long_prompt(cuda, rng, decay):
    """1100 tokens (17 whole chunks and a part) at the real models' key-head tiling (Hv = 3 Hk): the chunked
    kernel equals the token-by-token one and the reference."""
    cp, dn = cuda
    Hk, Hv, S, n = 2, 6, 128, 1100
    x = layer_inputs(rng, n, Hk, Hv, S, decay)
    expect, expect_state = reference(x, Hk)
    tokens, tokens_state = run_delta_rule(cp, dn, x, Hk, chunked=False)
    chunks, chunks_state = run_delta_rule(cp, dn, x, Hk, chunked=True)
    errs = [rel_err(chunks, tokens), rel_err(chunks_state, tokens_state), rel_err(tokens, expect),
            rel_err(tokens_state, expect_state), rel_err(chunks, expect), rel_err(chunks_state, expect_state)]
    print(f"{decay}: chunks~tokens out {errs[0]:.2e} state {errs[1]:.2e}; tokens~ref {errs[2]:.2e} {errs[3]:.2e};"
          f" chunks~ref {errs[4]:.2e} {errs[5]:.2e}")
    assert max(errs[:2] + errs[4:]) < CHUNK_TOL and max(errs[2:4]) < REC_TOL


def test_decode_step_captures_into_a_graph(cuda, rng):
    """conv_silu then delta_rule on one token, captured once with programmatic launches: 3 replays give what
    3 eager steps give, bit for bit."""
    cp, dn = cuda
    from kernels.cuda.module import programmatic_launches

    Hk, Hv, S = 2, 4, 128
    C = (2 * Hk + Hv) * S
    x = layer_inputs(rng, 3, Hk, Hv, S, "typical")
    d = {k: cp.asarray(v) for k, v in x.items()}
    w = cp.asarray(rng.standard_normal((C, 4)).astype(np.float32))
    conv0 = rng.standard_normal((3, C)).astype(np.float32)
    qkv, y, conv_state, state = (cp.empty((1, C), dtype=cp.float32), cp.empty((1, C), dtype=cp.float32),
                                 cp.empty((3, C), dtype=cp.float32), cp.empty_like(d["state"]))
    alpha, beta, z, out = (cp.empty((1, Hv), dtype=cp.float32), cp.empty((1, Hv), dtype=cp.float32),
                           cp.empty((1, Hv * S), dtype=cp.float32), cp.empty((1, Hv * S), dtype=cp.float32))
    stream = cp.cuda.Stream(non_blocking=True)

    def step():
        dn.conv_silu(qkv, conv_state, w, y, stream)
        dn.delta_rule(y, alpha, beta, d["dt_bias"], d["a"], z, d["norm_w"], state, out, Hk, EPS, stream)

    def run(launch):
        conv_state.set(conv0, stream=stream)
        state.set(x["state"], stream=stream)
        outs = []
        for t in range(3):
            qkv.set(x["y"][t:t + 1], stream=stream)
            alpha.set(x["alpha"][t:t + 1], stream=stream)
            beta.set(x["beta"][t:t + 1], stream=stream)
            z.set(x["z"][t:t + 1], stream=stream)
            launch()
            stream.synchronize()
            outs.append(cp.asnumpy(out))
        return outs, cp.asnumpy(state), cp.asnumpy(conv_state)

    with stream:
        eager = run(step)
        stream.begin_capture()
        with programmatic_launches():
            step()
        graph = stream.end_capture()
        replayed = run(lambda: graph.launch(stream))
    for a, b in zip(eager[0], replayed[0]):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(eager[1], replayed[1])
    np.testing.assert_array_equal(eager[2], replayed[2])
    assert np.isfinite(eager[0]).all() and np.abs(eager[0][2]).sum() > 0


def test_bad_inputs_raise(cuda):
    cp, dn = cuda
    f = lambda *s: cp.zeros(s, dtype=cp.float32)  # noqa: E731
    with pytest.raises(ValueError):
        dn.conv_silu(f(2, 8), f(3, 8), f(8, 3), f(2, 8))  # K = 3
    with pytest.raises(ValueError):
        dn.delta_rule(f(1, 6 * 32), f(1, 2), f(1, 2), f(2), f(2), f(1, 64), f(32), f(2, 32, 32), f(1, 64), 2, EPS)
    with pytest.raises(ValueError):  # y of the wrong width for 2 key heads
        dn.delta_rule(f(1, 5 * 64), f(1, 2), f(1, 2), f(2), f(2), f(1, 128), f(64), f(2, 64, 64), f(1, 128), 2, EPS)
