"""The messages of the open chat, scrolled to follow a streaming reply unless the user scrolls up."""
from textual.containers import VerticalScroll
from textual.widgets import Static

from app.store import Message
from app.tui.message_view import MessageView

EMPTY_HINT = "Type a message and press Enter. Ctrl+J adds a new line. F1 lists every key."


class Conversation(VerticalScroll):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.model_name = ""

    async def show(self, messages: list[Message], model_name: str) -> None:
        self.model_name = model_name
        await self.remove_children()
        if not messages:
            await self.mount(Static(EMPTY_HINT, classes="hint"))
        else:
            await self.mount_all([MessageView(m, self.author(m)) for m in messages])
        self.scroll_end(animate=False)
        self.anchor()

    async def add(self, message: Message) -> MessageView:
        await self.query(".hint").remove()
        view = MessageView(message, self.author(message))
        await self.mount(view)
        self.anchor()
        return view

    async def remove_from(self, message_id: int) -> None:
        """Remove the view of a message and every later one."""
        for view in [v for v in self.query(MessageView) if v.message.id >= message_id]:
            await view.remove()

    def author(self, message: Message) -> str:
        return "You" if message.role == "user" else (self.model_name or "Assistant")

    def last_reply(self) -> MessageView | None:
        replies = [v for v in self.query(MessageView) if v.message.role == "assistant"]
        return replies[-1] if replies else None
