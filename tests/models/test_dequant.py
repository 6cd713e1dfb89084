"""Our reference dequantizer against gguf-py's (gguf.quants.dequantize), bit for bit."""
import gguf
import numpy as np
import pytest
from gguf.quants import dequantize as gguf_dequantize

from models.dequant import DEQUANTIZERS, DequantShapeError, dequantize, dequantize_tensor
from models.ggml_types import TYPES_BY_NAME, UnsupportedTypeError
from models.gguf import open_gguf
from tests.models.quant_blocks import random_blocks, random_bytes

SUPPORTED = [t for t in TYPES_BY_NAME.values() if t.supported]
UNSUPPORTED = [t for t in TYPES_BY_NAME.values() if not t.supported]
# ggml shapes (row length first) in units of blocks: a vector, a matrix, a 3-D tensor
SHAPES_IN_BLOCKS = [(7,), (3, 5), (2, 3, 4)]
EMBEDDING_ROWS_PER_SLICE = 16384  # the embedding tables are compared in row slices to bound memory


def assert_same_floats(ours: np.ndarray, theirs: np.ndarray) -> None:
    """Same shape, float32, NaN in the same places and identical bits everywhere else (so -0.0 != 0.0)."""
    assert ours.dtype == np.float32 and theirs.dtype == np.float32
    assert ours.shape == theirs.shape
    nan = np.isnan(ours)
    np.testing.assert_array_equal(nan, np.isnan(theirs))
    np.testing.assert_array_equal(ours.view(np.uint32)[~nan], theirs.view(np.uint32)[~nan])


def gguf_py(raw: np.ndarray, type_name: str, shape: tuple[int, ...]) -> np.ndarray:
    """gguf-py's dequantization of raw bytes holding a tensor of ggml shape `shape`."""
    row_bytes = TYPES_BY_NAME[type_name].nbytes(shape[0])
    rows = raw.reshape(*shape[:0:-1], row_bytes)  # (..., rows, row_bytes) as gguf-py's reader gives it
    return gguf_dequantize(rows, gguf.GGMLQuantizationType[type_name])


@pytest.mark.parametrize("qtype", SUPPORTED, ids=lambda t: t.name)
@pytest.mark.parametrize("blocks_shape", SHAPES_IN_BLOCKS, ids=str)
def test_random_blocks_match_gguf_py(qtype, blocks_shape):
    shape = (blocks_shape[0] * qtype.block_elems, *blocks_shape[1:])
    raw = random_blocks(np.random.default_rng(len(blocks_shape)), qtype, int(np.prod(blocks_shape)))
    ours = dequantize(raw, qtype, shape)
    assert ours.shape == shape[::-1]
    assert np.isfinite(ours).all()
    assert_same_floats(ours, gguf_py(raw, qtype.name, shape))


@pytest.mark.parametrize("qtype", SUPPORTED, ids=lambda t: t.name)
def test_random_bytes_with_nan_and_inf_scales_match_gguf_py(qtype):
    n_blocks = 4096
    raw = random_bytes(np.random.default_rng(1), qtype, n_blocks)
    shape = (64 * qtype.block_elems, n_blocks // 64)
    with np.errstate(all="ignore"):
        ours, theirs = dequantize(raw, qtype, shape), gguf_py(raw, qtype.name, shape)
    assert_same_floats(ours, theirs)
    assert np.isinf(ours).any() and (np.isnan(ours).any() or qtype.name == "MXFP4")  # e8m0 scales have no NaN


def test_every_supported_type_has_a_dequantizer():
    assert set(DEQUANTIZERS) == {t.name for t in SUPPORTED}


@pytest.mark.parametrize("qtype", UNSUPPORTED, ids=lambda t: t.name)
def test_unsupported_types_are_refused(qtype):
    raw = np.zeros(qtype.block_bytes * 2, dtype=np.uint8)
    with pytest.raises(UnsupportedTypeError, match=qtype.name):
        dequantize(raw, qtype, (qtype.block_elems, 2))


def test_buffer_of_the_wrong_size_is_refused():
    q4_k = TYPES_BY_NAME["Q4_K"]
    raw = np.zeros(q4_k.block_bytes * 3, dtype=np.uint8)
    with pytest.raises(DequantShapeError, match="needs 432 bytes, got 288"):
        dequantize(raw[:-144], q4_k, (256, 3))
    with pytest.raises(DequantShapeError, match="multiple of 256"):
        dequantize(raw, q4_k, (128, 6))
    with pytest.raises(TypeError, match="uint8"):
        dequantize(raw.view(np.int8), q4_k, (256, 3))


@pytest.mark.parametrize("model_fixture", ["smollm2", "gemma3"])
def test_every_tensor_of_a_real_model_matches_gguf_py(model_fixture, request):
    """Whole tensors through dequantize_tensor; the big embedding tables (up to 262k rows) in slices of
    rows, still covering every row, so that neither side holds GBs of float32 at once."""
    with open_gguf(request.getfixturevalue(model_fixture)) as model:
        types_seen = set()
        for name, info in model.tensors.items():
            types_seen.add(info.type.name)
            raw = model.tensor_bytes(name)
            n_rows = info.n_elems // info.shape[0]
            if n_rows <= EMBEDDING_ROWS_PER_SLICE:
                ours = dequantize_tensor(model, name)
                assert ours.shape == info.shape[::-1]
                assert_same_floats(ours, gguf_py(raw, info.type.name, info.shape))
                continue
            rows = raw.reshape(n_rows, -1)  # (n_rows, row_bytes)
            for start in range(0, n_rows, EMBEDDING_ROWS_PER_SLICE):
                part = rows[start:start + EMBEDDING_ROWS_PER_SLICE]
                shape = (info.shape[0], part.shape[0])
                assert_same_floats(dequantize(part, info.type, shape), gguf_py(part, info.type.name, shape))
    expected = {"smollm2": {"F32", "Q4_1", "Q8_0"}, "gemma3": {"F32", "Q4_K", "Q5_0", "Q6_K", "Q8_0"}}
    assert types_seen == expected[model_fixture]
