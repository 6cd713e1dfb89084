"""A kernel variant (types.Variants) holds the code of its own types alone: numba prunes the other types' branches
of the inlined dispatches before typing, so it never compiles them (on 2 cores the generic decode_rows took 19 s to
compile, Q4_1's alone 2 s).

Each variant is taken through numba's untyped passes only (no typing, no LLVM: nothing is compiled or cached) for
the arguments its cpu_quant wrapper gives it, and the functions its IR still calls are looked at.
Planted fault, seen once: _dot_rows' branches on tid alone (the `X in types and` dropped) fails the matvec cases."""
import numba as nb
import numpy as np
import pytest
from numba.core import ir
from numba.core.compiler import CompilerBase, DefaultPassBuilder
from numba.core.compiler_machinery import FunctionPass, register_pass
from numba.core.untyped_passes import LiteralPropagationSubPipelinePass

from kernels.bench.cpu import random_weight
from kernels.cpu import dequant as cpu_dequant, dot_int8, dot_x8, gemm as cpu_gemm, gemm_int8, matvec as cpu_matvec
from kernels.cpu import quant as cpu_quant
from kernels.cpu.repack import repack
from models.ggml_types import TYPES_BY_NAME


class Called(Exception):
    """Raised from inside the pipeline with the global and closure values the untyped IR refers to."""


@register_pass(mutates_CFG=False, analysis_only=True)
class StopBeforeTyping(FunctionPass):
    _name = "stop_before_typing"

    def __init__(self):
        FunctionPass.__init__(self)

    def run_pass(self, state):
        raise Called([stmt.value.value for block in state.func_ir.blocks.values() for stmt in block.body
                      if isinstance(stmt, ir.Assign) and isinstance(stmt.value, (ir.Global, ir.FreeVar))])


class UntypedOnly(CompilerBase):
    def define_pipelines(self):
        pm = DefaultPassBuilder.define_nopython_pipeline(self.state)
        pm.add_pass_after(StopBeforeTyping, LiteralPropagationSubPipelinePass)
        pm.finalize()
        return [pm]


def _values_called(module, kernel: str, call, monkeypatch) -> list:
    variants = getattr(module, f"{kernel}_of")
    monkeypatch.setattr(cpu_quant, f"{kernel}_of", lambda key: nb.njit(pipeline_class=UntypedOnly)(
        variants(key).py_func))
    with pytest.raises(Called) as found:
        call()
    return found.value.args[0]


def _leaves(module, prefix: str) -> dict:
    """name -> object of the module's globals whose names start with prefix (one a type)."""
    return {name: value for name, value in vars(module).items() if name.startswith(prefix)}


def _called(values: list, leaves: dict) -> set:
    return {name for name, leaf in leaves.items() if any(v is leaf for v in values)}


DOTS = {**_leaves(dot_int8, "dot8_"), **_leaves(dot_x8, "dot8_x8_")}
X1, X9 = np.ones((1, 512), np.float32), np.ones((9, 512), np.float32)


@pytest.mark.parametrize("names, want", [(("Q4_1",), {"dot8_q4_1"}), (("Q4_K", "Q8_0"), {"dot8_q4_k", "dot8_q8_0"}),
                                         (("IQ4_XS",), {"dot8_iq4_xs"})])
def test_a_matvec_variant_calls_the_dots_of_its_types_alone(names, want, monkeypatch):
    ws = [random_weight(name, 16, 512, seed=k) for k, name in enumerate(names)]
    qtypes = [TYPES_BY_NAME[name] for name in names]
    values = _values_called(cpu_matvec, "matvecs_int8", lambda: cpu_quant.quantized_matmuls(ws, qtypes, X1),
                            monkeypatch)
    assert _called(values, DOTS) == want


def test_a_repacked_matvec_variant_calls_its_dot_alone(monkeypatch):
    qtype = TYPES_BY_NAME["Q5_0"]
    w = repack(random_weight("Q5_0", 16, 512), qtype.id)
    values = _values_called(cpu_matvec, "matvecs_int8", lambda: cpu_quant.quantized_matmul(w, qtype, X1),
                            monkeypatch)
    assert _called(values, DOTS) == {"dot8_x8_q5_0"}


def test_the_decode_rows_of_a_type_call_its_decoder_alone(monkeypatch):
    qtype = TYPES_BY_NAME["Q4_1"]
    values = _values_called(cpu_dequant, "decode_rows", lambda: cpu_quant.dequantize_rows(
        random_weight("Q4_1", 4, 512), qtype, np.arange(4)), monkeypatch)
    decoders = {name: f for name, f in _leaves(cpu_dequant, "decode_").items() if name not in ("decode_row",
                                                                                              "decode_rows_of")}
    assert _called(values, decoders) == {"decode_q4_1"}


def test_the_gemm_of_a_type_packs_and_tiles_as_it_alone(monkeypatch):
    qtype = TYPES_BY_NAME["Q6_K"]
    values = _values_called(cpu_gemm, "gemm_int8", lambda: cpu_quant.quantized_matmul(
        random_weight("Q6_K", 16, 512), qtype, X9), monkeypatch)
    assert _called(values, {**_leaves(gemm_int8, "pack_"), **_leaves(gemm_int8, "tile_"),
                            **_leaves(dot_x8, "pack_")}) == {"pack_q6_k", "tile_halves"}
