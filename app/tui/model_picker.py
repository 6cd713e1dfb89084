"""Choose the model of a chat: the default, pulled models, models other chats use, or a path or Hub
reference typed in (owner/repo[:QUANT]: pulled with progress when the chat loads it)."""
from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Input, Label, OptionList
from textual.widgets.option_list import Option

from app.store import ChatStore
from models import hub, model_ref
from models.packaged import smollm2_path


def default_model() -> str:
    """The configured default model ($GGUF_CHAT_MODEL or config.toml), else the packaged SmolLM2."""
    return model_ref.default_model() or str(smollm2_path())


def model_label(model: str) -> str:
    return model.rsplit("/", 1)[-1].removesuffix(".gguf")


def known_models(store: ChatStore, default: str) -> list[str]:
    """The default model first, then the pulled ones, then every other model a saved chat uses."""
    models = [default] + [m.name for m in hub.list_models()] + [c.model for c in store.list_chats()]
    return list(dict.fromkeys(m for m in models if m))


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
            yield Label("or a .gguf path, or a Hub model to pull (owner/repo:QUANT):")
            yield Input(placeholder="/path/to/model.gguf or bartowski/SmolLM2-360M-Instruct-GGUF:Q4_K_M",
                        id="model-path")

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
