"""The CUDA matvec kernels against models/dequant.py (itself bit-exact with gguf-py). Needs a GPU.

Every type, random valid blocks at real shapes, fresh inputs per case, output poisoned with NaN first.
Quantized weights multiply the q8_1 activation, so the reference is the dequantized weight times the
dequantized q8_1 activation the kernel read back from the device, in float64: what remains is float32
rounding in the kernel (int8 products are exact in int32), bounded here by 1e-5 of the output's norm.
"""
import numpy as np
import pytest

from kernels.bench.cuda import TYPES, random_weight_bytes
from models.dequant import dequantize
from models.ggml_types import TYPES_BY_NAME

pytestmark = pytest.mark.gpu

REL_TOL = 1e-5
SHAPES = [(1024, 4096), (2048, 8192), (3, 256)]  # rows x cols: llama3-8b wk, llama-1b ffn_down, a ragged grid
MATVEC_PAIRS = [("Q3_K", "Q5_K"), ("Q4_K", "Q6_K"), ("Q5_K", "Q6_K")]  # kernels/cuda/quant.MATVEC_PAIRS


@pytest.fixture(scope="module")
def cuda():
    import cupy as cp

    import kernels.cuda.quant as cq

    return cp, cq


def run_matvec(cp, cq, raw, qtype, x, threads_per_row=None):
    """(out, x actually used) for weight bytes raw [n_rows, row_bytes] and float32 x, on the device."""
    w = cq.to_device(raw, qtype)
    x_dev = cp.asarray(x)
    out = cp.full(w.n_rows, cp.nan, dtype=cp.float32)
    if w.takes_q8:
        xq = cq.Q8Vector.empty(w.n_cols)
        cq.quantize_q8_1(x_dev, xq)
        cq.matvec(w, xq, out, threads_per_row=threads_per_row)
        ds = cp.asnumpy(xq.ds)
        x_used = (cp.asnumpy(xq.qs).astype(np.float64).reshape(-1, 32) * ds[:, :1]).reshape(-1)
    else:
        cq.matvec(w, x_dev, out, threads_per_row=threads_per_row)
        x_used = x.astype(np.float64)
    return cp.asnumpy(out), x_used


def check(out, raw, name, x_used):
    ref = dequantize(raw, TYPES_BY_NAME[name], (x_used.size, raw.shape[0])).astype(np.float64) @ x_used
    assert np.isfinite(out).all(), f"{np.isnan(out).sum()} outputs not written"
    err = np.linalg.norm(out - ref) / np.linalg.norm(ref)
    assert err < REL_TOL, f"{name}: relative error {err:.2e}"


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"{s[0]}x{s[1]}")
@pytest.mark.parametrize("name", TYPES)
def test_matvec_matches_reference_dequantize(cuda, name, shape):
    cp, cq = cuda
    qtype = TYPES_BY_NAME[name]
    seed = int(np.random.SeedSequence().generate_state(1)[0])  # fresh inputs every run
    raw = random_weight_bytes(qtype, *shape, seed=seed)
    x = np.random.default_rng(seed).standard_normal(shape[1]).astype(np.float32)
    out, x_used = run_matvec(cp, cq, raw, qtype, x)
    check(out, raw, name, x_used)


@pytest.mark.parametrize("threads_per_row", [32, 64, 128])
@pytest.mark.parametrize("name", ["Q4_K", "Q6_K", "Q8_0", "F16"])
def test_every_threads_per_row_is_right(cuda, name, threads_per_row):
    cp, cq = cuda
    qtype = TYPES_BY_NAME[name]
    raw = random_weight_bytes(qtype, 77, 4096, seed=threads_per_row)
    x = np.random.default_rng(threads_per_row).standard_normal(4096).astype(np.float32)
    out, x_used = run_matvec(cp, cq, raw, qtype, x, threads_per_row)
    check(out, raw, name, x_used)


