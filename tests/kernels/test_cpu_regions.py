"""Each one-token kernel of kernels/cpu/matvec, and the prompt GEMM, is ONE parallel region. In a function with
parallel=True numba makes a parallel loop, a region to start and join, of np.zeros, np.full and slice assignments
too: a claim counter made by np.zeros cost every matvec call a second region (a Q8_0 64 x 512 call on the 2-core VM
18 -> 10 us without it; cpu_claim.counters makes counters outside the region).
Planted fault, seen once: matvecs_int8's counter made by np.zeros again fails its case here.

The kernels go through numba's pipeline only as far as its parfor passes, which decide the regions (lowering makes
one region of each top-level parfor and adds none): ~0.6 s a kernel where a full compile took 5-28 s on 2 cores."""
import numba as nb
import numpy as np
import pytest
from numba.core.compiler import CompilerBase, DefaultPassBuilder
from numba.core.compiler_machinery import FunctionPass, register_pass
from numba.core.typed_passes import ParforPreLoweringPass
from numba.parfors.parfor import Parfor

from kernels.cpu import gemm as cpu_gemm, matvec as cpu_matvec, quant as cpu_quant
from kernels.bench.cpu import random_weight
from models.ggml_types import TYPES_BY_NAME

Q4_K = TYPES_BY_NAME["Q4_K"]


class ParallelLoops(Exception):
    """Raised from inside the pipeline with the top-level parallel loops, which ends the compile there."""


@register_pass(mutates_CFG=False, analysis_only=True)
class StopAfterParfors(FunctionPass):
    _name = "stop_after_parfors"

    def __init__(self):
        FunctionPass.__init__(self)

    def run_pass(self, state):
        raise ParallelLoops([stmt for block in state.func_ir.blocks.values() for stmt in block.body
                             if isinstance(stmt, Parfor)])


class UpToParfors(CompilerBase):
    """numba's nopython pipeline, ended after its last parfor pass (no lowering, no LLVM)."""

    def define_pipelines(self):
        pm = DefaultPassBuilder.define_nopython_pipeline(self.state)
        pm.add_pass_after(StopAfterParfors, ParforPreLoweringPass)
        pm.finalize()
        return [pm]


def _stack(n_rows: int, n_cols: int) -> np.ndarray:
    return random_weight("Q4_K", 4 * n_rows, n_cols).reshape(4, n_rows, -1)


def _matvecs():
    cpu_quant.quantized_matmuls([random_weight("Q4_K", 64, 512)], [Q4_K], np.ones((1, 512), np.float32))


def _prompt():
    cpu_quant.quantized_matmul(random_weight("Q4_K", 64, 512), Q4_K, np.ones((9, 512), np.float32))


def _one_token(method: str):
    def call():
        n_mats = 2 if method == "glu" else 1
        one = cpu_quant.OneToken([random_weight("Q4_K", 64, 512)] * n_mats, [Q4_K] * n_mats)
        x = np.ones((1, 512), np.float32)
        one.glu(x, "silu") if method == "glu" else one.add_matmul(x, np.ones((1, 64), np.float32))
    return call


def _experts(kind: str):
    def call():
        h, ids = np.ones((1, 512), np.float32), np.array([1, 3], np.int32)
        if kind == "matvecs":
            cpu_quant.expert_matvecs((_stack(64, 512),), (Q4_K,), ids, h)
        else:
            experts = cpu_quant.OneTokenExperts((_stack(256, 512), _stack(256, 512), _stack(512, 256)), (Q4_K,) * 3)
            experts.ffn(h, ids, np.ones(2, np.float32), "silu")
    return call


@pytest.mark.parametrize("kernel, call", [
    ("matvecs_int8", _matvecs), ("glu_matvecs_int8", _one_token("glu")), ("matvec_add_int8", _one_token("add")),
    ("expert_matvecs_int8", _experts("matvecs")), ("expert_ffn_int8", _experts("ffn")), ("gemm_int8", _prompt)])
def test_one_token_kernel_is_one_parallel_region(kernel, call, monkeypatch):
    """The kernel, typed for the arguments its cpu_quant wrapper gives it and taken through the parfor passes with
    the flags it is compiled with, has one top-level parallel loop."""
    module = cpu_gemm if kernel == "gemm_int8" else cpu_matvec
    jitted = getattr(module, kernel)
    assert jitted.targetoptions["parallel"]
    options = {k: v for k, v in jitted.targetoptions.items() if k != "nopython"}  # njit sets it itself
    monkeypatch.setattr(cpu_quant, kernel, nb.njit(pipeline_class=UpToParfors, **options)(jitted.py_func))
    with pytest.raises(ParallelLoops) as found:
        call()
    loops = found.value.args[0]
    assert len(loops) == 1, [loop.loc.line for loop in loops]
