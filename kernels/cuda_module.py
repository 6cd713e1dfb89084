"""Compile the CUDA C sources in kernels/ once per process (CuPy RawModule, NVRTC) and hand out kernels."""
import functools
from pathlib import Path

import cupy as cp

KERNEL_DIR = Path(__file__).parent


@functools.cache
def _module(source: str) -> cp.RawModule:
    code = (KERNEL_DIR / source).read_text()
    return cp.RawModule(code=code, options=("-std=c++17", f"-I{KERNEL_DIR}"), backend="nvrtc")


@functools.cache
def kernel(source: str, name: str) -> cp.RawKernel:
    """The extern "C" kernel `name` of kernels/`source`, compiled on first use."""
    return _module(source).get_function(name)
