"""Running a model: load() gives an Engine (logits, generate); see the README for the API."""
from kernels.cpu.threads import configure_thread_waits

configure_thread_waits()  # before numpy and numba load, when inference is the first import

__all__ = ["Engine", "GenerationStats", "PromptTooLongError", "load"]


def __getattr__(name: str):
    """The engine (numba and the kernels: ~3 s on 2 cores) loads when one of its names is first asked for, so that a
    command's flag parsers (inference.placement, inference.speculative) refuse a bad flag at once."""
    if name not in __all__:
        raise AttributeError(f"module 'inference' has no attribute '{name}'")
    from inference import engine
    return getattr(engine, name)
