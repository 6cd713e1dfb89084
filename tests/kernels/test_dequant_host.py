"""The prefill kernel's chunk dequantizers (kernels/cuda/dequant_chunk.cuh) built for the CPU, against
models/dequant.py, bit for bit: the float32 values before the kernel's one rounding to fp16. Runs in CI.

tests/kernels/dequant_host.cu compiles the same header with nvcc as host code and walks rows and chunks as
kernels/cuda/dequant.cu does, so the index math of every type is checked without a GPU.
"""
import ctypes

import numpy as np
import pytest

from kernels.bench.cuda import random_weight_bytes
from kernels.cuda.layout import repack
from models.dequant import dequantize
from models.ggml_types import TYPES_BY_NAME
from tests.kernels.host_build import build_host_lib

TYPES = ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "F32", "BF16", "MXFP4", "IQ4_NL",
         "IQ4_XS", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S", "IQ1_S", "IQ1_M"]


@pytest.fixture(scope="module")
def host_lib(tmp_path_factory):
    return build_host_lib("dequant_host.cu", tmp_path_factory.mktemp("dequant_host"))


@pytest.mark.parametrize("shape", [(8, 4096), (3, 256)], ids=lambda s: f"{s[0]}x{s[1]}")
@pytest.mark.parametrize("name", TYPES)
def test_chunks_match_reference_bit_for_bit(host_lib, name, shape):
    qtype = TYPES_BY_NAME[name]
    n_rows, n_cols = shape
    seed = int(np.random.SeedSequence().generate_state(1)[0])  # fresh blocks every run
    raw = random_weight_bytes(qtype, n_rows, n_cols, seed=seed)
    w = np.ascontiguousarray(repack(raw, qtype))
    out = np.full((n_rows, n_cols), np.nan, dtype=np.float32)
    nb = n_cols // (32 if name in ("F32", "BF16") else qtype.block_elems)
    ptr = lambda a: a.ctypes.data_as(ctypes.c_void_p)  # noqa: E731
    assert host_lib.dequant_host(name.encode(), ptr(w), ptr(out), n_rows, nb) == 0
    want = dequantize(raw, qtype, (n_cols, n_rows))
    differ = out.view(np.uint32) != want.view(np.uint32)
    assert not differ.any(), f"{name}: {differ.sum()} of {out.size} values differ, first at {np.argwhere(differ)[0]}"
