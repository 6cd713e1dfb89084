"""numba's on-disk cache (cache=True) across the CPU kernel modules.

numba keys a cached kernel on its own file (its timestamp and size) and nothing else: a kernel that inlines a
jitted helper, an intrinsic's IR or a module constant from another file keeps running the old one after that
file is edited, until its own file changes. The kernels were one file for that reason; now each module that
inlines another kernels/cpu/ module's code, or freezes another module's arrays as constants (models.iq_grids),
names them in INLINED and carries INLINED_DIGEST, the digest of their sources. tests/kernels/test_cpu_cache.py
fails when a digest is stale or a module imports kernel code from a module it does not name, so an edit to a
helper must be followed by writing the new digest into each module that inlines it: that edits the dependant's
file, and numba recompiles its kernels. It cascades on its own: ir changes -> dot_int8's digest line changes ->
matvec's digest of dot_int8 goes stale.

    python -m kernels.cpu.cache     # writes the current digests into the modules whose are stale

Two processes that compile at once (pytest's two workers, a server and a `run` started together on an empty cache)
would corrupt it: numba's index picks a new entry's data file from the index as it read it, so two entries of one
kernel saved at once both took file 1 and one signature then loaded the other's code (seen in CI: an expert sum
with a relative error of 1.0). serialize_saves makes each save hold a lock on its index.
"""
import ast
import fcntl
import hashlib
import re
from pathlib import Path

from numba.core.caching import IndexDataCacheFile

KERNELS = Path(__file__).parent
ROOT = KERNELS.parents[1]


def serialize_saves() -> None:
    """numba's cache saves an entry (reads its index, adds the entry, writes both back) holding a lock on the index's
    lock file, so a process that saves beside another reads the other's entry first. Loads need none: numba writes
    each file whole under a temporary name, then renames it."""
    save = IndexDataCacheFile.save
    if getattr(save, "serialized", False):  # wrapped twice, a save would wait on its own lock (a second open file)
        return

    def locked_save(self, key, data):
        with open(self._index_path + ".lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
            save(self, key, data)

    locked_save.serialized = True
    IndexDataCacheFile.save = locked_save


def source(name: str) -> Path:
    """A kernels/cpu/ module by its name ("ir"), or a data module elsewhere by its dotted name ("models.iq_grids")."""
    return ROOT.joinpath(*name.split(".")).with_suffix(".py") if "." in name else KERNELS / f"{name}.py"


def digest(modules: tuple[str, ...]) -> str:
    """The first 16 hex digits of the sha256 of these modules' sources (source()), in order."""
    h = hashlib.sha256()
    for name in modules:
        h.update(source(name).read_bytes())
    return h.hexdigest()[:16]


def inlined(path: Path) -> tuple[str, ...] | None:
    """The INLINED names of a kernels/ module, read from its source (None: it has none)."""
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and [t.id for t in node.targets if isinstance(t, ast.Name)] == ["INLINED"]:
            return ast.literal_eval(node.value)
    return None


def write_digests() -> list[str]:
    """Writes each module's current INLINED_DIGEST, again until none changes (a dependant's digest covers the
    digest lines of what it inlines); returns the modules it rewrote."""
    rewritten = []
    changed = True
    while changed:
        changed = False
        for path in sorted(KERNELS.glob("[!_]*.py")):
            names = inlined(path)
            if names is None:
                continue
            text = path.read_text()
            new = re.sub(r'^INLINED_DIGEST = ".*"$', f'INLINED_DIGEST = "{digest(names)}"', text, count=1, flags=re.M)
            if new != text:
                path.write_text(new)
                rewritten.append(path.stem)
                changed = True
    return rewritten


if __name__ == "__main__":
    print("rewrote:", " ".join(write_digests()) or "nothing")
