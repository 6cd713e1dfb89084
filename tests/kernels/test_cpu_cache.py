"""numba's cache rule across the CPU kernel modules (kernels/cpu_cache.py): a module whose cached kernels inline
another kernels/ module's code names it in INLINED, and its INLINED_DIGEST is that code's current digest, so an
edit to a helper cannot leave a dependant's cached kernels running the old helper."""
import ast
from pathlib import Path

import pytest

from kernels import cpu_cache

NOT_INLINED = {"cpu_threads", "cpu_cache"}  # plain Python at import, nothing compiled into a kernel
MODULES = sorted(cpu_cache.KERNELS.glob("cpu_*.py"))


def kernel_imports(path: Path) -> set[str]:
    """The kernels/cpu_* modules this one imports from."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("kernels.cpu_"):
            names.add(node.module.removeprefix("kernels."))
    return names - NOT_INLINED


def compiles_kernels(path: Path) -> bool:
    """Whether the module defines cached numba kernels (cpu_types' jit and fast are) or intrinsics of its own
    (an uncached helper, as cpu_bench's, recompiles every run and needs no digest)."""
    for node in ast.walk(ast.parse(path.read_text())):
        for decorator in getattr(node, "decorator_list", []):
            text = ast.unparse(decorator)
            if text in ("jit", "fast", "intrinsic") or "cache=True" in text:
                return True
    return False


@pytest.mark.parametrize("path", MODULES, ids=[p.stem for p in MODULES])
def test_inlined_modules_are_named_and_their_digest_is_current(path):
    names = cpu_cache.inlined(path)
    if compiles_kernels(path):
        assert set(names or ()) >= kernel_imports(path), f"{path.stem} inlines modules its INLINED does not name"
    if names is not None:
        text = path.read_text()
        assert f'INLINED_DIGEST = "{cpu_cache.digest(names)}"' in text, (
            f"{', '.join(names)} changed: run `python -m kernels.cpu_cache` so {path.stem}'s kernels recompile")


def test_a_changed_helper_makes_its_dependants_stale(tmp_path, monkeypatch):
    """Editing cpu_ir (a helper of cpu_dot_int8) changes the digest cpu_dot_int8 must carry."""
    for path in MODULES:
        (tmp_path / path.name).write_text(path.read_text())
    monkeypatch.setattr(cpu_cache, "KERNELS", tmp_path)
    before = cpu_cache.digest(("cpu_types", "cpu_ir"))
    (tmp_path / "cpu_ir.py").write_text((tmp_path / "cpu_ir.py").read_text() + "\n# an edit\n")
    assert cpu_cache.digest(("cpu_types", "cpu_ir")) != before
    # the cascade: cpu_dot_int8 and cpu_dot_x8 inline cpu_ir, cpu_matvec and cpu_gemm_int8 inline cpu_dot_int8,
    # cpu_gemm the latter and cpu_dot_x8
    assert set(cpu_cache.write_digests()) == {"cpu_dot_int8", "cpu_dot_x8", "cpu_matvec", "cpu_gemm_int8", "cpu_gemm"}
    assert cpu_cache.write_digests() == []