@pytest.mark.parametrize("name", ["Q4_K", "Q6_K", "Q8_0", "F16"])
def test_matvec_adds_residual(cuda, name):
    """residual: out = W . x + residual in the same launch, also in place (out is the residual)."""
    cp, cq = cuda
    qtype = TYPES_BY_NAME[name]
    rng = np.random.default_rng(np.random.SeedSequence().generate_state(1)[0])
    raw = random_weight_bytes(qtype, 300, 2048, seed=int(rng.integers(1 << 31)))
    x = rng.standard_normal(2048).astype(np.float32)
    r = rng.standard_normal(300).astype(np.float32)
    w = cq.to_device(raw, qtype)
    xin = cq.Q8Vector.empty(2048) if w.takes_q8 else cp.asarray(x)
    if w.takes_q8:
        cq.quantize_q8_1(cp.asarray(x), xin)
    plain, added = cp.full(300, cp.nan, dtype=cp.float32), cp.full(300, cp.nan, dtype=cp.float32)
    in_place = cp.asarray(r)
    cq.matvec(w, xin, plain)
    cq.matvec(w, xin, added, residual=cp.asarray(r))
    cq.matvec(w, xin, in_place, residual=in_place)
    np.testing.assert_array_equal(cp.asnumpy(added), cp.asnumpy(plain) + r)  # the same float32 add
    np.testing.assert_array_equal(cp.asnumpy(in_place), cp.asnumpy(added))


@pytest.mark.parametrize("pair", MATVEC_PAIRS, ids="-".join)
@pytest.mark.parametrize("swapped", [False, True])
def test_matvec_pair_equals_two_matvecs(cuda, pair, swapped):
    """Two types in one launch (a Q4_K_M layer's q, k and its Q6_K attn_v): each output equals its own
    matvec's bit for bit (the same threads per row, so the same sums), in either order of the two; and a
    ragged row count, so the second matrix's blocks start mid-grid."""
    cp, cq = cuda
    assert set(MATVEC_PAIRS) == cq.MATVEC_PAIRS
    rng = np.random.default_rng(np.random.SeedSequence().generate_state(1)[0])
    names = pair[::-1] if swapped else pair
    ws = [cq.to_device(random_weight_bytes(TYPES_BY_NAME[n], rows, 2048, seed=int(rng.integers(1 << 31))),
                       TYPES_BY_NAME[n]) for n, rows in zip(names, (4096 + 1, 512))]
    xq = cq.Q8Vector.empty(2048)
    cq.quantize_q8_1(cp.asarray(rng.standard_normal(2048).astype(np.float32)), xq)
    alone = [cp.full(w.n_rows, cp.nan, dtype=cp.float32) for w in ws]
    for w, out in zip(ws, alone):
        cq.matvec(w, xq, out)
    together = [cp.full(w.n_rows, cp.nan, dtype=cp.float32) for w in ws]
    assert cq.pairs_in_one_launch(*ws)
    cq.matvec_pair(*ws, xq, *together)
    for a, b in zip(alone, together):
        np.testing.assert_array_equal(cp.asnumpy(b), cp.asnumpy(a))


def matvec_tokens_inputs(cp, cq, rng, name: str, rows: int, cols: int, n_tokens: int) -> tuple:
    """A random weight of a type in VRAM and n_tokens random x as matvec_tokens takes them (q8_1 where the type
    does, else float32)."""
    qtype = TYPES_BY_NAME[name]
    w = cq.to_device(random_weight_bytes(qtype, rows, cols, seed=int(rng.integers(1 << 31))), qtype)
    x = cp.asarray(rng.standard_normal((n_tokens, cols)).astype(np.float32))
    if w.takes_q8:
        xq = cq.Q8Vector.empty(n_tokens * cols)
        cq.quantize_q8_1(x.reshape(-1), xq)
        x = xq
    return w, x


