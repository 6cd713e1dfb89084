"""Engines shared by the engine tests (loading once per session keeps the files under a few minutes)."""
import pytest


@pytest.fixture(scope="session")
def smollm2_engine(smollm2):
    from inference import load
    return load(smollm2, device="cpu", ctx=512)


@pytest.fixture(scope="session")
def gemma3_engine(gemma3):
    from inference import load
    return load(gemma3, device="cpu", ctx=640)
