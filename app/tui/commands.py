"""The command palette (Ctrl+P): every chat action by name."""
from functools import partial

from textual.command import DiscoveryHit, Hit, Hits, Provider

# (name, help, app action)
CHAT_COMMANDS = [
    ("New chat", "Start an empty chat", "new_chat"),
    ("Rename chat", "Give the open chat a new title", "rename_chat"),
    ("Delete chat", "Delete the open chat and its messages", "delete_chat"),
    ("Search chats", "Search titles and messages in the sidebar", "search"),
    ("Stop reply", "Stop the reply being written", "stop"),
    ("Regenerate reply", "Write the last reply again", "regenerate"),
    ("Edit last message", "Take the last message back into the box to edit and resend", "edit_last"),
    ("Copy last reply", "Copy the last reply to the clipboard (OSC 52)", "copy_reply"),
    ("Copy last code block", "Copy the last code block of the last reply (OSC 52)", "copy_code"),
    ("Chat settings", "System prompt and sampling of this chat", "settings"),
    ("Choose model", "Pick the model of this chat", "pick_model"),
    ("Toggle sidebar", "Show or hide the list of chats", "toggle_sidebar"),
    ("Keys", "Every key binding", "help"),
]


class ChatCommands(Provider):
    async def discover(self) -> Hits:
        for name, help_text, action in CHAT_COMMANDS:
            yield DiscoveryHit(name, partial(self.app.run_action, action), help=help_text)

    async def search(self, query: str) -> Hits:
        matcher = self.matcher(query)
        for name, help_text, action in CHAT_COMMANDS:
            if (score := matcher.match(name)) > 0:
                yield Hit(score, matcher.highlight(name), partial(self.app.run_action, action), help=help_text)
