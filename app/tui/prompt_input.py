"""Where the user types: Enter sends; Ctrl+J or Alt+Enter adds a new line (Shift+Enter fails in several
terminals); Up in an empty box recalls the last message sent."""
from dataclasses import dataclass

from textual import events
from textual.message import Message
from textual.widgets import TextArea


class PromptInput(TextArea):
    @dataclass
    class Submitted(Message):
        text: str

    def __init__(self, **kwargs):
        super().__init__(soft_wrap=True, show_line_numbers=False, tab_behavior="focus", **kwargs)
        self.last_sent = ""

    async def _on_key(self, event: events.Key) -> None:
        if event.key == "enter":
            event.stop()
            event.prevent_default()
            if self.text.strip():
                self.post_message(self.Submitted(self.text.strip()))
        elif event.key in ("ctrl+j", "alt+enter"):
            event.stop()
            event.prevent_default()
            self.insert("\n")
        elif event.key == "up" and not self.text and self.last_sent:
            event.stop()
            event.prevent_default()
            self.load_text(self.last_sent)
            self.move_cursor(self.document.end)
        else:
            await super()._on_key(event)
