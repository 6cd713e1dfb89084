"""Every CUDA source in kernels/ compiles for the H100 (sm_90) with nvcc; runs in CI without a GPU."""
import re
import subprocess
from pathlib import Path

import pytest

from tests.kernels.host_build import NVCC

KERNEL_DIR = Path(__file__).parents[2] / "kernels"
CU_FILES = sorted(KERNEL_DIR.glob("*.cu"))


def test_there_are_sources():
    assert CU_FILES, "no .cu files in kernels/"


@pytest.mark.parametrize("cu", CU_FILES, ids=lambda p: p.name)
def test_compiles_for_sm90(cu, tmp_path):
    cubin = tmp_path / (cu.stem + ".cubin")
    proc = subprocess.run(
        [NVCC, "-arch=sm_90", "--cubin", "-O3", "-std=c++17", f"-I{KERNEL_DIR}", "-Xptxas", "-warn-spills",
         "-o", str(cubin), str(cu)],
        capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    assert "spill" not in proc.stderr.lower(), proc.stderr  # a spill would be local-memory traffic
    assert cubin.stat().st_size > 0


def test_launchers_name_kernels_that_exist():
    """Every matvec_<type> the launcher builds a name for is an extern "C" kernel in matvec.cu."""
    from kernels.cuda_layout import META_SPLIT

    source = (KERNEL_DIR / "matvec.cu").read_text()
    defined = set(re.findall(r"^MATVEC_[QF]\((\w+),", source, re.M))
    assert defined == {"matvec_" + name.lower() for name in META_SPLIT}
    assert 'extern "C" __global__ void quantize_q8_1' in source
