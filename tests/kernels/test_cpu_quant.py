"""The CPU kernels against gguf-py's reference dequantization, for every type we compute with."""
import numpy as np
import pytest
from gguf.constants import GGMLQuantizationType
from gguf.quants import dequantize

from kernels import cpu_quant
from kernels.cpu_quant import dequantize_rows, quantized_matmul
from models.ggml_types import TYPES_BY_NAME

# where each block type keeps its f16 scales: random bytes there could be inf/nan, so they get finite values
F16_FIELDS = {"Q4_0": [0], "Q4_1": [0, 2], "Q5_0": [0], "Q5_1": [0, 2], "Q8_0": [0], "Q2_K": [80, 82],
              "Q3_K": [108], "Q4_K": [0, 2], "Q5_K": [0, 2], "Q6_K": [208]}
TYPES = ["F32", "F16", "BF16", *F16_FIELDS]


def random_weight(name: str, n_rows: int, n_cols: int, seed: int = 0) -> np.ndarray:
    """Random valid bytes of a [n_rows, n_cols] weight: uint8 [n_rows, row_bytes], read-only like a mmap."""
    rng = np.random.default_rng(seed)
    qt = TYPES_BY_NAME[name]
    if name == "F32":
        w = rng.standard_normal((n_rows, n_cols), np.float32).view(np.uint8)
    elif name == "F16":
        w = rng.standard_normal((n_rows, n_cols)).astype(np.float16).view(np.uint8)
    elif name == "BF16":
        w = (rng.standard_normal((n_rows, n_cols), np.float32).view(np.uint32) >> 16).astype(np.uint16).view(np.uint8)
    else:
        n_blocks = n_rows * n_cols // qt.block_elems
        blocks = rng.integers(0, 256, (n_blocks, qt.block_bytes), dtype=np.uint8)
        for off in F16_FIELDS[name]:
            scale = (rng.uniform(-0.05, 0.05, n_blocks)).astype(np.float16)
            blocks[:, off:off + 2] = scale.view(np.uint8).reshape(n_blocks, 2)
        w = blocks.reshape(n_rows, -1)
    w = np.ascontiguousarray(w)
    w.flags.writeable = False
    return w


def reference(w: np.ndarray, name: str) -> np.ndarray:
    """gguf-py's dequantization of w: float32 [n_rows, n_cols]."""
    return dequantize(w, GGMLQuantizationType[name]).astype(np.float32)


@pytest.mark.parametrize("name", TYPES)
def test_dequantize_rows_is_exact(name):
    w = random_weight(name, 40, 512)
    rows = np.array([0, 39, 7, 7, 12])
    got = dequantize_rows(w, TYPES_BY_NAME[name], rows)
    assert got.dtype == np.float32 and got.shape == (5, 512)
    np.testing.assert_array_equal(got, reference(w, name)[rows])


@pytest.mark.parametrize("n_tokens", [1, 3, 7, 64])
@pytest.mark.parametrize("name", TYPES)
def test_matmul_matches_dequantized_reference(name, n_tokens, monkeypatch):
    # a small tile so the prompt path runs several tiles and a partial last one
    monkeypatch.setattr(cpu_quant, "TILE_BYTES", 4 * 512 * 16)
    n_rows, n_cols = 45, 512
    w = random_weight(name, n_rows, n_cols, seed=n_tokens)
    x = np.random.default_rng(1).standard_normal((n_tokens, n_cols), np.float32)
    W = reference(w, name).astype(np.float64)
    want = x.astype(np.float64) @ W.T
    got = quantized_matmul(w, TYPES_BY_NAME[name], x)
    assert got.dtype == np.float32 and got.shape == (n_tokens, n_rows)
    # float32 accumulation: error well under 1e-5 of the sum of |terms|
    bound = 1e-5 * (np.abs(x).astype(np.float64) @ np.abs(W).T)
    assert np.all(np.abs(got - want) <= bound)


def test_matmul_writes_into_out():
    w = random_weight("Q8_0", 20, 256)
    x = np.ones((1, 256), np.float32)
    out = np.full((1, 20), np.nan, np.float32)
    assert quantized_matmul(w, TYPES_BY_NAME["Q8_0"], x, out=out) is out
    assert np.all(np.isfinite(out))


def test_bad_shapes_are_refused():
    w = random_weight("Q4_K", 4, 256)
    with pytest.raises(ValueError, match="x must be float32"):
        quantized_matmul(w, TYPES_BY_NAME["Q4_K"], np.ones((1, 255), np.float32))
    with pytest.raises(ValueError, match="weight must be uint8"):
        quantized_matmul(w[:, :100], TYPES_BY_NAME["Q4_K"], np.ones((1, 256), np.float32))
    with pytest.raises(ValueError, match="no CPU kernel"):
        dequantize_rows(w, TYPES_BY_NAME["IQ2_XXS"], np.array([0]))
    with pytest.raises(IndexError):
        dequantize_rows(w, TYPES_BY_NAME["Q4_K"], np.array([4]))
