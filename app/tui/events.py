"""What the engine workers tell the UI: small messages posted from their threads."""
from dataclasses import dataclass

from textual.message import Message


@dataclass
class ModelLoaded(Message):
    model: str
    engine: object
    seconds: float


@dataclass
class EngineNotice(Message):
    """Something the engine decided on its own, e.g. layers moved to the CPU after running out of VRAM."""
    text: str


@dataclass
class ModelProgress(Message):
    """A download of the model (a Hub reference not pulled yet): bytes of one file."""
    model: str
    file: str
    done: int
    total: int


@dataclass
class ModelFailed(Message):
    model: str
    error: str


@dataclass
class ReplyFinished(Message):
    stats: dict | None  # GenerationStats as a dict with its rates; None when stopped before it came
    stopped: bool


@dataclass
class ReplyFailed(Message):
    error: str
