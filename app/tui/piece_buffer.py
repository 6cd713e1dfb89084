"""Where the engine thread leaves a reply's text for the UI, which takes it once a frame (not once a token).

The engine never waits on the UI: putting a piece is a list append under a lock, with no message posted and no
event loop woken per token. The UI's work (Markdown, layout, drawing) then runs at the frame rate whatever the
engine's speed: about 20 times a second, not 100 or 1000.
"""
import threading


class PieceBuffer:
    def __init__(self):
        self._lock = threading.Lock()
        self._pieces: list[str] = []

    def put(self, text: str) -> None:
        with self._lock:
            self._pieces.append(text)

    def take(self) -> str:
        """All the text put since the last take, in order; '' when none."""
        with self._lock:
            pieces, self._pieces = self._pieces, []
        return "".join(pieces)
