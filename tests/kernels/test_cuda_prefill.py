"""The prefill matmuls against models/dequant.py. Needs a GPU.

Every type, fresh random valid blocks per process, real shapes, fresh activations per case, outputs and the
scratch poisoned with NaN first.
- fp16 path (dequantize tiles + cuBLAS): the dequantized tile is bit-identical to models/dequant.py's
  float32 values rounded to fp16 (the kernel forms the same float32 value, then rounds once); y against
  x @ W.T in float64 from the unrounded float32 x and W: the fp16 rounding of both inputs (2^-11 relative
  each, averaging out over a dot product) bounds it at REL_TOL = 1e-3 of the output's norm; and against the
  float64 product of the fp16-rounded inputs at 1e-5: what is left is float32 accumulation (fp16
  accumulation would miss this by two orders of magnitude).
- q8 path (few tokens, dp4a): against the dequantized weight times the q8_1 activations the kernel read, in
  float64, at 1e-5 as the decode matvec test: int8 products are exact, the rest is float32 rounding.
"""
import functools

import numpy as np
import pytest

from kernels.bench.cuda import TYPES, random_weight_bytes
from models.dequant import dequantize
from models.ggml_types import TYPES_BY_NAME

pytestmark = pytest.mark.gpu

REL_TOL = 1e-3  # vs the float32 inputs: fp16 rounding of x and W
REL_TOL_FP16_INPUTS = 1e-5  # vs the fp16-rounded inputs: float32 accumulation only
REL_TOL_Q8 = 1e-5  # q8 path vs the q8_1 activations it read
REL_TOL_Q8_FLOAT_X = 2e-2  # q8 path vs float32 x: q8_1 rounds x to ~0.5 % rms
SHAPES = [(4096, 4096), (1024, 4096)]  # rows x cols: llama3-8b wq / wo, wk / wv
N_TOKENS = [1, 7, 64, 512]
N_TOKENS_Q8 = [1, 7, 8, 9, 16]  # one pass of 8 tokens, partial and whole, and two
SMALL_BATCH = 8  # kernels.cuda.prefill.SMALL_BATCH, which imports CuPy: CI collects this file without it
QUANT_TYPES = [t for t in TYPES if t not in ("F32", "F16", "BF16")]
TILE_ROWS = 1500  # scratch rows: 4096 rows run as tiles of 1472, 1472, 1152; 1024 rows as one tile


@pytest.fixture(scope="module")
def cuda():
    import cupy as cp

    import kernels.cuda.prefill as cpf
    import kernels.cuda.quant as cq

    return cp, cq, cpf


@functools.cache
def weight(name, n_rows, n_cols):
    """(raw bytes, float32 reference [n_rows, n_cols]) of fresh random blocks, one draw per process."""
    seed = int(np.random.SeedSequence().generate_state(1)[0])
    raw = random_weight_bytes(TYPES_BY_NAME[name], n_rows, n_cols, seed=seed)
    return raw, dequantize(raw, TYPES_BY_NAME[name], (n_cols, n_rows))


