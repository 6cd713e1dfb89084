"""The sidebar: a search box over titles and message text, and the saved chats, most recent first."""
from dataclasses import dataclass

from textual import on
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.message import Message
from textual.widgets import Input, Label, ListItem, ListView

from app.store import Chat


class ChatItem(ListItem):
    def __init__(self, chat: Chat):
        super().__init__(Label(chat.title, markup=False))
        self.chat = chat


class ChatList(Vertical):
    @dataclass
    class Selected(Message):
        chat_id: int

    @dataclass
    class SearchChanged(Message):
        query: str

    def compose(self) -> ComposeResult:
        yield Input(placeholder="Search chats", id="search")
        yield ListView(id="chats")

    async def show(self, chats: list[Chat], current_id: int | None) -> None:
        view = self.query_one(ListView)
        await view.clear()
        await view.extend([ChatItem(c) for c in chats])
        ids = [c.id for c in chats]
        view.index = ids.index(current_id) if current_id in ids else None

    @on(ListView.Selected)
    def chat_chosen(self, event: ListView.Selected) -> None:
        event.stop()
        self.post_message(self.Selected(event.item.chat.id))

    @on(Input.Changed, "#search")
    def search_changed(self, event: Input.Changed) -> None:
        event.stop()
        self.post_message(self.SearchChanged(event.value))

    @on(Input.Submitted, "#search")
    def search_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        self.query_one(ListView).focus()
