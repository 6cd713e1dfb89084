"""llama.cpp's own GGUF reader (gguf_init_from_file in the libggml-base that llama-cpp-python ships),
called through ctypes: a second oracle for which files are valid."""
import ctypes
import importlib.util
from pathlib import Path


class _InitParams(ctypes.Structure):  # struct gguf_init_params
    _fields_ = [("no_alloc", ctypes.c_bool), ("ctx", ctypes.c_void_p)]


_lib_dir = Path(next(iter(importlib.util.find_spec("llama_cpp").submodule_search_locations))) / "lib"
_ggml = ctypes.CDLL(str(_lib_dir / "libggml-base.so"))
_ggml.gguf_init_from_file.restype = ctypes.c_void_p
_ggml.gguf_init_from_file.argtypes = [ctypes.c_char_p, _InitParams]
_ggml.gguf_free.argtypes = [ctypes.c_void_p]


def ggml_accepts(path) -> bool:
    """Whether llama.cpp's reader parses the header (it checks tensor data ranges later, in its loader)."""
    ctx = _ggml.gguf_init_from_file(str(path).encode(), _InitParams(True, None))
    if ctx:
        _ggml.gguf_free(ctx)
    return bool(ctx)