@pytest.mark.parametrize("n_tokens", [1, 2, 3, 4, 5, 8])
@pytest.mark.parametrize("name", TYPES)
def test_matvec_tokens_equals_a_matvec_a_token(cuda, name, n_tokens):
    """matvec_tokens (a verify step's matmuls: one pass over W for up to 8 tokens) against matvec of each token's x
    alone: the same int32 sums of a block's products, added in another order (the tensor cores' kernels of Q4_K and
    Q6_K) or the same (the others), so equal up to float32 rounding; a ragged row count, the residual added, every
    token its own x and residual. Float types take float32 x."""
    cp, cq = cuda
    rng = np.random.default_rng(np.random.SeedSequence().generate_state(1)[0])
    rows, cols = 1027, 2048
    w, x = matvec_tokens_inputs(cp, cq, rng, name, rows, cols, n_tokens)
    res = cp.asarray(rng.standard_normal((n_tokens, rows)).astype(np.float32))
    out = cp.full((n_tokens, rows), cp.nan, dtype=cp.float32)
    cq.matvec_tokens(w, x, n_tokens, out, residual=res)
    out = cp.asnumpy(out)
    for j in range(n_tokens):
        alone = cp.full(rows, cp.nan, dtype=cp.float32)
        if w.takes_q8:
            x_j = cq.Q8Vector(x.qs[j * cols:(j + 1) * cols], x.ds[j * cols // 32:(j + 1) * cols // 32])
        else:
            x_j = x[j]
        cq.matvec(w, x_j, alone, residual=res[j])
        alone = cp.asnumpy(alone)
        np.testing.assert_allclose(out[j], alone, rtol=1e-6, atol=1e-6 * np.abs(alone).max(), err_msg=f"token {j}")
    if n_tokens > 1:
        assert not np.allclose(out[0], out[-1])


@pytest.mark.parametrize("name", ["Q4_K", "Q6_K", "Q8_0", "IQ4_XS", "F32"])
@pytest.mark.parametrize("n_tokens", [3, 6])
def test_matvec_tokens_parts_are_the_rows_of_one_output(cuda, name, n_tokens):
    """A row group's members split out by matvec_tokens itself (backend_cuda._matmul_parts in a verify step): each
    part's [n_tokens, its rows] contiguous in turn holds exactly the columns of the output without parts (the tensor
    cores', the Items' and the float kernels; parts of 3 to 1000 rows, one not a multiple of a 16-row tile)."""
    cp, cq = cuda
    rng = np.random.default_rng(np.random.SeedSequence().generate_state(1)[0])
    rows, cols, parts = 1027, 512, (3, 520, 1000)
    w, x = matvec_tokens_inputs(cp, cq, rng, name, rows, cols, n_tokens)
    whole = cp.full((n_tokens, rows), cp.nan, dtype=cp.float32)
    cq.matvec_tokens(w, x, n_tokens, whole)
    split = cp.full((n_tokens, rows), cp.nan, dtype=cp.float32)
    cq.matvec_tokens(w, x, n_tokens, split, parts=parts)
    whole, flat = cp.asnumpy(whole), cp.asnumpy(split).reshape(-1)
    for first, end in zip((0,) + parts, parts + (rows,)):
        part = flat[n_tokens * first:n_tokens * end].reshape(n_tokens, end - first)
        np.testing.assert_array_equal(part, whole[:, first:end], err_msg=f"rows {first}..{end}")
    with pytest.raises(ValueError, match="parts must be up to 3 ascending rows"):
        cq.matvec_tokens(w, x, n_tokens, split, parts=(520, 3))


def test_matvec_tokens_refuses_wrong_inputs(cuda):
    cp, cq = cuda
    w = cq.to_device(random_weight_bytes(TYPES_BY_NAME["Q4_K"], 64, 256, seed=0), TYPES_BY_NAME["Q4_K"])
    with pytest.raises(ValueError, match="1 to 8 tokens"):
        cq.matvec_tokens(w, cq.Q8Vector.empty(9 * 256), 9, cp.zeros((9, 64), cp.float32))
    with pytest.raises(ValueError, match="Q8Vector of 2 x 256"):
        cq.matvec_tokens(w, cp.zeros((2, 256), cp.float32), 2, cp.zeros((2, 64), cp.float32))
    f16 = cq.to_device(random_weight_bytes(TYPES_BY_NAME["F16"], 64, 256, seed=0), TYPES_BY_NAME["F16"])
    with pytest.raises(ValueError, match="take a contiguous, 16-byte-aligned float32 x"):
        cq.matvec_tokens(f16, cq.Q8Vector.empty(2 * 256), 2, cp.zeros((2, 64), cp.float32))


def test_quantize_q8_1_matches_numpy(cuda):
    cp, cq = cuda
    x = np.random.default_rng().standard_normal(14336).astype(np.float32) * 3
    x[:32] = 0.0  # an all-zero block must give d = 0, not NaN
    xq = cq.Q8Vector.empty(x.size)
    cq.quantize_q8_1(cp.asarray(x), xq)
    qs, ds = cp.asnumpy(xq.qs), cp.asnumpy(xq.ds)
    d = np.abs(x.reshape(-1, 32)).max(axis=1) / np.float32(127)
    np.testing.assert_allclose(ds[:, 0], d, rtol=1e-6)
    ref = np.round(x.reshape(-1, 32) / np.where(d == 0, 1, d)[:, None]).reshape(-1)
    assert np.abs(qs - ref).max() <= 1 and (qs == ref).mean() > 0.999  # division rounding at ties only
    np.testing.assert_allclose(ds[:, 1], ds[:, 0] * qs.reshape(-1, 32).sum(axis=1), rtol=1e-6)


def test_graph_capture_replays_with_new_inputs(cuda):
    """quantize + matvec captured once, replayed on new x: no allocation or sync inside."""
    cp, cq = cuda
    qtype = TYPES_BY_NAME["Q4_K"]
    raw = random_weight_bytes(qtype, 1024, 4096, seed=5)
    w = cq.to_device(raw, qtype)
    x = cp.empty(4096, dtype=cp.float32)
    xq = cq.Q8Vector.empty(4096)
    out = cp.empty(1024, dtype=cp.float32)
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        x[...] = 1.0
        cq.quantize_q8_1(x, xq, stream)  # compile outside capture
        cq.matvec(w, xq, out, stream)
        stream.synchronize()
        stream.begin_capture()
        cq.quantize_q8_1(x, xq, stream)
        cq.matvec(w, xq, out, stream)
        graph = stream.end_capture()
        for seed in (1, 2):
            x_host = np.random.default_rng(seed).standard_normal(4096).astype(np.float32)
            x.set(x_host, stream=stream)
            out.fill(cp.nan)
            graph.launch(stream)
            stream.synchronize()
            ds = cp.asnumpy(xq.ds)
            x_used = (cp.asnumpy(xq.qs).astype(np.float64).reshape(-1, 32) * ds[:, :1]).reshape(-1)
            check(cp.asnumpy(out), raw, "Q4_K", x_used)
            assert np.abs(x_used - x_host).max() <= np.abs(x_host).max() / 127  # it read the new x


def test_bad_inputs_raise(cuda):
    cp, cq = cuda
    qtype = TYPES_BY_NAME["Q4_K"]
    w = cq.to_device(random_weight_bytes(qtype, 8, 256), qtype)
    out = cp.empty(8, dtype=cp.float32)
    with pytest.raises(ValueError, match="Q8Vector"):
        cq.matvec(w, cp.zeros(256, dtype=cp.float32), out)
    with pytest.raises(ValueError, match="out must be"):
        cq.matvec(w, cq.Q8Vector.empty(256), cp.empty(9, dtype=cp.float32))
    with pytest.raises(ValueError, match="no CUDA matvec kernel"):
        cq.to_device(np.zeros((1, 66), dtype=np.uint8), TYPES_BY_NAME["TQ2_0"])
