"""The CPU kernels against gguf-py's reference dequantization (and ours, models/dequant.py), every type."""
import numpy as np
import pytest
from gguf.constants import GGMLQuantizationType
from gguf.quants import dequantize

from kernels import cpu_quant
from kernels.cpu_bench import F16_FIELDS, random_weight
from kernels.cpu_quant import dequantize_rows, quantized_matmul
from models import dequant
from models.ggml_types import TYPES_BY_NAME

TYPES = ["F32", "F16", "BF16", *F16_FIELDS]


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
    np.testing.assert_array_equal(got, dequant.dequantize(w, TYPES_BY_NAME[name], (512, 40))[rows])


@pytest.mark.parametrize("n_tokens", [1, 3, 7, 64])
@pytest.mark.parametrize("name", TYPES)
def test_matmul_matches_dequantized_reference(name, n_tokens, monkeypatch):
    # a small tile so the prompt path runs several tiles and a partial last one
    monkeypatch.setattr(cpu_quant, "TILE_BYTES", 4 * 512 * 16)
    n_rows, n_cols = 201, 512  # 64 chunks of 3 or 4 rows: row pairs and an odd row left over
    w = random_weight(name, n_rows, n_cols, seed=n_tokens)
    x = np.random.default_rng(1).standard_normal((n_tokens, n_cols), np.float32)
    W = reference(w, name).astype(np.float64)
    want = x.astype(np.float64) @ W.T
    got = quantized_matmul(w, TYPES_BY_NAME[name], x)
    assert got.dtype == np.float32 and got.shape == (n_tokens, n_rows)
    # float32 accumulation: error well under 1e-5 of the sum of |terms|
    bound = 1e-5 * (np.abs(x).astype(np.float64) @ np.abs(W).T)
    assert np.all(np.abs(got - want) <= bound)


@pytest.mark.parametrize("n_tokens", [1, 16])
def test_matmul_writes_into_out_and_takes_strided_x(n_tokens):
    w = random_weight("Q8_0", 20, 256)
    x = np.random.default_rng(0).standard_normal((n_tokens, 512), np.float32)[:, ::2]  # not contiguous
    out = np.full((n_tokens, 20), np.nan, np.float32)
    assert quantized_matmul(w, TYPES_BY_NAME["Q8_0"], x, out=out) is out
    want = x.astype(np.float64) @ reference(w, "Q8_0").astype(np.float64).T
    np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-4)


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
            want = x.astype(np.float64) @ W.astype(np.float64).T
            bound = 1e-5 * (np.abs(x).astype(np.float64) @ np.abs(W.astype(np.float64)).T)
            assert np.all(np.abs(quantized_matmul(w, t.type, x) - want) <= bound), (t.name, n_tokens)
    m.close()
    assert seen >= ({"Q4_1", "Q8_0"} if model == "smollm2" else {"Q4_K", "Q5_0", "Q6_K", "Q8_0"})
