"""Running a model: load() gives an Engine (logits, generate); see the README for the API."""
from inference.engine import Engine, GenerationStats, PromptTooLongError, load

__all__ = ["Engine", "GenerationStats", "PromptTooLongError", "load"]
