"""The CUDA C sources of kernels/cuda/ as the engine hands them to NVRTC (no CuPy here: CI checks this without a GPU).

CuPy keeps compiled modules on disk (~/.cupy/kernel_cache) keyed on the code it is given and the options, not on the
headers that code includes: a .cu file whose own text did not change kept loading the module compiled from the old
headers. Seen on the H200 machine: quant_dot_iq.cuh edited and reverted, matvec.cu's cached module still read the
edited layout, and gpt-oss's logits on the GPU fell to 0.37 correlation with the CPU's. The same would follow an
upgrade of gguf-chat that changes only a header. So each source goes to NVRTC headed by a digest of every header.
"""
import hashlib
from pathlib import Path

KERNEL_DIR = Path(__file__).parent


def headers_digest(kernel_dir: Path = KERNEL_DIR) -> str:
    """The first 16 hex digits of the sha256 of every .cuh file of kernel_dir (names and contents, by name)."""
    h = hashlib.sha256()
    for header in sorted(kernel_dir.glob("*.cuh")):
        h.update(header.name.encode() + b"\0" + header.read_bytes())
    return h.hexdigest()[:16]


def source_code(name: str, kernel_dir: Path = KERNEL_DIR) -> str:
    """kernels/cuda/<name>'s text, headed by a comment that names headers_digest (CuPy's cache key then changes with
    any header)."""
    return f"// headers {headers_digest(kernel_dir)}\n" + (kernel_dir / name).read_text()
