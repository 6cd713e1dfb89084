"""Every CUDA source in kernels/ compiles for the H100 (sm_90) with nvcc; runs in CI without a GPU.

To PTX, unoptimized (-Xcicc -O0): nvcc's front end, which sees every error of the C++, without the NVVM optimizer
(moe_mm.cu: 1.9 CPU-s where -O3 took 36) or ptxas, which together took ~130 CPU-s of CI's 2-core machine. What
only they decide, the registers and their spills, is checked on the GPU, on the code as the engine compiles it
(test_cuda_local_memory)."""
import os
import re
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.kernels.host_build import NVCC

KERNEL_DIR = Path(__file__).parents[2] / "kernels" / "cuda"
CU_FILES = sorted(KERNEL_DIR.glob("*.cu"))


def test_there_are_sources():
    assert CU_FILES, "no .cu files in kernels/"


@pytest.fixture(scope="module")
def compiled(tmp_path_factory) -> dict:
    """{source: (nvcc's result, its PTX)} for every CUDA source, compiled as many at a time as there are cores
    (nvcc compiles on one)."""
    out = tmp_path_factory.mktemp("ptx")

    def nvcc(cu: Path):
        ptx = out / (cu.stem + ".ptx")
        return subprocess.run([NVCC, "-arch=sm_90", "--ptx", "-Xcicc", "-O0", "-std=c++17", f"-I{KERNEL_DIR}", "-o",
                               str(ptx), str(cu)], capture_output=True, text=True, timeout=300), ptx

    with ThreadPoolExecutor(os.cpu_count()) as pool:
        return dict(zip(CU_FILES, pool.map(nvcc, CU_FILES)))


@pytest.mark.parametrize("cu", CU_FILES, ids=lambda p: p.name)
def test_compiles_for_sm90(cu, compiled):
    proc, ptx = compiled[cu]
    assert proc.returncode == 0, proc.stderr
    assert ".visible .entry" in ptx.read_text()  # its kernels are there


def test_launchers_name_kernels_that_exist():
    """Every matvec_<type> the launcher builds a name for is an extern "C" kernel in matvec.cu."""
    from kernels.cuda.layout import META_SPLIT

    source = (KERNEL_DIR / "matvec.cu").read_text()
    defined = set(re.findall(r"^MATVEC_[QF]\((\w+),", source, re.M))
    assert defined == {"matvec_" + name.lower() for name in META_SPLIT}
    assert 'extern "C" __global__ void quantize_q8_1' in source


def _kernel_bodies(source: str) -> list[tuple[str, str]]:
    """(name, body up to its first wait_prior() or 400 characters) of every __global__ kernel in a source,
    macro line continuations joined."""
    source = source.replace("\\\n", "\n")
    found = []
    for m in re.finditer(r"__global__\s+void\s+(?:__launch_bounds__\([^)]*\)\s+)?(\w+)\s*\(", source):
        body = source[source.index("{", m.end()) + 1:]
        found.append((m.group(1), body[:body.find("wait_prior();") + 13] if "wait_prior();" in body else body[:400]))
    return found


@pytest.mark.parametrize("cu", CU_FILES, ids=lambda p: p.name)
def test_kernels_wait_for_the_kernel_ahead_first(cu):
    """A captured decode step launches every kernel programmatically (cuda_module): a kernel may start before
    the one ahead has finished, so it must call wait_prior() before anything but L2 prefetches of weights."""
    bodies = _kernel_bodies(cu.read_text())
    assert bodies
    for name, body in bodies:
        assert body.endswith("wait_prior();"), f"{cu.name}: {name} does not call wait_prior()"
        before = [s.strip() for s in body[:-len("wait_prior();")].split(";") if s.strip()]
        assert all("prefetch" in s for s in before), f"{cu.name}: {name} does more than prefetch before wait_prior(): {before}"


def test_the_wait_check_catches_a_kernel_that_reads_first():
    bad = 'extern "C" __global__ void f(float* x) {\n    x[0] = 1.0f;\n    wait_prior();\n}\n'
    good = 'extern "C" __global__ void __launch_bounds__(128) g(const uint8_t* w) {\n    prefetch_l2(w, 16);\n    wait_prior();\n}\n'
    (name, body), = _kernel_bodies(bad)
    assert name == "f" and "x[0]" in body.split("wait_prior")[0]
    (name, body), = _kernel_bodies(good)
    assert name == "g" and body.strip().startswith("prefetch_l2")


def test_the_compiled_code_changes_with_any_header(tmp_path):
    """CuPy's on-disk cache keys a module on the code given to NVRTC, so that code carries a digest of the headers
    (kernels/cuda/sources.py): a header's edit, even one a .cu file only includes, gives each source new code.
    Planted fault, seen once: the digest line left out fails the second assert."""
    import shutil

    from kernels.cuda.sources import source_code
    for path in list(KERNEL_DIR.glob("*.cuh")) + [KERNEL_DIR / "matvec.cu"]:
        shutil.copy(path, tmp_path / path.name)
    before = source_code("matvec.cu", tmp_path)
    assert before.endswith((KERNEL_DIR / "matvec.cu").read_text()) and source_code("matvec.cu", tmp_path) == before
    header = tmp_path / "quant_dot_iq.cuh"
    header.write_text(header.read_text().replace("0x6420", "0x6402"))
    assert source_code("matvec.cu", tmp_path) != before
