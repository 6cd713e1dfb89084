"""Per-chat settings: system prompt and sampling. Returns the edited Chat, or None when cancelled."""
from dataclasses import fields, replace

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Button, Input, Label, TextArea

from app.store import Chat, Sampling

# name -> (label, parse)
FIELDS = {
    "temperature": ("Temperature (0 = greedy)", float),
    "top_k": ("Top-k", int),
    "top_p": ("Top-p", float),
    "min_p": ("Min-p", float),
    "repeat_penalty": ("Repeat penalty", float),
    "max_tokens": ("Max tokens per reply", int),
    "seed": ("Seed (empty = random)", int),
}
assert set(FIELDS) == {f.name for f in fields(Sampling)}
# name -> (the values it takes, said as in an error); what the sampler would refuse or ignore
RANGES = {
    "temperature": (lambda v: v >= 0, "0 or more"),
    "top_k": (lambda v: v >= 0, "0 (off) or more"),
    "top_p": (lambda v: 0 < v <= 1, "above 0, at most 1"),
    "min_p": (lambda v: 0 <= v <= 1, "0 to 1"),
    "repeat_penalty": (lambda v: v > 0, "above 0"),
    "max_tokens": (lambda v: v >= 1, "1 or more"),
}


class SettingsScreen(ModalScreen[Chat | None]):
    BINDINGS = [Binding("escape", "cancel", "Cancel"), Binding("ctrl+s", "save", "Save")]

    def __init__(self, chat: Chat):
        super().__init__()
        self.chat = chat

    def compose(self) -> ComposeResult:
        with VerticalScroll(classes="dialog", id="settings"):
            yield Label(f"Settings of “{self.chat.title}”", classes="title", markup=False)
            yield Label("System prompt")
            yield TextArea(self.chat.system_prompt, id="system_prompt", soft_wrap=True, tab_behavior="focus",
                           compact=True)
            for name, (label, _) in FIELDS.items():
                value = getattr(self.chat.sampling, name)
                with Horizontal(classes="field"):
                    yield Label(label)
                    yield Input("" if value is None else str(value), id=name, compact=True)
            with Horizontal(classes="buttons"):
                yield Button("Save (Ctrl+S)", variant="primary", id="save")
                yield Button("Cancel (Esc)", id="cancel")

    @on(Button.Pressed, "#save")
    def action_save(self) -> None:
        values = {}
        for name, (label, parse) in FIELDS.items():
            text = self.query_one(f"#{name}", Input).value.strip()
            if name == "seed" and not text:
                values[name] = None
                continue
            try:
                values[name] = parse(text)
            except ValueError:
                self.notify(f"{label}: “{text}” is not a number", severity="error")
                return
            ok, allowed = RANGES.get(name, (lambda v: True, ""))
            if not ok(values[name]):
                self.notify(f"{label}: takes {allowed}, not {text}", severity="error")
                return
        system_prompt = self.query_one("#system_prompt", TextArea).text
        self.dismiss(replace(self.chat, system_prompt=system_prompt, sampling=Sampling(**values)))

    @on(Button.Pressed, "#cancel")
    def action_cancel(self) -> None:
        self.dismiss(None)
