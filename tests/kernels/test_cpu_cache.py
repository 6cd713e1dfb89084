"""numba's cache rule across the CPU kernel modules (kernels/cpu/cache.py): a module whose cached kernels inline
another kernels/ module's code names it in INLINED, and its INLINED_DIGEST is that code's current digest, so an
edit to a helper cannot leave a dependant's cached kernels running the old helper."""
import ast
from pathlib import Path

import pytest

from kernels.cpu import cache

NOT_INLINED = {"threads", "cache"}  # plain Python at import, nothing compiled into a kernel
MODULES = sorted(cache.KERNELS.glob("[!_]*.py"))


def kernel_imports(path: Path) -> set[str]:
    """The kernels/cpu/ modules this one imports from."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("kernels.cpu."):
            names.add(node.module.removeprefix("kernels.cpu."))
    return names - NOT_INLINED


def compiles_kernels(path: Path) -> bool:
    """Whether the module defines cached numba kernels (types' jit and fast are) or intrinsics of its own
    (an uncached helper, as kernels/bench/cpu.py's, recompiles every run and needs no digest)."""
    for node in ast.walk(ast.parse(path.read_text())):
        for decorator in getattr(node, "decorator_list", []):
            text = ast.unparse(decorator)
            if text in ("jit", "fast", "intrinsic") or "cache=True" in text:
                return True
    return False


@pytest.mark.parametrize("path", MODULES, ids=[p.stem for p in MODULES])
def test_inlined_modules_are_named_and_their_digest_is_current(path):
    names = cache.inlined(path)
    if compiles_kernels(path):
        assert set(names or ()) >= kernel_imports(path), f"{path.stem} inlines modules its INLINED does not name"
    if names is not None:
        text = path.read_text()
        assert f'INLINED_DIGEST = "{cache.digest(names)}"' in text, (
            f"{', '.join(names)} changed: run `python -m kernels.cpu.cache` so {path.stem}'s kernels recompile")


def test_a_changed_helper_makes_its_dependants_stale(tmp_path, monkeypatch):
    """Editing ir (a helper of dot_int8) changes the digest dot_int8 must carry."""
    for path in MODULES:
        (tmp_path / path.name).write_text(path.read_text())
    monkeypatch.setattr(cache, "KERNELS", tmp_path)
    before = cache.digest(("types", "ir"))
    (tmp_path / "ir.py").write_text((tmp_path / "ir.py").read_text() + "\n# an edit\n")
    assert cache.digest(("types", "ir")) != before
    # the cascade: iq_grid, dot_int8 and dot_x8 inline ir, dot_int8 and gemm_int8 iq_grid, matvec and gemm_int8
    # dot_int8, gemm the latter and dot_x8
    assert set(cache.write_digests()) == {"iq_grid", "dot_int8", "dot_x8", "matvec", "gemm_int8", "gemm"}
    assert cache.write_digests() == []


def test_two_saves_at_once_keep_both_entries_apart(tmp_path, monkeypatch):
    """Two saves into one kernel's cache index at once (two processes compiling two signatures of a kernel): each
    entry gets a data file of its own and loads its own data. numba's save reads the index, picks the first free
    data file and writes the index back; here each read is held 0.3 s, so that unserialized both read the empty index.
    Planted fault, seen once: the lock in serialize_saves left out, sig_a's entry was lost (loads None)."""
    import threading
    import time

    from numba.core.caching import IndexDataCacheFile

    import kernels.cpu.types  # noqa: F401  (serialize_saves, as every kernel module's import does)
    load_index = IndexDataCacheFile._load_index

    def slow_load_index(self):
        overloads = load_index(self)
        time.sleep(0.3)
        return overloads

    monkeypatch.setattr(IndexDataCacheFile, "_load_index", slow_load_index)
    cache = IndexDataCacheFile(str(tmp_path), "kernel-1.py311", source_stamp=(1.0, 100))
    saves = [threading.Thread(target=cache.save, args=(key, f"code of {key}")) for key in ("sig_a", "sig_b")]
    for t in saves:
        t.start()
    for t in saves:
        t.join()
    assert (cache.load("sig_a"), cache.load("sig_b")) == ("code of sig_a", "code of sig_b")
