"""Every kernel of every CUDA source, compiled as the engine compiles it (kernels/cuda/module.py: NVRTC, then
ptxas for this GPU), keeps its values in registers: no local memory, where a spill would put them (a spill adds
local-memory traffic to every thread), beyond the small stack frames listed in FRAMES. Needs a GPU.

CI compiles the sources to PTX only (test_cuda_compile); ptxas, which decides the spills, runs here, on the code
that runs. The driver lists a module's kernels itself (cuModuleEnumerateFunctions), so those made by macros are
checked too."""
import ctypes
import re

import pytest

from tests.kernels.test_cuda_compile import CU_FILES

pytestmark = pytest.mark.gpu

_LOCAL_SIZE_BYTES = 3  # CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES
# Kernels (by name prefix) that keep a small array in local memory, at most these bytes a thread as measured on the
# H200 (CUDA 13), where nvcc -warn-spills reported no spill: a spill there would add to them and fail the test
FRAMES = {"moe_mm_glu_": 48, "rope": 40}


def kernel_names(source: str) -> list[str]:
    """The extern "C" kernels a CUDA source names: its __global__ functions', then the first arguments of its macro
    lines (`DEQUANT(dequant_q4_0, Q4_0)`), some of which the macro extends (matvec_tokens.cu's `NAME##_##N`), so not
    every one need exist."""
    source = source.replace("\\\n", " ")  # macros' line continuations
    names = [m.group(1) for m in re.finditer(
        r'extern "C"\s+__global__\s+void\s+(?:__\w+__\s*\([^)]*\)\s*)*(?!__)(\w+)\s*\(', source)]
    names = [n for n in names if not n.isupper()]  # NAME: a macro's parameter
    return names + re.findall(r"^[A-Z_0-9]+\((\w+),", source, re.M)


def _local_bytes(module, names: list[str]) -> dict[str, int]:
    """{kernel name: its local memory bytes a thread} of every kernel of a CuPy RawModule, which holds one of
    `names`."""
    import cupy as cp
    driver = ctypes.CDLL("libcuda.so.1")
    for name in names:
        try:
            handle = ctypes.c_void_p(module.get_function(name).kernel.module.ptr)  # the driver's CUmodule
            break
        except cp.cuda.driver.CUDADriverError:  # a name a macro extends
            continue
    else:
        raise AssertionError(f"none of {names} is a kernel of the module")
    count = ctypes.c_uint()
    assert driver.cuModuleGetFunctionCount(ctypes.byref(count), handle) == 0
    funcs = (ctypes.c_void_p * count.value)()
    assert driver.cuModuleEnumerateFunctions(funcs, count, handle) == 0
    found = {}
    for f in funcs:
        name, size = ctypes.c_char_p(), ctypes.c_int()
        assert driver.cuFuncGetName(ctypes.byref(name), ctypes.c_void_p(f)) == 0
        assert driver.cuFuncGetAttribute(ctypes.byref(size), _LOCAL_SIZE_BYTES, ctypes.c_void_p(f)) == 0
        found[name.value.decode()] = size.value
    return found


@pytest.mark.parametrize("cu", CU_FILES, ids=lambda p: p.name)
def test_no_kernel_uses_more_local_memory_than_its_frame(cu):
    from kernels.cuda.module import _module
    local = _local_bytes(_module(cu.name), kernel_names(cu.read_text()))
    assert local, f"no kernels found in {cu.name}"
    allowed = {name: max([b for prefix, b in FRAMES.items() if name.startswith(prefix)], default=0) for name in local}
    assert {name: n for name, n in local.items() if n > allowed[name]} == {}


def test_the_check_sees_local_memory():
    """A kernel whose array is indexed by a value known only at run time keeps it in local memory: the check above
    must see it (and see the kernel beside it, which keeps none)."""
    import cupy as cp
    code = """extern "C" __global__ void stack(float* out, int i) {
        float a[64] = {};
        for (int j = 0; j < 64; j++) a[(j * 7 + i) & 63] += out[j];
        out[0] = a[i];
    }
    extern "C" __global__ void none(float* out) { out[0] = 1.0f; }"""
    local = _local_bytes(cp.RawModule(code=code, backend="nvrtc"), ["none"])
    assert local["stack"] >= 256 and local["none"] == 0, local
