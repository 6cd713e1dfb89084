"""Build a kernels/ header's host-side test harness (tests/kernels/*_host.cu) into a shared library with nvcc,
so the kernels' index math is checked on the CPU in CI."""
import ctypes
import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).parents[2]
NVCC = shutil.which("nvcc") or "/usr/local/bin/nvcc"


def build_host_lib(source: str, out_dir: Path) -> ctypes.CDLL:
    """tests/kernels/<source> compiled as host code against kernels/, loaded with ctypes."""
    lib = out_dir / f"lib{Path(source).stem}.so"
    proc = subprocess.run(
        [NVCC, "-arch=sm_90", "-O2", "-std=c++17", "-shared", "-Xcompiler", "-fPIC", f"-I{ROOT / 'kernels' / 'cuda'}",
         "-o", str(lib), str(ROOT / "tests/kernels" / source)],
        capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    return ctypes.CDLL(str(lib))