def rel_err(out, ref):
    return float(np.linalg.norm(out - ref) / np.linalg.norm(ref))


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"{s[0]}x{s[1]}")
@pytest.mark.parametrize("name", TYPES)
def test_matmul_f16_matches_reference_dequantize(cuda, name, shape):
    cp, cq, cpf = cuda
    n_rows, n_cols = shape
    raw, w_ref = weight(name, n_rows, n_cols)
    w = cq.to_device(raw, TYPES_BY_NAME[name])
    scratch = cpf.Scratch.empty(max(N_TOKENS), n_cols, TILE_ROWS * n_cols)
    w_ref_dev = cp.asarray(w_ref, dtype=cp.float64)  # the float64 products run on the device
    w16_ref_dev = cp.asarray(w_ref.astype(np.float16), dtype=cp.float64)
    rng = np.random.default_rng()
    for n_tokens in N_TOKENS:
        x = rng.standard_normal((n_tokens, n_cols)).astype(np.float32)
        x16 = cp.asarray(x.astype(np.float16))
        out = cp.full((n_tokens, n_rows), cp.nan, dtype=cp.float32)
        scratch.w16.fill(cp.nan)
        cpf.matmul_f16(w, x16, out, scratch)
        out = cp.asnumpy(out).astype(np.float64)
        assert np.isfinite(out).all(), f"{name} n_tokens={n_tokens}: {np.isnan(out).sum()} outputs not written"
        ref = cp.asnumpy(cp.asarray(x, dtype=cp.float64) @ w_ref_dev.T)
        ref16 = cp.asnumpy(x16.astype(cp.float64) @ w16_ref_dev.T)
        err, err16 = rel_err(out, ref), rel_err(out, ref16)
        assert err < REL_TOL, f"{name} n_tokens={n_tokens}: relative error {err:.2e} vs float32 inputs"
        assert err16 < REL_TOL_FP16_INPUTS, f"{name} n_tokens={n_tokens}: {err16:.2e} vs fp16-rounded inputs"


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"{s[0]}x{s[1]}")
@pytest.mark.parametrize("name", QUANT_TYPES)
def test_matmul_q8_matches_reference_dequantize(cuda, name, shape):
    cp, cq, cpf = cuda
    n_rows, n_cols = shape
    raw, w_ref = weight(name, n_rows, n_cols)
    w = cq.to_device(raw, TYPES_BY_NAME[name])
    w_ref_dev = cp.asarray(w_ref, dtype=cp.float64)
    rng = np.random.default_rng()
    for n_tokens in N_TOKENS_Q8:
        n_padded = -(-n_tokens // cpf.NT) * cpf.NT
        x = rng.standard_normal((n_padded, n_cols)).astype(np.float32)  # pad rows: real data, never stored
        xq = cq.Q8Vector.empty(n_padded * n_cols)
        cq.quantize_q8_1(cp.asarray(x).reshape(-1), xq)
        out = cp.full((n_tokens, n_rows), cp.nan, dtype=cp.float32)
        cpf.matmul_q8(w, xq, n_tokens, out)
        out = cp.asnumpy(out).astype(np.float64)
        assert np.isfinite(out).all(), f"{name} n_tokens={n_tokens}: {np.isnan(out).sum()} outputs not written"
        x_used = xq.qs.astype(cp.float64).reshape(-1, 32) * xq.ds[:, :1]  # the q8_1 values the kernel read
        ref = cp.asnumpy(x_used.reshape(n_padded, n_cols)[:n_tokens] @ w_ref_dev.T)
        err = rel_err(out, ref)
        assert err < REL_TOL_Q8, f"{name} n_tokens={n_tokens}: relative error {err:.2e}"


@pytest.mark.parametrize("n_tokens", [SMALL_BATCH, SMALL_BATCH + 1])
def test_matmul_takes_each_path_and_reuses_scratch(cuda, n_tokens):
    """matmul() from float32 x: q8 up to SMALL_BATCH tokens (q8_1 error), fp16 above (fp16 error only),
    one scratch for weights of two shapes."""
    cp, cq, cpf = cuda
    assert cpf.SMALL_BATCH == SMALL_BATCH
    tol = REL_TOL_Q8_FLOAT_X if n_tokens <= cpf.SMALL_BATCH else REL_TOL
    scratch = cpf.Scratch.empty(64, 4096, TILE_ROWS * 4096)
    for n_rows in (4096, 1024):
        raw, w_ref = weight("Q4_K", n_rows, 4096)
        w = cq.to_device(raw, TYPES_BY_NAME["Q4_K"])
        x = np.random.default_rng().standard_normal((n_tokens, 4096)).astype(np.float32)
        out = cp.full((n_tokens, n_rows), cp.nan, dtype=cp.float32)
        cpf.matmul(w, cp.asarray(x), out, scratch)
        ref = cp.asnumpy(cp.asarray(x, dtype=cp.float64) @ cp.asarray(w_ref, dtype=cp.float64).T)
        err = rel_err(cp.asnumpy(out).astype(np.float64), ref)
        assert err < tol, f"{n_tokens} tokens x {n_rows} rows: relative error {err:.2e}"


@pytest.mark.parametrize("name", [t for t in TYPES if t != "F16"])  # F16 is multiplied in place
def test_dequantized_tile_is_reference_rounded_to_fp16(cuda, name):
    """Rows 1000 .. 2499 of a 4096x4096 weight, compared bit for bit."""
    cp, cq, cpf = cuda
    raw, w_ref = weight(name, 4096, 4096)
    w = cq.to_device(raw, TYPES_BY_NAME[name])
    tile = cp.full(1500 * 4096, cp.nan, dtype=cp.float16)
    cpf.dequantize_rows(w, 1000, 1500, tile)
    got = cp.asnumpy(tile).reshape(1500, 4096)
    want = w_ref[1000:2500].astype(np.float16)
    assert np.array_equal(got.view(np.uint16), want.view(np.uint16)), \
        f"{name}: {(got.view(np.uint16) != want.view(np.uint16)).sum()} values differ"


def test_small_ragged_shape(cuda):
    """3 rows, one Q4_K block a row, tiles of one row."""
    cp, cq, cpf = cuda
    raw, w_ref = weight("Q4_K", 3, 256)
    w = cq.to_device(raw, TYPES_BY_NAME["Q4_K"])
    x = np.random.default_rng().standard_normal((5, 256)).astype(np.float32)
    ref = x.astype(np.float64) @ w_ref.T.astype(np.float64)
    out = cp.full((5, 3), cp.nan, dtype=cp.float32)
    cpf.matmul_f16(w, cp.asarray(x.astype(np.float16)), out, cpf.Scratch.empty(5, 256, 256))
    assert rel_err(cp.asnumpy(out), ref) < REL_TOL
    out = cp.full((5, 3), cp.nan, dtype=cp.float32)
    cpf.matmul(w, cp.asarray(x), out, cpf.Scratch.empty(5, 256, 256))
    assert rel_err(cp.asnumpy(out), ref) < REL_TOL_Q8_FLOAT_X


def test_outputs_that_take_the_rows_in_turn(cuda):
    """matmul_f16 into a fused weight's members (a list of outputs, W's rows in turn), across tile boundaries:
    the columns of the one-output product (up to cuBLAS's order of summing); a list that leaves rows out is
    refused."""
    cp, cq, cpf = cuda
    raw, _ = weight("Q4_K", 200, 256)
    w = cq.to_device(raw, TYPES_BY_NAME["Q4_K"])
    x16 = cp.asarray(np.random.default_rng(1).standard_normal((9, 256)).astype(np.float16))
    whole = cp.empty((9, 200), dtype=cp.float32)
    cpf.matmul_f16(w, x16, whole, cpf.Scratch.empty(9, 256, 256 * 200))
    for tile_rows in (200, 64):  # one tile; tiles of 64 rows, which the members' edges cross
        parts = [cp.full((9, r), cp.nan, dtype=cp.float32) for r in (70, 2, 128)]
        cpf.matmul_f16(w, x16, parts, cpf.Scratch.empty(9, 256, 256 * tile_rows))
        assert rel_err(cp.asnumpy(cp.concatenate(parts, axis=1)), cp.asnumpy(whole)) < REL_TOL_FP16_INPUTS
    with pytest.raises(ValueError, match="out must take the 200 rows"):
        cpf.matmul_f16(w, x16, parts[:2], cpf.Scratch.empty(9, 256, 256 * 200))


def test_bad_inputs_raise(cuda):
    cp, cq, cpf = cuda
    w = cq.to_device(random_weight_bytes(TYPES_BY_NAME["Q4_K"], 8, 512), TYPES_BY_NAME["Q4_K"])
    scratch = cpf.Scratch.empty(4, 512, 8 * 512)
    x16 = cp.ones((4, 512), dtype=cp.float16)
    with pytest.raises(ValueError, match="x16 must be"):
        cpf.matmul_f16(w, x16.astype(cp.float32), cp.empty((4, 8), dtype=cp.float32), scratch)
    with pytest.raises(ValueError, match="x must be"):
        cpf.matmul(w, x16, cp.empty((4, 8), dtype=cp.float32), scratch)
    with pytest.raises(ValueError, match="out must be"):
        cpf.matmul_f16(w, x16, cp.empty((4, 9), dtype=cp.float32), scratch)
    with pytest.raises(ValueError, match="cannot hold a row"):
        cpf.matmul_f16(w, x16, cp.empty((4, 8), dtype=cp.float32), cpf.Scratch.empty(4, 512, 100))
    with pytest.raises(ValueError, match="need"):  # 40 tokens, scratch for 4
        cpf.matmul(w, cp.ones((40, 512), dtype=cp.float32), cp.empty((40, 8), dtype=cp.float32), scratch)
