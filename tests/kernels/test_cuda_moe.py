"""The mixture-of-experts kernels (kernels/cuda/moe.py) against numpy: routing against kernels/cpu/ops.route,
the expert matvecs against models/dequant.py. Needs a GPU.

As in test_cuda_quant.py, the reference multiplies the dequantized weights by the q8_1 activation the kernel
read back from the device, in float64, so only float32 rounding remains (REL_TOL of the output's norm).
"""
import numpy as np
import pytest

from kernels.bench.cuda import TYPES, random_weight_bytes
from kernels.cpu.ops import route
from models.dequant import dequantize
from models.ggml_types import TYPES_BY_NAME

pytestmark = pytest.mark.gpu

REL_TOL = 1e-5
QUANT_TYPES = [t for t in TYPES if t not in ("F16", "BF16", "F32")]


@pytest.fixture(scope="module")
def cuda():
    import cupy as cp

    import kernels.cuda.moe as moe
    import kernels.cuda.quant as cq

    return cp, cq, moe


@pytest.mark.parametrize("n_tok, n_expert, k", [(1, 128, 8), (7, 128, 8), (300, 60, 4), (3, 8, 8)])
def test_route_matches_cpu(cuda, n_tok, n_expert, k):
    cp, _, moe = cuda
    logits = np.random.default_rng(n_tok).standard_normal((n_tok, n_expert)).astype(np.float32) * 3
    logits[0, [5, 2]] = 20.0  # a tie at the top: the lower id first
    ids, weights = cp.full((n_tok, k), -1, cp.int32), cp.full((n_tok, k), cp.nan, cp.float32)
    moe.route(cp.asarray(logits), ids, weights)
    ref_ids, ref_weights = route(logits, k)
    np.testing.assert_array_equal(cp.asnumpy(ids), ref_ids)
    np.testing.assert_allclose(cp.asnumpy(weights), ref_weights, rtol=1e-5, atol=1e-7)
    assert list(cp.asnumpy(ids)[0, :2]) == [2, 5]


def test_scale_weights_by_the_chosen_experts_scales(cuda):
    """gemma4's per-expert output scales folded into the route's weights: weights[t, j] * scales[ids[t, j]]."""
    cp, _, moe = cuda
    rng = np.random.default_rng(0)
    ids = rng.integers(0, 128, (5, 8)).astype(np.int32)
    weights, scales = rng.random((5, 8)).astype(np.float32), rng.random(128).astype(np.float32) + 0.5
    w_dev = cp.asarray(weights)
    moe.scale_weights(cp.asarray(ids), w_dev, cp.asarray(scales))
    np.testing.assert_array_equal(cp.asnumpy(w_dev), weights * scales[ids])


def _stack(name, n_expert, n_rows, n_cols, seed):
    qtype = TYPES_BY_NAME[name]
    raw = np.stack([random_weight_bytes(qtype, n_rows, n_cols, seed=seed + e) for e in range(n_expert)])
    return raw, qtype


