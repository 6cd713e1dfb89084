"""Running a model: load() gives an Engine (logits, generate); see the README for the API."""
from kernels.cpu.threads import configure_thread_waits

configure_thread_waits()  # before numpy and numba load, when inference is the first import

from inference.engine import Engine, GenerationStats, PromptTooLongError, load  # noqa: E402

__all__ = ["Engine", "GenerationStats", "PromptTooLongError", "load"]
