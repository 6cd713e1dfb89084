"""The CPU kernels against gguf-py's reference dequantization (and ours, models/dequant.py), every type.

The int8 matvecs (INT8_IDS, up to MATVEC_MAX_TOKENS tokens) and the int8 GEMM (INT8_IDS, more tokens) are held
to x8 @ W.T, x8 the int8-quantized x (in blocks of 256 for Q4_K and Q6_K's matvecs, else 32), as tightly as the
float32 ones to x @ W.T; x8 itself is checked against x."""
import numba as nb
import numpy as np
import pytest
from gguf.constants import GGMLQuantizationType
from gguf.quants import dequantize

from kernels.cpu import dot_int8 as cpu_dot_int8, gemm_int8 as cpu_gemm_int8, ir as cpu_ir, quant as cpu_quant
from kernels.bench.cpu import F16_FIELDS, random_weight
from kernels.cpu.dot_int8 import quantize_q8
from kernels.cpu.quant import MATVEC_MAX_TOKENS, dequantize_rows, matvecs, quantized_matmul, quantized_matmuls
from kernels.cpu.types import BLOCK32_IDS, F16_TO_F32, INT8_IDS, MXFP4
from models import dequant
from models.ggml_types import TYPES_BY_NAME

TYPES = ["F32", "F16", "BF16", *F16_FIELDS]


def reference(w: np.ndarray, name: str) -> np.ndarray:
    """gguf-py's dequantization of w: float32 [n_rows, n_cols]."""
    return dequantize(w, GGMLQuantizationType[name]).astype(np.float32)


def x_block(name: str, n_tokens: int) -> int:
    """The values of x under one scale in the int8 matvec (or GEMM: more tokens) of this weight type (the IQ types:
    256 in both, as llama.cpp's q8_K)."""
    if TYPES_BY_NAME[name].id in cpu_quant.IQ_K256_IDS:
        return 256
    return 32 if TYPES_BY_NAME[name].id in BLOCK32_IDS or n_tokens > MATVEC_MAX_TOKENS else 256


def int8_kind(name: str) -> bool:
    """Whether this type's kernels dot int8-quantized x (MXFP4's with fp16 scales, q8_0_x)."""
    return TYPES_BY_NAME[name].id in INT8_IDS