def _dense(raw, qtype, e):
    n_rows = raw.shape[1]
    return dequantize(raw[e], qtype, (raw[e].size // n_rows // qtype.block_bytes * qtype.block_elems, n_rows))


def _q8(cp, cq, x):
    """x [n, cols] quantized on the device, and the float64 values the kernels read."""
    xq = cq.Q8Vector.empty(x.size)
    cq.quantize_q8_1(cp.asarray(x.reshape(-1)), xq)
    used = cp.asnumpy(xq.qs).astype(np.float64).reshape(-1, 32) * cp.asnumpy(xq.ds)[:, :1]
    return xq, used.reshape(x.shape)


def _ids(n_tok, n_expert, k, seed):
    rng = np.random.default_rng(seed)
    return np.stack([rng.permutation(n_expert)[:k] for _ in range(n_tok)]).astype(np.int32)


def _biases(n, n_expert, rows, seed):
    """n expert biases float32 [n_expert, rows] as gpt-oss's (std 0.5, about the products' own spread here)."""
    rng = np.random.default_rng(seed)
    return [(rng.standard_normal((n_expert, rows)) * 0.5).astype(np.float32) for _ in range(n)]


def _rel_err(out, ref):
    assert np.isfinite(out).all(), f"{np.isnan(out).sum()} outputs not written"
    return np.linalg.norm(out - ref) / np.linalg.norm(ref)


@pytest.mark.parametrize("n_tok, biased", [(1, False), (5, False), (5, True)])
@pytest.mark.parametrize("name", QUANT_TYPES)
def test_gate_up_matches_reference(cuda, name, n_tok, biased):
    """Two stacks (gate, up) of 16 experts [768, 2048] (Qwen3-30B-A3B's expert shape), 4 chosen a token; biased: the
    up stack's chosen expert's bias added (gpt-oss), the gate's none."""
    cp, cq, moe = cuda
    n_expert, k, rows, cols = 16, 4, 768, 2048
    stacks = [_stack(name, n_expert, rows, cols, seed) for seed in (0, 100)]
    ws = tuple(moe.experts_to_device(raw, qtype) for raw, qtype in stacks)
    biases = [None, _biases(1, n_expert, rows, 3)[0] if biased else None]
    ids = _ids(n_tok, n_expert, k, n_tok)
    x = np.random.default_rng(1).standard_normal((n_tok, cols)).astype(np.float32)
    xq, x_used = _q8(cp, cq, x)
    out = cp.full((2, n_tok * k, rows), cp.nan, cp.float32)
    moe.gate_up(ws, cp.asarray(ids), xq, out, tuple(None if b is None else cp.asarray(b) for b in biases))
    out = cp.asnumpy(out)
    for z, (raw, qtype) in enumerate(stacks):
        for p in range(n_tok * k):
            ref = _dense(raw, qtype, ids.flat[p]).astype(np.float64) @ x_used[p // k]
            if biases[z] is not None:
                ref += biases[z][ids.flat[p]]
            assert _rel_err(out[z, p], ref) < REL_TOL, (name, z, p)


@pytest.mark.parametrize("n_tok, biased", [(1, False), (5, False), (1, True), (5, True)])
@pytest.mark.parametrize("name", QUANT_TYPES)
def test_down_weights_sums_and_adds_the_residual(cuda, name, n_tok, biased):
    """16 experts [2048, 768], 4 a token: out = residual + the weighted sum of the chosen experts' products (biased:
    each plus its expert's bias, gpt-oss)."""
    cp, cq, moe = cuda
    n_expert, k, rows, cols = 16, 4, 2048, 768
    raw, qtype = _stack(name, n_expert, rows, cols, 7)
    w = moe.experts_to_device(raw, qtype)
    bias = _biases(1, n_expert, rows, 4)[0] if biased else np.zeros((n_expert, rows), np.float32)
    bias_dev = cp.asarray(bias) if biased else None
    ids = _ids(n_tok, n_expert, k, 10 + n_tok)
    rng = np.random.default_rng(2)
    weights = rng.dirichlet(np.ones(k), n_tok).astype(np.float32)
    x = rng.standard_normal((n_tok * k, cols)).astype(np.float32)
    residual = rng.standard_normal((n_tok, rows)).astype(np.float32)
    xq, x_used = _q8(cp, cq, x)
    out = cp.full((n_tok, rows), cp.nan, cp.float32)
    moe.down(w, cp.asarray(ids), cp.asarray(weights), xq, out, cp.asarray(residual), bias_dev)
    ref = residual.astype(np.float64)
    for t in range(n_tok):
        for j in range(k):
            ref[t] += weights[t, j] * (_dense(raw, qtype, ids[t, j]).astype(np.float64) @ x_used[t * k + j]
                                       + bias[ids[t, j]])
    assert _rel_err(cp.asnumpy(out) - residual, ref - residual) < REL_TOL
    # in place: out is the residual
    res = cp.asarray(residual)
    moe.down(w, cp.asarray(ids), cp.asarray(weights), xq, res, res, bias_dev)
    assert _rel_err(cp.asnumpy(res) - residual, ref - residual) < REL_TOL


def test_an_expert_is_read_from_its_own_place(cuda):
    """Choosing expert 3 gives expert 3's product, not a neighbour's, in a type whose blocks the layout splits."""
    cp, cq, moe = cuda
    raw, qtype = _stack("Q6_K", 6, 256, 512, 3)  # Q6_K repacks (its d moves to the meta part)
    w = moe.experts_to_device(raw, qtype)
    xq, x_used = _q8(cp, cq, np.random.default_rng(4).standard_normal((1, 512)).astype(np.float32))
    out = cp.full((1, 1, 256), cp.nan, cp.float32)
    moe.gate_up((w,), cp.asarray([[3]], dtype=cp.int32), xq, out)
    got = cp.asnumpy(out)[0, 0]
    errs = [_rel_err(got, _dense(raw, qtype, e).astype(np.float64) @ x_used[0]) for e in range(6)]
    assert np.argmin(errs) == 3 and errs[3] < REL_TOL, errs


@pytest.mark.parametrize("name", ["Q4_K", "Q5_K", "Q6_K", "MXFP4"])
def test_stacks_read_in_place_from_host_memory_match_vram(cuda, name):
    """Experts left in pinned host memory in the file's layout (experts_in_host_memory: Q6_K and MXFP4 through
    kernels of their own, whose 210- and 17-byte blocks lie at even and at any offsets) give what the same stacks in VRAM give: gate, up and glu,
    then the weighted downs, for 3 of 4 chosen slots (a view of the ids, as the GPU's share of a token's experts
    is). A host stack whose bytes were shifted by one block gives a clearly different result (the check can fail)."""
    cp, cq, moe = cuda
    import cupyx
    n_expert, k, d, f = 16, 4, 1024, 768
    stacks = [_stack(name, n_expert, f, d, 0), _stack(name, n_expert, f, d, 100), _stack(name, n_expert, d, f, 7)]
    vram = [moe.experts_to_device(raw, qtype) for raw, qtype in stacks]

    def in_host(raw, qtype, shift=0):
        pinned = cupyx.empty_pinned(raw.shape, np.uint8)
        pinned.reshape(-1)[:] = np.roll(raw.reshape(-1), shift)
        return moe.experts_in_host_memory(pinned, qtype)

    host = [in_host(raw, qtype) for raw, qtype in stacks]
    assert all(w.in_host for w in host) and host[2].kernels == name.lower() + ("_file" if name in ("Q6_K", "MXFP4") else "")
    ids = cp.asarray(_ids(1, n_expert, k, 5))[:, 1:]  # slots 1..3
    weights = cp.asarray(np.random.default_rng(3).dirichlet(np.ones(k), 1).astype(np.float32))[:, 1:]
    xq, _ = _q8(cp, cq, np.random.default_rng(1).standard_normal((1, d)).astype(np.float32))
    residual = cp.asarray(np.random.default_rng(2).standard_normal((1, d)).astype(np.float32))

    def ffn(gate, up, down):
        act, act_q = cp.empty((k - 1, f), cp.float32), cq.Q8Vector.empty((k - 1) * f)
        moe.gate_up_glu(gate, up, ids, xq, act, act_q, "silu")
        out = cp.full((1, d), cp.nan, cp.float32)
        moe.down(down, ids, weights, act_q, out, residual)
        return cp.asnumpy(act), cp.asnumpy(out)

    (act_v, out_v), (act_h, out_h) = ffn(*vram), ffn(*host)
    assert _rel_err(act_h, act_v) < REL_TOL and _rel_err(out_h, out_v) < REL_TOL
    shifted = in_host(*stacks[2], shift=stacks[2][1].block_bytes)
    assert _rel_err(ffn(*host[:2], shifted)[1] - cp.asnumpy(residual), out_v - cp.asnumpy(residual)) > 0.1


@pytest.mark.parametrize("name", ["Q4_K", "Q5_K", "Q6_K", "MXFP4"])
def test_gate_and_up_read_in_place_from_one_stacked_tensor(cuda, name):
    """gemma4's gate and up as views of its one stack ffn_gate_up_exps [n_expert, 2 f, row_bytes] (each expert's f
    gate rows, then its f up rows; inference/weights.py) in pinned host memory, read in place by gate_up_glu
    (experts_in_host_memory: gap_rows f, so moe_gate_up_glu_* step 2 f rows from one expert to the next, and up's
    pointer lies f rows past gate's): bit for bit what the same kernel gives on gate and up copied out into pinned
    stacks of their own (the same bytes and kernel; only where an expert's rows begin differs). The chosen experts
    include the first and the last (the views' span ends at the last expert's last up row), two tokens.
    The same views read without the gap (gap_rows 0: the stride the kernels took before) give a clearly different
    result, so the comparison can fail. Planted in reasoning, not run (no GPU where this was written): up's view one
    row late (stacked[:, f + 1:], or the kernel's wu one row on) makes every up row the next row's, independent
    random bytes: the bit comparison fails at once; the kernel stepping n_rows instead of expert_rows is the gap_rows
    0 case above."""
    import dataclasses

    import cupyx
    cp, cq, moe = cuda
    n_expert, k, d, f = 8, 4, 512, 256
    raw, qtype = _stack(name, n_expert, 2 * f, d, 11)
    stacked = cupyx.empty_pinned(raw.shape, np.uint8)
    stacked[:] = raw
    gate, up = (moe.experts_in_host_memory(stacked[:, rows], qtype) for rows in (slice(0, f), slice(f, 2 * f)))
    assert (gate.gap_rows, gate.expert_rows, gate.n_rows, gate.n_expert) == (f, 2 * f, f, n_expert)
    assert up.weight.data.data.ptr - gate.weight.data.data.ptr == f * raw.shape[2]
    assert gate.weight.data.data.ptr == stacked.ctypes.data and gate.weight.data.nbytes == raw.nbytes - f * raw.shape[2]

    def own_stack(rows):
        pinned = cupyx.empty_pinned((n_expert, f, raw.shape[2]), np.uint8)
        pinned[:] = raw[:, rows]
        return moe.experts_in_host_memory(pinned, qtype)

    apart = own_stack(slice(0, f)), own_stack(slice(f, 2 * f))
    assert apart[0].gap_rows == 0
    ids = cp.asarray([[n_expert - 1, 0, 5, 2], [3, n_expert - 1, 1, 6]], dtype=cp.int32)
    xq, _ = _q8(cp, cq, np.random.default_rng(1).standard_normal((2, d)).astype(np.float32))

    def glu(g, u):
        act, act_q = cp.full((2 * k, f), cp.nan, cp.float32), cq.Q8Vector.empty(2 * k * f)
        moe.gate_up_glu(g, u, ids, xq, act, act_q, "gelu")
        return cp.asnumpy(act), cp.asnumpy(act_q.qs), cp.asnumpy(act_q.ds)

    in_place, copied = glu(gate, up), glu(*apart)
    assert np.isfinite(in_place[0]).all() and np.abs(in_place[0]).max() > 0
    for a, b in zip(in_place, copied):
        np.testing.assert_array_equal(a, b)
    no_gap = glu(*(dataclasses.replace(w, gap_rows=0) for w in (gate, up)))[0]
    assert _rel_err(no_gap[k:], copied[0][k:]) > 0.5  # the second token: no slot of expert 0


@pytest.mark.parametrize("n_expert, k, n_embd, biased", [(128, 8, 2048, False), (60, 4, 4096, False), (8, 2, 1024, False),
                                                         (32, 4, 2880, True)])
def test_norm_router_route_is_the_norm_then_router_then_route(cuda, n_expert, k, n_embd, biased):
    """One launch: h = rms_norm(x, norm) (and its q8_1 copy), the F32 router's logits of h (biased: plus the router's
    bias, gpt-oss-20b's shape), then the choice of the block that finishes last, twice in a row (the finished-blocks
    count goes back to zero)."""
    cp, cq, moe = cuda
    rng = np.random.default_rng(n_expert)
    router = (rng.standard_normal((n_expert, n_embd)) / 20).astype(np.float32)
    bias = (rng.standard_normal(n_expert) * 2).astype(np.float32) if biased else np.zeros(n_expert, np.float32)
    norm = rng.uniform(0.5, 1.5, n_embd).astype(np.float32)
    w = cq.to_device(router.view(np.uint8), TYPES_BY_NAME["F32"])
    done = cp.zeros(1, cp.uint32)
    for seed in (1, 2):
        x = (np.random.default_rng(seed).standard_normal(n_embd) * 3).astype(np.float32)
        h, logits = cp.full(n_embd, cp.nan, cp.float32), cp.full(n_expert, cp.nan, cp.float32)
        hq = cq.Q8Vector(cp.zeros(n_embd, cp.int8), cp.full((n_embd // 32, 2), cp.nan, cp.float32))
        ids, weights = cp.full((1, k), -1, cp.int32), cp.full((1, k), cp.nan, cp.float32)
        moe.norm_router_route(cp.asarray(x), cp.asarray(norm), 1e-6, w, h, hq, logits, ids, weights, done,
                              cp.asarray(bias) if biased else None)
        ref_h = x.astype(np.float64) / np.sqrt((x.astype(np.float64) ** 2).mean() + 1e-6) * norm
        np.testing.assert_allclose(cp.asnumpy(h), ref_h, rtol=1e-5, atol=1e-6)
        qs, ds = cp.asnumpy(hq.qs).astype(np.float64), cp.asnumpy(hq.ds)
        np.testing.assert_allclose((qs.reshape(-1, 32) * ds[:, :1]).ravel(), ref_h, atol=np.abs(ref_h).max() / 100)
        np.testing.assert_allclose(cp.asnumpy(logits), router.astype(np.float64) @ ref_h + bias, rtol=1e-4, atol=1e-4)
        ref_ids, ref_weights = route(cp.asnumpy(logits)[None], k)  # the choice from the logits it computed
        np.testing.assert_array_equal(cp.asnumpy(ids), ref_ids)
        np.testing.assert_allclose(cp.asnumpy(weights), ref_weights, rtol=1e-5, atol=1e-7)
        assert int(done[0]) == 0


# the GLUs of the expert kernels: each model's, gpt-oss's with its biases
GLUS = [("silu", False), ("swiglu_oai", True)]


@pytest.mark.parametrize("activation, biased", GLUS, ids=[a for a, _ in GLUS])
@pytest.mark.parametrize("n_tok", [1, 3])
@pytest.mark.parametrize("name", QUANT_TYPES)
def test_gate_up_glu_matches_reference(cuda, name, n_tok, activation, biased):
    """gate, up and the GLU of the chosen experts in one launch (biased: the experts' gate and up biases added first),
    and its q8_1 copy, against gate_up's outputs (themselves checked against models/dequant.py above) and glu."""
    cp, cq, moe = cuda
    from kernels.cuda.ops import glu
    n_expert, k, rows, cols = 16, 4, 768, 2048
    ws = tuple(moe.experts_to_device(*_stack(name, n_expert, rows, cols, seed)) for seed in (0, 100))
    biases = tuple(cp.asarray(b) for b in _biases(2, n_expert, rows, 5)) if biased else None
    ids = cp.asarray(_ids(n_tok, n_expert, k, n_tok))
    xq, _ = _q8(cp, cq, np.random.default_rng(1).standard_normal((n_tok, cols)).astype(np.float32))
    gate_up = cp.empty((2, n_tok * k, rows), cp.float32)
    moe.gate_up(ws, ids, xq, gate_up, biases)
    ref = cp.empty((n_tok * k, rows), cp.float32)
    glu(gate_up[0], gate_up[1], ref, activation)
    out, out_q = cp.full((n_tok * k, rows), cp.nan, cp.float32), cq.Q8Vector.empty(n_tok * k * rows)
    moe.gate_up_glu(*ws, ids, xq, out, out_q, activation, biases)
    out, ref = cp.asnumpy(out), cp.asnumpy(ref)
    assert _rel_err(out, ref) < REL_TOL
    back = cp.asnumpy(out_q.qs).astype(np.float64).reshape(-1, 32) * cp.asnumpy(out_q.ds)[:, :1]
    assert np.abs(back.reshape(out.shape) - out).max() <= np.abs(out).max() / 127  # within a q8_1 step


def _skewed_ids(n_tok, n_expert, k, seed):
    """Every token chooses expert 1 (more pairs than a tile holds), expert 0 is never chosen."""
    rng = np.random.default_rng(seed)
    return np.stack([[1] + list(2 + rng.permutation(n_expert - 2)[:k - 1]) for _ in range(n_tok)]).astype(np.int32)


@pytest.mark.parametrize("n_tok, n_expert, k", [(100, 8, 4), (3, 128, 8), (512, 128, 8)])
def test_sort_pairs_orders_pairs_by_expert_in_tiles(cuda, n_tok, n_expert, k):
    cp, _, moe = cuda
    ids = _skewed_ids(n_tok, n_expert, k, n_tok)
    pairs = moe.sort_pairs(cp.asarray(ids), n_expert)
    order, tiles, n_tiles = cp.asnumpy(pairs.order), cp.asnumpy(pairs.tiles), int(pairs.n_tiles[0])
    flat = ids.reshape(-1)
    np.testing.assert_array_equal(order, np.argsort(flat, kind="stable"))  # by expert, pair order within one
    counts = np.bincount(flat, minlength=n_expert)
    assert n_tiles == sum(-(-c // moe.MM_TILE_PAIRS) for c in counts) <= len(tiles)
    covered = []
    for e, begin, end, _ in tiles[:n_tiles]:
        assert 0 < end - begin <= moe.MM_TILE_PAIRS and (flat[order[begin:end]] == e).all()
        covered += range(begin, end)
    assert covered == list(range(flat.size))


@pytest.mark.parametrize("activation, biased", GLUS, ids=[a for a, _ in GLUS])
@pytest.mark.parametrize("name", QUANT_TYPES)
def test_grouped_matmuls_match_reference(cuda, name, activation, biased):
    """The prompt path's grouped kernels over skewed routing (one expert's pairs fill two tiles, one expert has
    none; 200 rows: a partial row block): each pair's gate, up and glu (fp16 out) and a down product
    (fp32 out, the pairs' own rows) against models/dequant.py in float64 (biased: each product plus its expert's
    bias, gpt-oss). Planting a wrong row (e * n_rows + r0 + r + 1 in load_weight_tile) failed all 10 types (rel err
    1.41, or NaN from rows past the stack; H100, 2026-11-25)."""
    cp, cq, moe = cuda
    from kernels.cpu.ops import glu
    n_tok, n_expert, k, rows, cols = 40, 6, 3, 200, 768
    (g_raw, qtype), (u_raw, _) = (_stack(name, n_expert, rows, cols, seed) for seed in (0, 100))
    gate, up = moe.experts_to_device(g_raw, qtype), moe.experts_to_device(u_raw, qtype)
    # the products here spread ~0.05 (x / 32): biases of that size, so that a bias left out shows
    b_gate, b_up, b_down = ([b / 10 for b in _biases(3, n_expert, rows, 6)] if biased else
                            [np.zeros((n_expert, rows), np.float32)] * 3)
    dev = (lambda b: cp.asarray(b)) if biased else (lambda b: None)  # noqa: E731
    ids = _skewed_ids(n_tok, n_expert, k, 7)
    pairs = moe.sort_pairs(cp.asarray(ids), n_expert)
    x = (np.random.default_rng(2).standard_normal((n_tok, cols)) / 32).astype(np.float16)  # glu stays in fp16
    act = cp.full((n_tok * k, rows), cp.nan, cp.float16)
    moe.gate_up_glu_grouped(gate, up, cp.asarray(x), k, pairs, act, activation, (dev(b_gate), dev(b_up)))
    down = cp.full((n_tok * k, rows), cp.nan, cp.float32)
    x_pairs = (np.random.default_rng(3).standard_normal((n_tok * k, cols)) / 32).astype(np.float16)
    moe.matmul_grouped(gate, cp.asarray(x_pairs), 1, pairs, down, dev(b_down))
    dense = {e: (_dense(g_raw, qtype, e).astype(np.float64), _dense(u_raw, qtype, e).astype(np.float64))
             for e in np.unique(ids)}
    flat = ids.reshape(-1)
    ref_act = glu(np.stack([dense[e][0] @ x[p // k] + b_gate[e] for p, e in enumerate(flat)]),
                  np.stack([dense[e][1] @ x[p // k] + b_up[e] for p, e in enumerate(flat)]), activation)
    ref_down = np.stack([dense[e][0] @ x_pairs[p] + b_down[e] for p, e in enumerate(flat)])
    assert _rel_err(cp.asnumpy(act).astype(np.float64), ref_act) < 2e-3  # fp16 weights, inputs and outputs
    assert _rel_err(cp.asnumpy(down), ref_down) < 2e-3


def test_combine_weights_a_tokens_rows_onto_the_residual(cuda):
    cp, _, moe = cuda
    rng = np.random.default_rng(4)
    n_tok, k, n_embd = 5, 3, 300
    x, y = rng.standard_normal((n_tok, n_embd)), rng.standard_normal((n_tok * k, n_embd))
    weights = rng.random((n_tok, k))
    out = cp.full((n_tok, n_embd), cp.nan, cp.float32)
    moe.combine(*(cp.asarray(a, cp.float32) for a in (x, y, weights)), out)
    ref = x + (y.reshape(n_tok, k, n_embd) * weights[:, :, None]).sum(axis=1)
    np.testing.assert_allclose(cp.asnumpy(out), ref, rtol=1e-5, atol=1e-5)
