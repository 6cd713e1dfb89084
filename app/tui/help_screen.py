"""F1: every key of the app and of the focused widget, in one table."""
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import DataTable, Label

MORE_KEYS = [
    ("Enter", "Send the message"),
    ("Ctrl+J / Alt+Enter", "New line in the message"),
    ("Up (empty box)", "Recall the last message sent"),
    ("Tab / Shift+Tab", "Move between sidebar, messages and the box"),
    ("c (on a message)", "Copy the message (OSC 52)"),
    ("k (on a message)", "Copy its last code block (OSC 52)"),
    ("t (on a reply)", "Show or fold a reasoning model's thinking"),
]


class HelpScreen(ModalScreen):
    BINDINGS = [Binding("escape,f1,q", "app.pop_screen", "Close")]

    def __init__(self, bindings: list[Binding]):
        super().__init__()
        self.app_bindings = bindings

    def compose(self) -> ComposeResult:
        with Vertical(id="help"):
            yield Label("Keys", classes="title")
            yield DataTable(cursor_type="none", zebra_stripes=True)
            yield Label("Ctrl+P opens the command palette: every action above by name.", classes="hint")

    def on_mount(self) -> None:
        table = self.query_one(DataTable)
        table.add_columns("Key", "Action")
        for b in self.app_bindings:
            table.add_row(self.app.get_key_display(b), b.description)
        table.add_rows(MORE_KEYS)