def int8_x(x: np.ndarray, block: int) -> np.ndarray:
    """x as the int8 matvecs see it: float32 [n_tokens, n_cols], quantized by the kernels' quantize_q8."""
    xq = np.empty(x.shape, np.int8)
    xd = np.empty((x.shape[0], x.shape[1] // block), np.float32)
    quantize_q8(x, xq, xd, np.empty((x.shape[0], x.shape[1] // 16), np.int16))
    return (xq.reshape(len(x), -1, block) * xd[:, :, None]).reshape(x.shape)


def q8_0_x(x: np.ndarray) -> np.ndarray:
    """x as the MXFP4 kernel sees it: llama.cpp's q8_0 blocks (cpu_quant.q8_0_blocks: int8 x fp16 scales)."""
    xq, xd = cpu_quant.q8_0_blocks(np.ascontiguousarray(x, np.float32))
    return (xq.reshape(len(x), -1, 32) * xd[:, :, None]).reshape(x.shape)


def host_vnni() -> bool:
    """Whether numba compiles for a CPU with AVX-512 VNNI here (the kernels then dot bytes with vpdpbusd)."""
    from numba.core.registry import cpu_target
    return cpu_ir.vnni(cpu_target.target_context)


def host_simd_paths() -> list[str]:
    """The cpu_ir.simd paths this CPU runs, widest first: code for a wider one than the host has cannot be
    compiled here (LLVM cannot select AVX-512 instructions for an AVX2-only target), so the paths are compared
    where they run; CI's AVX2 machines compare AVX2 with generic IR, AVX-512 machines all three."""
    from numba.core.registry import cpu_target
    paths = ["avx512bw", "avx2", ""]
    return paths[paths.index(cpu_ir.simd(cpu_target.target_context)):]


def host_vnni_paths() -> list[bool]:
    """vpdpbusd (True) where the host has it, and generic IR (False) everywhere."""
    return [True, False] if host_vnni() else [False]


def expected(w: np.ndarray, name: str, x: np.ndarray, W: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(x @ W.T in float64, the error allowed): float32 accumulation, error well under 1e-5 of the sum of
    |terms|, where x is int8_x(x) for the int8 matvecs."""
    W = reference(w, name).astype(np.float64) if W is None else W.astype(np.float64)
    if TYPES_BY_NAME[name].id == MXFP4:
        x = q8_0_x(x)
    elif TYPES_BY_NAME[name].id in INT8_IDS:
        x = int8_x(x, x_block(name, len(x)))
    x = x.astype(np.float64)
    return x @ W.T, 1e-5 * (np.abs(x) @ np.abs(W).T)


@pytest.mark.parametrize("name", TYPES)
def test_dequantize_rows_is_exact(name):
    w = random_weight(name, 40, 512)
    rows = np.array([0, 39, 7, 7, 12])
    got = dequantize_rows(w, TYPES_BY_NAME[name], rows)
    assert got.dtype == np.float32 and got.shape == (5, 512)
    np.testing.assert_array_equal(got, reference(w, name)[rows])
    np.testing.assert_array_equal(got, dequant.dequantize(w, TYPES_BY_NAME[name], (512, 40))[rows])


@pytest.mark.parametrize("n_tokens", [1, 3, 7, 64])
@pytest.mark.parametrize("name", TYPES)
def test_matmul_matches_dequantized_reference(name, n_tokens, monkeypatch):
    # a small tile so the prompt path runs several tiles and a partial last one
    monkeypatch.setattr(cpu_quant, "TILE_BYTES", 4 * 512 * 16)
    n_rows, n_cols = 201, 512  # 64 chunks of 3 or 4 rows: row pairs and an odd row left over
    w = random_weight(name, n_rows, n_cols, seed=n_tokens)
    x = np.random.default_rng(1).standard_normal((n_tokens, n_cols), np.float32)
    want, bound = expected(w, name, x)
    got = quantized_matmul(w, TYPES_BY_NAME[name], x)
    assert got.dtype == np.float32 and got.shape == (n_tokens, n_rows)
    assert np.all(np.abs(got - want) <= bound)


@pytest.mark.parametrize("block", [32, 256])
def test_int8_x_is_x_to_half_a_step(block):
    """|x8 - x| <= amax / 254 per element (amax of its block), and the steps are as coarse as that."""
    rng = np.random.default_rng(0)
    n_blocks = 2048 // block
    magnitudes = np.float32(10.0) ** rng.integers(-3, 4, (3, n_blocks, 1)).astype(np.float32)  # one per block
    x = (rng.standard_normal((3, n_blocks, block), np.float32) * magnitudes).reshape(3, 2048)
    x[1, block:2 * block] = 0  # an all-zero block
    step = np.abs(x).reshape(3, -1, block).max(-1, keepdims=True) / 127
    err = np.abs(int8_x(x, block) - x).reshape(3, -1, block)
    assert np.all(err <= step * (0.5 + 1e-6))
    assert np.all(err.max(-1, keepdims=True) >= step * 0.3)  # a quantizer that kept more bits would be caught
    assert np.all(int8_x(x, block)[1, block:2 * block] == 0)


@pytest.mark.parametrize("name, n_tokens", [(n, 1) for n in TYPES if int8_kind(n)]
                         + [(n, 9) for n in TYPES if int8_kind(n)])
def test_int8_error_against_float_x_and_a_wrong_weight_fails(name, n_tokens):
    """The int8 paths' error against x @ W.T (the docstring's bound), and that the tolerance of the tests
    above cannot pass a weight read with a slightly wrong scale or with its quants in the wrong order (one token:
    the matvec; 9: the GEMM)."""
    w = random_weight(name, 64, 1024)
    x = np.random.default_rng(2).standard_normal((n_tokens, 1024), np.float32)
    W = reference(w, name).astype(np.float64)
    got = quantized_matmul(w, TYPES_BY_NAME[name], x)
    block = x_block(name, n_tokens)
    step = np.abs(x).reshape(n_tokens, -1, block).max(-1) / 254  # half the step of each block of x
    if TYPES_BY_NAME[name].id == MXFP4:  # and its fp16 scale's rounding: 2^-11 of the block's amax
        step = step + np.abs(x).reshape(n_tokens, -1, block).max(-1) * 2.0 ** -11
    int8_bound = step.repeat(block, 1) @ np.abs(W).T + expected(w, name, x, W)[1]
    assert np.all(np.abs(got - x.astype(np.float64) @ W.T) <= int8_bound)

    def fails(wrong_W):
        want, bound = expected(w, name, x, wrong_W)
        return np.any(np.abs(got - want) > bound)

    assert fails(W * 1.001)
    blocks = w.reshape(-1, TYPES_BY_NAME[name].block_bytes).copy()
    quants = {"Q4_K": slice(16, 144), "Q6_K": slice(0, 128), "Q8_0": slice(2, 34), "Q4_0": slice(2, 18),
              "Q4_1": slice(4, 20), "Q5_0": slice(6, 22), "Q5_1": slice(8, 24), "MXFP4": slice(1, 17),
              "IQ4_NL": slice(2, 18), "IQ4_XS": slice(8, 136), "IQ2_XXS": slice(2, 66), "IQ3_XXS": slice(2, 66),
              "IQ3_S": slice(2, 66), "IQ2_XS": slice(2, 66), "IQ2_S": slice(2, 34),
              "IQ1_S": slice(2, 34), "IQ1_M": slice(0, 32)}[name]
    if name == "Q8_0":  # the two halves of each block swapped
        blocks[:, quants] = np.roll(blocks[:, quants], 16, axis=1)
    else:  # low and high nibbles swapped
        blocks[:, quants] = (blocks[:, quants] << 4) | (blocks[:, quants] >> 4)
    assert fails(reference(blocks.reshape(w.shape), name))


def test_mxfp4_sees_x_as_llama_cpp_q8_0_blocks():
    """The MXFP4 kernel's x is llama.cpp's q8_0 quantization of it (gguf-py's quantize_row_q8_0_ref): the same
    int8 values (up to a rare tie rounded the other way) and the same fp16 scales."""
    from gguf.quants import quantize
    x = (np.random.default_rng(3).standard_normal((5, 1024)) * np.logspace(-3, 2, 1024)).astype(np.float32)
    theirs = reference(quantize(x, GGMLQuantizationType.Q8_0), "Q8_0")
    ours = q8_0_x(x)
    assert np.count_nonzero(ours != theirs) <= x.size // 1000, np.count_nonzero(ours != theirs)
    assert not np.array_equal(ours, x)


@pytest.mark.parametrize("n_tokens", [1, 16])
def test_matmul_writes_into_out_and_takes_strided_x(n_tokens):
    w = random_weight("Q8_0", 20, 256)
    x = np.random.default_rng(0).standard_normal((n_tokens, 512), np.float32)[:, ::2]  # not contiguous
    out = np.full((n_tokens, 20), np.nan, np.float32)
    assert quantized_matmul(w, TYPES_BY_NAME["Q8_0"], x, out=out) is out
    want, bound = expected(w, "Q8_0", np.ascontiguousarray(x))
    assert np.all(np.abs(out - want) <= bound)


@pytest.mark.parametrize("name", ["Q4_K", "Q6_K", "Q5_K", "Q8_0", "IQ4_XS"])
def test_a_few_tokens_dots_are_their_one_token_dots_bit_for_bit(name):
    """2 to 4 tokens in one call (a verify step's; Q4_K, Q6_K and IQ4_XS decode each block once for all of them:
    dot_int8.dot8_k_tokens) give each token's one-token dots exactly, so that a verify step's logits are the decode
    step's. Planted, seen once: the few-token kernel's float multiply and add apart, not one fma (numba's fast-math
    flags let LLVM reassociate them): 58 of Q4_K's 201 rows moved in the last bits for the second token."""
    w = random_weight(name, 201, 512, seed=3)
    for n in (2, 3, 4):
        x = np.random.default_rng(n).standard_normal((n, 512), np.float32)
        one_at_a_time = np.stack([quantized_matmul(w, TYPES_BY_NAME[name], x[t:t + 1])[0] for t in range(n)])
        np.testing.assert_array_equal(quantized_matmul(w, TYPES_BY_NAME[name], x), one_at_a_time)


@pytest.mark.parametrize("n_tokens", [1, 3, 7])
@pytest.mark.parametrize("names", [("Q4_K", "Q4_K", "Q6_K"), ("Q6_K", "Q8_0", "Q4_K", "Q5_K"), ("Q8_0", "Q8_0")])
def test_matmuls_of_one_x_equal_one_matmul_each_bit_for_bit(names, n_tokens):
    """One call for matrices sharing x (q4_k_m's Q4_K q, k next to a Q6_K v; mixed blocks of x; a type that is
    not fused; a prompt) gives what one quantized_matmul per matrix gives: the same quantized x, the same dots,
    whichever chunk of the one parallel region a row falls in."""
    rows = [201, 64, 37, 3][:len(names)]  # chunks of unequal bytes, an odd last row, fewer rows than chunks
    ws = [random_weight(name, n, 512, seed=k) for k, (name, n) in enumerate(zip(names, rows))]
    qtypes = [TYPES_BY_NAME[name] for name in names]
    x = np.random.default_rng(2).standard_normal((n_tokens, 512), np.float32)
    got = quantized_matmuls(ws, qtypes, x)
    assert len(got) == len(ws)
    for w, qtype, y in zip(ws, qtypes, got):
        np.testing.assert_array_equal(y, quantized_matmul(w, qtype, x))


@pytest.mark.parametrize("n_workers, n_chunks", [(1, 64), (3, 7), (16, 1), (16, 300)])
def test_claimed_chunks_each_run_once_whatever_the_workers(n_workers, n_chunks):
    """matvecs_int8's workers claim chunks of rows until none are left (cpu_matvec.claim): one worker, fewer or more
    workers than threads, one chunk or more chunks than rows, and every row comes out once, with the bits of
    quantized_matmul (its own chunks).
    Planted fault, seen once: the claim loop stopping one chunk short fails every case (NaN rows)."""
    names, rows = ("Q4_K", "Q8_0"), (201, 37)
    ws = tuple(random_weight(name, n, 512, seed=k) for k, (name, n) in enumerate(zip(names, rows)))
    qtypes = [TYPES_BY_NAME[name] for name in names]
    x = np.random.default_rng(5).standard_normal((1, 512), np.float32)
    outs = tuple(np.full((1, n), np.nan, np.float32) for n in rows)
    matvecs(tuple(q.id for q in qtypes), ws, x, outs, n_chunks=n_chunks, n_workers=n_workers)
    for w, qtype, y in zip(ws, qtypes, outs):
        np.testing.assert_array_equal(y, quantized_matmul(w, qtype, x))



def test_matvecs_of_one_to_four_matrices_share_one_compiled_kernel():
    """One, two and three matrices (an output projection; gate and up; q, k and v) go to matvecs_int8 padded to four
    with empty matrices, which get no rows: one compile (~25 s on 2 cores) instead of three, results unchanged.
    Planted fault, seen once: the padding dropped (the tuples passed as given) fails the signature check."""
    from kernels.cpu.matvec import matvecs_int8
    names, rows = ("Q4_K", "Q8_0", "Q4_0"), (40, 37, 9)
    ws = [random_weight(name, n, 512, seed=k) for k, (name, n) in enumerate(zip(names, rows))]
    qtypes = [TYPES_BY_NAME[name] for name in names]
    x = np.random.default_rng(6).standard_normal((2, 512), np.float32)
    alone = [quantized_matmul(w, q, x) for w, q in zip(ws, qtypes)]
    for k in (2, 3):
        for got, want in zip(quantized_matmuls(ws[:k], qtypes[:k], x), alone):
            np.testing.assert_array_equal(got, want)
    assert {len(sig[0]) for sig in matvecs_int8.signatures} <= set(cpu_quant.MATVEC_ARITIES)


@pytest.mark.parametrize("block,bias", [(32, 128), (256, 128), (32, 0)])
def test_quantize_biased_is_x_rounded_to_its_scale(block, bias):
    """The GEMM's x: per block amax / 127 as xd, xq = x / xd rounded half to even (values at .5 ties placed), its
    bytes + bias, xds = xd * the sum of xq a 32; the padded rows zeros (xq 0). Planted: rounding half away from zero
    fails the ties."""
    from kernels.cpu.gemm import quantize_biased
    rng = np.random.default_rng(block + bias)
    x = rng.standard_normal((5, 512)).astype(np.float32)
    x[:, 0] = 127.0  # amax of every first block: 1 a step, so these land on .5 ties
    x[:, 1:9] = [0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 126.5, -126.5]
    xu, xd, xds = np.empty((8, 512), np.uint8), np.empty((8, 16), np.float32), np.empty((8, 16), np.float32)
    quantize_biased(x, xu, xd, xds, block, bias)
    amax = np.abs(x).reshape(5, -1, block).max(-1)
    want_d = np.repeat(amax / np.float32(127), block // 32, axis=1).astype(np.float32)
    inv = np.repeat(np.float32(127) / amax, block, axis=1).astype(np.float32)
    xq = np.rint(x * inv).astype(np.int32)
    got = (xu[:5].astype(np.int32) - bias + 128) % 256 - 128
    # fastmath divides by multiplying with reciprocals: xd within an ulp, a near-tie of another scale may round apart
    np.testing.assert_allclose(xd[:5], want_d, rtol=2.5e-7)
    assert np.abs(got - xq).max() <= 1 and (got != xq).mean() < 1e-3
    np.testing.assert_array_equal(got[:, 1:9], [[0, 2, 2, 0, -2, -2, 126, -126]] * 5)
    np.testing.assert_allclose(xds[:5], xd[:5] * got.reshape(5, 16, 32).sum(-1), rtol=1e-6)
    assert (xu[5:] == bias).all() and (xd[5:] == 0).all() and (xds[5:] == 0).all()


@pytest.mark.parametrize("n_workers", [1, 3, 16])
def test_claimed_gemm_tiles_each_run_once_whatever_the_workers(n_workers):
    """gemm_int8's workers claim tiles of ROWS rows until none are left: one worker, fewer or more workers than
    threads, a last tile short of ROWS, and every row of every token comes out once, with quantized_matmul's bits.
    Planted fault, seen once: the claim loop stopping one tile short fails every case (NaN rows)."""
    from kernels.cpu.gemm import gemm_int8, padded_tokens, quantize_biased
    w, n_tokens = random_weight("Q4_K", 203, 512), 9
    x = np.random.default_rng(5).standard_normal((n_tokens, 512), np.float32)
    n_padded = padded_tokens(n_tokens)
    xu, xd, xds = np.empty((n_padded, 512), np.uint8), np.empty((n_padded, 16), np.float32), np.empty(
        (n_padded, 16), np.float32)
    quantize_biased(x, xu, xd, xds, 32, 128)
    out = np.full((n_tokens, 203), np.nan, np.float32)
    gemm_int8(TYPES_BY_NAME["Q4_K"].id, w, xu, xd, xds, out, F16_TO_F32, n_workers)
    np.testing.assert_array_equal(out, quantized_matmul(w, TYPES_BY_NAME["Q4_K"], x))

def test_bad_shapes_are_refused():
    w = random_weight("Q4_K", 4, 256)
    with pytest.raises(ValueError, match="x must be float32"):
        quantized_matmul(w, TYPES_BY_NAME["Q4_K"], np.ones((1, 255), np.float32))
    with pytest.raises(ValueError, match="weight must be uint8"):
        quantized_matmul(w[:, :100], TYPES_BY_NAME["Q4_K"], np.ones((1, 256), np.float32))
    with pytest.raises(ValueError, match="x must be float32"):  # one matrix of another width
        quantized_matmuls([w, random_weight("Q6_K", 4, 512)], [TYPES_BY_NAME["Q4_K"], TYPES_BY_NAME["Q6_K"]],
                          np.ones((1, 256), np.float32))
    with pytest.raises(ValueError, match="no CPU kernel"):
        dequantize_rows(w, TYPES_BY_NAME["TQ1_0"], np.array([0]))
    with pytest.raises(IndexError):
        dequantize_rows(w, TYPES_BY_NAME["Q4_K"], np.array([4]))


@pytest.mark.parametrize("model", ["smollm2", "gemma3"])
def test_real_tensors_of_every_type_in_the_packaged_models(model, request):
    from models.gguf import open_gguf

    m = open_gguf(request.getfixturevalue(model))
    seen = set()
    for t in m.tensors.values():
        if len(t.shape) != 2 or t.type.name in seen:
            continue
        seen.add(t.type.name)
        n_cols, n_rows = t.shape
        w = m.tensor_bytes(t.name).reshape(n_rows, -1)[:96]  # 96 rows keep gguf-py quick
        W = reference(w, t.type.name)
        rows = np.array([0, 95, 3])
        np.testing.assert_array_equal(dequantize_rows(w, t.type, rows), W[rows])
        for n_tokens in (1, 9):
            x = np.random.default_rng(n_tokens).standard_normal((n_tokens, n_cols), np.float32)
            want, bound = expected(w, t.type.name, x, W)
            assert np.all(np.abs(quantized_matmul(w, t.type, x) - want) <= bound), (t.name, n_tokens)
    m.close()
    assert seen >= ({"Q4_1", "Q8_0"} if model == "smollm2" else {"Q4_K", "Q5_0", "Q6_K", "Q8_0"})


@pytest.mark.parametrize("name", ["Q4_K", "Q6_K", "IQ4_XS", "IQ2_XXS", "IQ3_XXS", "IQ3_S", "IQ2_XS", "IQ2_S",
                                  "IQ1_S", "IQ1_M"])
def test_super_block_dots_agree_on_every_simd_path(name, monkeypatch):
    """The AVX2 and generic-IR versions of the super-block rows (compiled for CPUs this machine may not be)
    give the same results as the one the kernels use here, which the tests above hold to x8 @ W.T (IQ4_XS: its
    table looked up by pshufb or by selects; IQ4_XS and the grid types: the values' signs moved to x by psignb or
    by selects)."""
    w = random_weight(name, 2, 2048)
    xq = np.random.default_rng(3).integers(-127, 128, 2048).astype(np.int8)
    xs16 = xq.reshape(-1, 16).sum(1, dtype=np.int16)
    xd = np.random.default_rng(4).random(8, np.float32)
    ir_names = {"avx512bw": "llvm.x86.avx512.pmaddubs.w.512", "avx2": "llvm.x86.avx2.pmadd.ub.sw", "": None}
    results = {}
    for simd, ir_name in ((s, ir_names[s]) for s in host_simd_paths()):
        monkeypatch.setattr(cpu_ir, "simd", lambda context, simd=simd: simd)
        rows = getattr(cpu_dot_int8, f"dot_{name.lower()}_rows")

        @nb.njit  # not cached: compiled anew under each _simd
        def block_dots(w, xq, xs16):
            return np.array(rows(w, 0, 1, xq, xd, xs16, F16_TO_F32))

        results[simd] = block_dots(w, xq, xs16)
        llvm_ir = next(iter(block_dots.inspect_llvm().values()))
        assert ("llvm.x86.avx" not in llvm_ir) if ir_name is None else (ir_name in llvm_ir)
    for simd in results:
        np.testing.assert_array_equal(results[simd], results[""])


@pytest.mark.parametrize("name", ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "IQ4_NL", "MXFP4"])
def test_block32_rows_agree_on_every_simd_path(name, monkeypatch):
    """The AVX2 (pmaddubsw) and generic-IR versions of the 32-value block rows (for CPUs without AVX-512 VNNI,
    without AVX2) give what the vpdpbusd one the kernels use here gives, lane for lane, so the same floats."""
    w = random_weight(name, 2, 2048)
    xq = np.random.default_rng(3).integers(-127, 128, 2048).astype(np.int8)
    xs16 = xq.reshape(-1, 16).sum(1, dtype=np.int16)
    xd = np.random.default_rng(4).random(64, np.float32)
    results = {}
    for simd in host_simd_paths():
        monkeypatch.setattr(cpu_ir, "simd", lambda context, simd=simd: simd)
        rows_dot = getattr(cpu_dot_int8, f"dot_{name.lower()}_rows")

        @nb.njit  # not cached: compiled anew under each _simd
        def dot(w, xq, xd, xs16):
            return rows_dot(w, 0, 1, xq, xd, xs16, F16_TO_F32)

        results[simd] = dot(w, xq, xd, xs16)
        llvm_ir = next(iter(dot.inspect_llvm().values()))
        assert ("llvm.x86.avx2.pmadd.ub.sw" in llvm_ir) == (simd == "avx2")
        assert ("vpdpbusd" in llvm_ir) == (simd == "avx512bw" and host_vnni())
    assert all(r == results[""] for r in results.values())


# as many matrices as the experts of test_moe and test_matmuls_of_one_x take: the kernel is compiled for those
@pytest.mark.parametrize("names", [("Q4_K",) * 6, ("Q6_K", "Q8_0", "Q4_0"), ("Q5_K", "Q4_K")])
def test_matvecs_of_own_rows_match_one_by_one(names):
    """Each matrix by its own row of x, in one parallel region (or one call each where a type has no int8
    kernel): what quantized_matmul gives that row alone, to float32 rounding (fastmath lets the compiled kernels
    of the two calls sum in different orders: a CI run saw the last bit differ)."""
    from kernels.cpu.quant import quantized_matvecs_own_rows
    qtypes = [TYPES_BY_NAME[n] for n in names]
    ws = [random_weight(n, 96, 512, seed=m) for m, n in enumerate(names)]
    x = np.random.default_rng(len(names)).standard_normal((len(ws), 512)).astype(np.float32)
    outs = quantized_matvecs_own_rows(ws, qtypes, x)
    for m, (w, q) in enumerate(zip(ws, qtypes)):
        ref = quantized_matmul(w, q, x[m:m + 1])
        np.testing.assert_allclose(outs[m], ref, rtol=1e-5, atol=1e-5 * np.abs(ref).max(), err_msg=names[m])


def _packed_tile(pack, tile, f16_table: bool):
    """A fresh njit function (not cached, so compiled under whatever path cpu_ir is patched to) that packs w's rows
    for the GEMM tile and runs it: y [TOKENS * ROWS]. f16_table: pack takes the f16 -> f32 table (the packs of the
    file's layout; the repacked X8 ones do not)."""
    if f16_table:
        @nb.njit
        def pack_rows(w, packed, corrs, scales, mins):
            pack(w, 0, packed, corrs, scales, mins, F16_TO_F32)
    else:
        @nb.njit
        def pack_rows(w, packed, corrs, scales, mins):
            pack(w, 0, packed, corrs, scales, mins)

    @nb.njit
    def packed_tile(w, xu, xd, xds):  # scratch of the host's rows, as many as any path's (cpu_ir.tile_rows)
        n = xd.shape[1] * cpu_gemm_int8.ROWS
        packed, corrs = np.empty(n * 32, np.uint8), np.empty(2 * n, np.int32)
        scales, mins = np.empty(2 * n, np.float32), np.empty(n, np.float32)
        pack_rows(w, packed, corrs, scales, mins)
        y = np.empty(cpu_gemm_int8.TOKENS * cpu_gemm_int8.ROWS, np.float32)
        tile(packed, corrs, scales, mins, xu, xd, xds, 0, y)
        return y
    return packed_tile


@pytest.mark.parametrize("n_tokens", [1, 3, 9, 64])
@pytest.mark.parametrize("name", ["Q4_0", "Q4_1", "Q5_0", "Q5_1"])
def test_repacked_matmul_matches_dequantized_reference(name, n_tokens):
    """A weight repacked eight rows at a time (193 rows: 25 groups, the last of one row, so a GEMM tile of 16 rows
    repeats it for a group past the end) through the matvec (few tokens)
    and the GEMM: x8 @ W.T as the row layout's kernels, to float32 rounding."""
    from kernels.cpu.repack import repack
    qtype = TYPES_BY_NAME[name]
    w = random_weight(name, 193, 512, seed=n_tokens)
    x = np.random.default_rng(1).standard_normal((n_tokens, 512), np.float32)
    want, bound = expected(w, name, x)
    got = quantized_matmul(repack(w, qtype.id), qtype, x)
    assert got.shape == (n_tokens, 193) and np.all(np.abs(got - want) <= bound)
    assert quantized_matmuls([repack(w, qtype.id), w], [qtype] * 2, x)[0].tolist() == got.tolist()


@pytest.mark.parametrize("name", ["Q4_0", "Q4_1", "Q5_0", "Q5_1"])
def test_repacked_dots_agree_on_every_simd_path(name, monkeypatch):
    """The repacked matvec's byte dots without VNNI: AVX2's pmaddubsw (int16 sums of several vectors, then one
    pmaddwd) and generic IR give what the host's best path gives, lane for lane, with x at its extremes (-128,
    127: the int16 sums' worst case) as well as random."""
    from kernels.cpu import dot_x8 as cpu_dot_x8
    from kernels.cpu.repack import repack
    qtype = TYPES_BY_NAME[name]
    w = random_weight(name, 8, 2048)
    high = np.full(w.shape, 0xFF, np.uint8)
    for off in range(0, w.shape[1], qtype.block_bytes):  # every quant (and 5th bit) at its largest, scales kept
        scale_bytes = {18: 2, 20: 4, 22: 2, 24: 4}[qtype.block_bytes]
        high[:, off:off + scale_bytes] = w[:, off:off + scale_bytes]
    high.flags.writeable = False  # as w: repack compiles once, for read-only bytes (a file's mmap)
    rng = np.random.default_rng(3)
    dot_x8 = getattr(cpu_dot_x8, f"dot_x8_{name.lower()}")
    paths = [(s, v) for s in host_simd_paths() for v in (host_vnni_paths() if s == "avx512bw" else [False])]
    cases = []
    for weight, xq in ((w, rng.integers(-127, 128, 2048).astype(np.int8)), (high, np.full(2048, 127, np.int8)),
                       (high, np.full(2048, -128, np.int8))):
        xs16 = xq.reshape(-1, 16).sum(1, dtype=np.int16)
        cases.append((repack(weight, qtype.id).data, xq, rng.random(64, np.float32), xs16))
    results = {}
    for simd, has_vnni in paths:
        monkeypatch.setattr(cpu_ir, "simd", lambda context, simd=simd: simd)
        monkeypatch.setattr(cpu_ir, "vnni", lambda context, has_vnni=has_vnni: has_vnni)

        @nb.njit  # not cached: compiled anew under each path
        def dot(w, xq, xd, xs16):
            return dot_x8(w, 0, xq, xd, xs16)

        results[(simd, has_vnni)] = [dot(*case) for case in cases]
        llvm_ir = next(iter(dot.inspect_llvm().values()))
        assert ("vpdpbusd" in llvm_ir) == has_vnni
        assert ("llvm.x86.avx2.pmadd.ub.sw" in llvm_ir) == (simd != "" and not has_vnni)
    for case in range(len(cases)):
        assert len({r[case] for r in results.values()}) == 1, results


@pytest.mark.parametrize("names", [("Q4_1", "Q4_1", "Q4_1"), ("Q5_0", "Q4_K", "Q6_K"), ("Q8_0",), ("Q4_0", "Q5_1")])
def test_one_token_matvecs_match_quantized_matmuls(names):
    """OneToken (a decode step's matrices checked once) gives quantized_matmuls' results bit for bit, repacked or
    not; its add_matmul gives resid + the matvec bit for bit, and with a norm resid + rms_norm(W x) * norm bit for
    bit too (what a verify step's tokens compute: decode and verify must agree for speculation's greedy replies to be
    the plain ones). Planted, seen once: the add in the norm's loop (a fused multiply-add) fails it."""
    from kernels.cpu import ops as cpu_ops
    from kernels.cpu.quant import OneToken
    from kernels.cpu.repack import LAYOUTS, repack
    rng = np.random.default_rng(len(names))
    qtypes = [TYPES_BY_NAME[n] for n in names]
    raw = [random_weight(n, 40 + 24 * m + 3, 512, seed=m) for m, n in enumerate(names)]
    for ws in (raw, [repack(w, q.id) if q.id in LAYOUTS else w for w, q in zip(raw, qtypes)]):
        x = rng.standard_normal((1, 512), np.float32)
        plan = OneToken(ws, qtypes)
        assert plan.int8
        want = quantized_matmuls(ws, qtypes, x)
        got = plan.matmuls(x)
        assert [g.tolist() for g in got] == [w.tolist() for w in want]
        one = OneToken(ws[:1], qtypes[:1])
        resid = rng.standard_normal((1, want[0].shape[1]), np.float32)
        assert one.add_matmul(x, resid).tolist() == (resid + want[0]).tolist()
        norm = rng.standard_normal(want[0].shape[1]).astype(np.float32)
        assert one.add_matmul(x, resid, norm, 1e-6).tolist() == (resid + cpu_ops.rms_norm(want[0], norm, 1e-6)).tolist()
    with pytest.raises(ValueError, match="x must be"):
        OneToken(raw, qtypes).matmuls(np.zeros((2, 512), np.float32))
    assert not OneToken([random_weight("Q5_K", 8, 512)], [TYPES_BY_NAME["Q5_K"]]).int8


# the tile cpu_gemm runs each type's packed values through (their size decides how the byte dots may be summed)
GEMM_TILES = {"Q4_0": "tile_no_min", "Q5_0": "tile_no_min", "Q4_1": "tile_with_min", "Q5_1": "tile_with_min",
              "Q4_K": "tile_with_min", "Q6_K": "tile_halves", "Q8_0": "tile_q8_0", "IQ4_XS": "tile_q8_0",
              "IQ3_XXS": "tile_grid", "IQ3_S": "tile_grid", "IQ2_XS": "tile_grid_halves",
              "IQ2_S": "tile_grid_halves", "IQ1_S": "tile_grid", "IQ1_M": "tile_grid_halves"}


@pytest.mark.parametrize("name", ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q4_K", "Q6_K", "X8_Q4_1", "X8_Q5_0",
                                  "IQ4_XS", "IQ3_XXS", "IQ3_S", "IQ2_XS", "IQ2_S", "IQ1_S",
                                  "IQ1_M"])
def test_gemm_tile_is_x8_w_on_every_path(name, monkeypatch):
    """The GEMM tile on every byte-dot path this host can compile (vpdpbusd with AVX-512 VNNI; without VNNI,
    AVX2's pmaddubsw, int16 sums of as many vectors as cannot overflow, of x's biased bytes where the packed values
    are small enough, else of x signed with the values' signs moved onto it; generic IR without AVX2) is x8 @ W.T,
    W gguf-py's dequantization: for random weights and x, and with every quant at its extremes against x's biased
    bytes at 1 and 255 (quantize_biased's extremes), the int16 sums' worst cases (Q8_0's quants reach +-127, where
    255 * 127 pair sums overflow int16; IQ4_XS's table -127 and 113; IQ3_XXS's grid entry 255, 52 and 62 in a pair,
    all signs minus, against tile_grid's biased x). An AVX2 host runs the AVX2 and generic paths,
    an AVX-512 one all of them (its no-VNNI path is AVX2's IR).
    tile_q8_0 takes x's bytes signed (xq: SIGNED_X_IDS) on AVX2 without VNNI, the others and it elsewhere biased.
    Planted faults, each seen once: tile_q8_0 made as the 4-bit types' (max_abs=16, pmaddubsw sums of biased x)
    fails Q8_0 here; the signed path summing two pmaddubsw in int16 (max_product 64 * 127) fails Q8_0 and IQ4_XS;
    tile_q8_0's AVX2 path reading x 5 bytes a step where it moves 4 fails Q8_0 and IQ4_XS. (x_bias giving the
    VNNI path xq, signed, fails 12 matmul tests of this file on a VNNI host.)"""
    from kernels.cpu.dot_x8 import pack_x8_q4_1, pack_x8_q5_0
    from kernels.cpu.gemm import quantize_biased
    from kernels.cpu.repack import repack
    from numba.core.registry import cpu_target
    base = name.removeprefix("X8_")
    qtype = TYPES_BY_NAME[base]
    w = random_weight(base, 11, 2048)  # more rows than a tile of 8, fewer than one of 16: it repeats the last
    x = np.random.default_rng(5).standard_normal((cpu_gemm_int8.TOKENS, 2048), np.float32) * 3
    xu = np.empty(x.shape, np.uint8)
    quantize_biased(x, xu, np.empty((len(x), 64), np.float32), np.empty((len(x), 64), np.float32), 32, 128)
    cases = [(w, xu)]
    scale_at = {"Q4_0": [0, 1], "Q4_1": [0, 1, 2, 3], "Q5_0": [0, 1], "Q5_1": [0, 1, 2, 3], "Q8_0": [0, 1],
                "Q4_K": list(range(16)), "Q6_K": list(range(192, 210)), "IQ4_XS": list(range(8)),
                "IQ3_XXS": [0, 1], "IQ3_S": [0, 1], "IQ2_XS": [0, 1], "IQ2_S": [0, 1],
                "IQ1_S": [0, 1], "IQ1_M": list(range(48, 56))}[base]
    # scales kept (IQ1_M's hold d); at 0xFF IQ3_XXS has its grid's largest entry and all signs minus
    fills = (0x00, 0xFF, 0x7F, 0x81) if base == "Q8_0" else (0x00, 0xFF)  # Q8_0's: 0, -1, 127, -127
    for fill in fills:
        extreme = np.full(w.shape, fill, np.uint8)
        for off in range(0, w.shape[1], qtype.block_bytes):
            extreme[:, off + np.array(scale_at)] = w[:, off + np.array(scale_at)]
        extreme.flags.writeable = False  # as w (a file's mmap): the tile compiles once a path, not again for this
        cases += [(extreme, np.full(xu.shape, 255, np.uint8)), (extreme, np.ones(xu.shape, np.uint8))]
    if name.startswith("X8_"):
        pack = pack_x8_q4_1 if base == "Q4_1" else pack_x8_q5_0
    else:
        pack = getattr(cpu_gemm_int8, f"pack_{base.lower()}")
    tile = getattr(cpu_gemm_int8, GEMM_TILES[base])
    xd = np.random.default_rng(6).uniform(0.5, 1.5, (len(x), 64)).astype(np.float32)
    paths = [(s, v) for s in host_simd_paths() for v in (host_vnni_paths() if s == "avx512bw" else [False])]
    for simd, has_vnni in paths:
        monkeypatch.setattr(cpu_ir, "simd", lambda context, simd=simd: simd)
        monkeypatch.setattr(cpu_ir, "vnni", lambda context, has_vnni=has_vnni: has_vnni)
        packed_tile = _packed_tile(pack, tile, f16_table=not name.startswith("X8_"))  # compiled anew a path
        rows = cpu_ir.tile_rows(cpu_target.target_context)  # 16 in 512-bit vectors with VNNI, else 8
        for weight, case_xu in cases:
            xq = case_xu.reshape(len(x), 64, 32).astype(np.int64) - 128
            xds = (xd * xq.sum(-1)).astype(np.float32)
            data = repack(weight, qtype.id).data if name.startswith("X8_") else weight
            signed = GEMM_TILES[base] == "tile_q8_0" and simd != "" and not has_vnni  # cpu_gemm_int8.signed_x
            x_bytes = case_xu ^ 0x80 if signed else case_xu  # it takes xq's bytes
            got = packed_tile(data, x_bytes, xd, xds)[:cpu_gemm_int8.TOKENS * rows].reshape(-1, rows)
            x8 = (xq * xd[:, :, None].astype(np.float64)).reshape(x.shape)
            W = reference(weight, base).astype(np.float64)[np.minimum(np.arange(rows), len(weight) - 1)]
            bound = 1e-5 * (np.abs(x8) @ np.abs(W).T)
            assert np.all(np.abs(got - x8 @ W.T) <= bound), (simd, has_vnni, hex(weight[0, -1]), case_xu[0, 0])
        llvm_ir = next(iter(packed_tile.inspect_llvm().values()))
        assert ("vpdpbusd" in llvm_ir) == has_vnni
        assert ("vpdpbusd.512" in llvm_ir) == (rows == 16) == (simd == "avx512bw" and has_vnni)
        assert ("llvm.x86.avx2.pmadd.ub.sw" in llvm_ir) == (simd != "" and not has_vnni)
        grid = base.startswith(("IQ3", "IQ2", "IQ1"))
        signs = (not has_vnni and GEMM_TILES[base] == "tile_q8_0") or grid  # the tile's psignb, or the pack's
        assert ("llvm.x86.avx2.psign.b" in llvm_ir) == (simd != "" and signs)


# x86 features beside AVX-512's of the server CPUs below (NUMBA_CPU_FEATURES lists them all)
X86_FEATURES = "+avx2,+avx,+fma,+f16c,+bmi,+bmi2,+popcnt,+lzcnt,+movbe,+sse4.2,+sse4.1,+ssse3,+sse3,+sse2,+sse"
# a tile and its pack as _packed_tile makes them, compiled; the code after it prints from its assembly (asm)
TILE_ASM = """
import re
from numba import types
from numba.core.registry import cpu_target
from kernels.cpu import gemm_int8 as g, ir
from tests.kernels.test_cpu_quant import _packed_tile
sig = (types.Array(types.uint8, 2, "C", readonly=True), types.Array(types.uint8, 2, "C"),
       types.Array(types.float32, 2, "C"), types.Array(types.float32, 2, "C"))
def tile_asm(pack, tile):
    f = _packed_tile(pack, tile, f16_table=True)
    f.compile(sig)
    return f.inspect_asm(sig)
"""


def compiled_for(cpu: str, avx512: str, code: str) -> list[str]:
    """The lines code (after TILE_ASM) prints in a child process whose numba compiles for cpu with the AVX-512
    features avx512 and X86_FEATURES: the assembly of a path this host may not be able to run."""
    import os
    import subprocess
    import sys
    from pathlib import Path
    env = {**os.environ, "NUMBA_CPU_NAME": cpu, "NUMBA_CPU_FEATURES": f"{avx512},{X86_FEATURES}"}
    r = subprocess.run([sys.executable, "-c", TILE_ASM + code], cwd=Path(__file__).resolve().parents[2], env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    return r.stdout.splitlines()


def test_q8_0_gemm_tile_for_avx512_without_vnni_never_saturates():
    """The Q8_0 GEMM tile as compiled for a CPU with AVX-512 BW but no VNNI (Skylake-SP servers, many cloud VMs)
    dots x signed, the values' signs moved onto it (vpsignb), so its pmaddubsw pair sums (|q| <= 128 times |xq| <=
    127) cannot saturate as x's biased bytes would (255 * 127 * 2 > 32767); the 4-bit types' tile dots the biased
    bytes. Hosts with AVX-512 also run this path against x8 @ W.T (test_gemm_tile_is_x8_w_on_every_path)."""
    lines = compiled_for("skylake-avx512", "+avx512bw,+avx512vl,+avx512f,+avx512dq,+avx512cd,-avx512vnni", """
for tile in (g.tile_q8_0, g.tile_no_min):
    asm = tile_asm(g.pack_q8_0, tile)
    print(asm.count("vpmaddubsw"), asm.count("vpsignb"))
""")
    (q8_0_madd, q8_0_sign), (four_bit_madd, four_bit_sign) = (map(int, line.split()) for line in lines[:2])
    assert q8_0_madd > 0 and q8_0_sign > 0 and four_bit_madd > 0 and four_bit_sign == 0


def test_the_gemm_tile_holds_16_rows_in_512_bit_vectors_with_vnni():
    """Where there is AVX-512 VNNI the GEMM tile holds 16 rows, its byte dots 512-bit vpdpbusd (zmm): checked in the
    assembly compiled for such a CPU (Ice Lake-SP) on any host (hosts with VNNI also run the path against x8 @ W.T:
    test_gemm_tile_is_x8_w_on_every_path). Planted: tile_rows giving 8 there fails here."""
    lines = compiled_for("icelake-server", "+avx512bw,+avx512vl,+avx512f,+avx512dq,+avx512cd,+avx512vnni", r"""
asm = tile_asm(g.pack_q4_k, g.tile_with_min)
print(ir.tile_rows(cpu_target.target_context), len(re.findall(r"vpdpbusd\s+[^\n]*%zmm", asm)))
""")
    rows, zmm_dots = map(int, lines[0].split())
    assert rows == 16 and zmm_dots > 0


@pytest.mark.parametrize("name,repacked", [("Q4_1", True), ("Q5_0", True), ("Q4_K", False), ("Q8_0", False),
                                           ("Q4_0", True)])
def test_one_token_glu_is_glu_of_the_matvecs(name, repacked):
    """A layer's gate and up with their GLU in one region (OneToken.glu) give cpu_ops.glu of matmuls' two results
    bit for bit, silu and gelu, row counts that are and are not whole groups of 8; mixed types are declined."""
    from kernels.cpu import ops as cpu_ops
    from kernels.cpu.quant import OneToken
    from kernels.cpu.repack import repack
    qtype = TYPES_BY_NAME[name]
    for n_rows in (203, 256):
        ws = [random_weight(name, n_rows, 512, seed=s) for s in (1, 2)]
        ws = [repack(w, qtype.id) for w in ws] if repacked else ws
        plan = OneToken(ws, [qtype] * 2)
        x = np.random.default_rng(n_rows).standard_normal((1, 512), np.float32) * 2
        gate, up = plan.matmuls(x)
        for activation in ("silu", "gelu"):
            assert plan.glu(x, activation).tolist() == cpu_ops.glu(gate, up, activation).tolist()
    mixed = [random_weight("Q4_K", 64, 512), random_weight("Q6_K", 64, 512)]
    assert OneToken(mixed, [TYPES_BY_NAME["Q4_K"], TYPES_BY_NAME["Q6_K"]]).glu(x, "silu") is None
