"""Compile the CUDA C sources in kernels/ once per process (CuPy RawModule, NVRTC) and hand out kernels.

Inside programmatic_launches() (a decode step being captured into a graph) kernels launch with Hopper's
programmatic stream serialization: a kernel's blocks may start while the kernel ahead of it finishes and wait
for it in wait_prior() (ops_common.cuh), so a chain of short kernels does not pay each launch's latency in turn.
CuPy has no launch with attributes: those launches go through the driver's cuLaunchKernelEx (ctypes).
"""
import contextlib
import ctypes
import functools
from pathlib import Path

import cupy as cp
import numpy as np

from kernels.cuda.sources import source_code

KERNEL_DIR = Path(__file__).parent

_ATTR_PROGRAMMATIC_STREAM_SERIALIZATION = 6  # CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
_programmatic = False


class _LaunchAttribute(ctypes.Structure):  # CUlaunchAttribute: an id, padding, a 64-byte value union
    _fields_ = [("id", ctypes.c_int), ("pad", ctypes.c_char * 4), ("value", ctypes.c_int * 16)]


class _LaunchConfig(ctypes.Structure):  # CUlaunchConfig
    _fields_ = [("grid", ctypes.c_uint * 3), ("block", ctypes.c_uint * 3), ("shared_mem", ctypes.c_uint),
                ("stream", ctypes.c_void_p), ("attrs", ctypes.POINTER(_LaunchAttribute)), ("n_attrs", ctypes.c_uint)]


_SCALAR_TYPES = {np.dtype(np.int32): ctypes.c_int32, np.dtype(np.uint32): ctypes.c_uint32,
                 np.dtype(np.int64): ctypes.c_int64, np.dtype(np.uint64): ctypes.c_uint64,
                 np.dtype(np.float32): ctypes.c_float, np.dtype(np.float64): ctypes.c_double}


def _c_arg(a):
    """A kernel argument as CuPy passes it: an array as its device pointer, a numpy scalar as its type."""
    if isinstance(a, cp.ndarray):
        return ctypes.c_void_p(a.data.ptr)
    if a is None:
        return ctypes.c_void_p(0)
    if isinstance(a, np.generic) and a.dtype in _SCALAR_TYPES:
        return _SCALAR_TYPES[a.dtype](a.item())
    raise TypeError(f"kernel argument of type {type(a).__name__}: pass arrays or numpy scalars")


@functools.cache
def _launch_kernel_ex():
    f = ctypes.CDLL("libcuda.so.1").cuLaunchKernelEx
    f.argtypes = [ctypes.POINTER(_LaunchConfig), ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p]
    f.restype = ctypes.c_int
    return f


class Kernel:
    """A compiled kernel, launched as CuPy's RawKernel is: kernel(grid, block, args, shared_mem=0) on the
    current stream. raw: the RawKernel (its attributes)."""

    def __init__(self, raw: cp.RawKernel):
        self.raw = raw

    def __call__(self, grid: tuple, block: tuple, args: tuple, shared_mem: int = 0) -> None:
        if not _programmatic:
            self.raw(grid, block, args, shared_mem=shared_mem)
            return
        attr = _LaunchAttribute(id=_ATTR_PROGRAMMATIC_STREAM_SERIALIZATION)
        attr.value[0] = 1
        config = _LaunchConfig(grid=(ctypes.c_uint * 3)(*grid, *(1,) * (3 - len(grid))),
                               block=(ctypes.c_uint * 3)(*block, *(1,) * (3 - len(block))),
                               shared_mem=shared_mem, stream=cp.cuda.get_current_stream().ptr,
                               attrs=ctypes.pointer(attr), n_attrs=1)
        values = [_c_arg(a) for a in args]
        params = (ctypes.c_void_p * len(values))(*(ctypes.cast(ctypes.pointer(v), ctypes.c_void_p) for v in values))
        status = _launch_kernel_ex()(ctypes.byref(config), self.raw.kernel.ptr, params, None)
        if status:
            raise RuntimeError(f"cuLaunchKernelEx of {self.raw.name} failed: CUresult {status}")


@contextlib.contextmanager
def programmatic_launches():
    """Launch every kernel with programmatic stream serialization while inside (see the module's docstring)."""
    global _programmatic
    _programmatic = True
    try:
        yield
    finally:
        _programmatic = False


@functools.cache
def _module(source: str) -> cp.RawModule:
    return cp.RawModule(code=source_code(source), options=("-std=c++17", f"-I{KERNEL_DIR}"), backend="nvrtc")


@functools.cache
def kernel(source: str, name: str) -> Kernel:
    """The extern "C" kernel `name` of kernels/`source`, compiled on first use."""
    return Kernel(_module(source).get_function(name))
