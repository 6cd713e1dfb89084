"""The GPU kernels' dot products (kernels/cuda/quant_dot.cuh) built for the CPU, against models/dequant.py.

tests/kernels/quant_dot_host.cu compiles the same header with nvcc as host code, so the index math of
every quant type is checked in CI. x is quantized to q8_1 here in numpy; the reference multiplies the
dequantized weight by that dequantized x in float64, leaving only float32 rounding (bound 1e-5 relative).
"""
import ctypes

import numpy as np
import pytest

from kernels.bench.cuda import random_weight_bytes
from kernels.cuda.layout import META_SPLIT, repack
from models.dequant import dequantize
from models.ggml_types import TYPES_BY_NAME
from tests.kernels.host_build import build_host_lib

QUANT_TYPES = [n for n in META_SPLIT if n not in ("F32", "F16", "BF16")]
REL_TOL = 1e-5


@pytest.fixture(scope="module")
def host_lib(tmp_path_factory):
    return build_host_lib("quant_dot_host.cu", tmp_path_factory.mktemp("quant_dot_host"))


def quantize_q8_1(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """x float32 [n] -> qs int8 [n], ds float32 [n/32, 2] = (d, d * sum(qs)), as kernels/cuda/matvec.cu does."""
    blocks = x.reshape(-1, 32)
    d = np.abs(blocks).max(axis=1) / np.float32(127)
    qs = np.round(blocks / np.where(d == 0, 1, d)[:, None]).astype(np.int8)
    ds = np.stack([d, d * qs.sum(axis=1, dtype=np.int32).astype(np.float32)], axis=1).astype(np.float32)
    return qs.reshape(-1), ds


@pytest.mark.parametrize("shape", [(8, 4096), (5, 256)], ids=lambda s: f"{s[0]}x{s[1]}")
@pytest.mark.parametrize("name", QUANT_TYPES)
def test_dot_matches_reference_dequantize(host_lib, name, shape):
    qtype = TYPES_BY_NAME[name]
    n_rows, n_cols = shape
    seed = int(np.random.SeedSequence().generate_state(1)[0])  # fresh inputs every run
    raw = random_weight_bytes(qtype, n_rows, n_cols, seed=seed)
    x = np.random.default_rng(seed).standard_normal(n_cols).astype(np.float32)
    qs, ds = quantize_q8_1(x)
    w = np.ascontiguousarray(repack(raw, qtype))
    out = np.full(n_rows, np.nan, dtype=np.float32)
    ptr = lambda a: a.ctypes.data_as(ctypes.c_void_p)  # noqa: E731
    n_blocks = n_cols // qtype.block_elems
    assert host_lib.matvec_host(name.encode(), ptr(w), ptr(qs), ptr(ds), ptr(out), n_rows, n_blocks) == 0
    x_used = (qs.astype(np.float64).reshape(-1, 32) * ds[:, :1]).reshape(-1)
    ref = dequantize(raw, TYPES_BY_NAME[name], (x_used.size, raw.shape[0])).astype(np.float64) @ x_used
    err = np.linalg.norm(out - ref) / np.linalg.norm(ref)
    assert err < REL_TOL, f"{name} seed {seed}: relative error {err:.2e}"


@pytest.mark.parametrize("shape", [(8, 4096), (5, 256)], ids=lambda s: f"{s[0]}x{s[1]}")
def test_q6_k_in_the_files_layout_matches_the_repacked(host_lib, shape):
    """Q6_K_FILE (experts read in place from host memory) on the file's bytes gives Q6_K's result on the repacked
    bytes, exactly: the same dots, only the loads differ."""
    qtype = TYPES_BY_NAME["Q6_K"]
    n_rows, n_cols = shape
    raw = random_weight_bytes(qtype, n_rows, n_cols, seed=n_rows)
    qs, ds = quantize_q8_1(np.random.default_rng(n_rows).standard_normal(n_cols).astype(np.float32))
    ptr = lambda a: a.ctypes.data_as(ctypes.c_void_p)  # noqa: E731
    outs = []
    for name, w in ((b"Q6_K", np.ascontiguousarray(repack(raw, qtype))), (b"Q6_K_FILE", np.ascontiguousarray(raw))):
        out = np.full(n_rows, np.nan, dtype=np.float32)
        assert host_lib.matvec_host(name, ptr(w), ptr(qs), ptr(ds), ptr(out), n_rows, n_cols // 256) == 0
        outs.append(out)
    np.testing.assert_array_equal(outs[1], outs[0])
    assert np.isfinite(outs[0]).all() and np.abs(outs[0]).max() > 0


def test_unknown_type_is_refused(host_lib):
    assert host_lib.matvec_host(b"TQ2_0", None, None, None, None, 0, 0) == -1
