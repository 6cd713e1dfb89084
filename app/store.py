"""Saved chats in sqlite: chats with their settings, messages with their stats.

Every write is committed at once (WAL, synchronous=FULL), so a killed process loses nothing already shown.
A reply is saved in place while it streams, at most every `StreamingReply.interval` seconds; a reply still
marked 'streaming' when the store is next opened was cut off by a dead process and becomes 'interrupted'.
"""
import json
import os
import sqlite3
import time
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

SCHEMA = """
CREATE TABLE IF NOT EXISTS chats (
    id INTEGER PRIMARY KEY AUTOINCREMENT,  -- ids never reused after a delete
    title TEXT NOT NULL,
    model TEXT NOT NULL DEFAULT '',          -- path or name of the model the chat uses; '' = the default
    system_prompt TEXT NOT NULL DEFAULT '',
    sampling TEXT NOT NULL DEFAULT '{}',     -- JSON of Sampling
    created REAL NOT NULL,
    updated REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS messages (
    id INTEGER PRIMARY KEY AUTOINCREMENT,  -- ids never reused after a delete
    chat_id INTEGER NOT NULL REFERENCES chats(id) ON DELETE CASCADE,
    role TEXT NOT NULL CHECK (role IN ('user', 'assistant')),
    content TEXT NOT NULL,
    state TEXT NOT NULL CHECK (state IN ('done', 'streaming', 'stopped', 'interrupted', 'error')),
    created REAL NOT NULL,
    stats TEXT                               -- JSON of the reply's GenerationStats, NULL for user messages
);
CREATE INDEX IF NOT EXISTS messages_by_chat ON messages (chat_id, id);
"""


def data_dir() -> Path:
    """$GGUF_CHAT_HOME, else $XDG_DATA_HOME/gguf-chat, else ~/.local/share/gguf-chat."""
    if home := os.environ.get("GGUF_CHAT_HOME"):
        return Path(home)
    xdg = os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share"
    return Path(xdg) / "gguf-chat"


def default_db_path() -> Path:
    return data_dir() / "chats.sqlite3"


@dataclass
class Sampling:
    """Per-chat generation settings, the keyword arguments of Engine.generate."""
    temperature: float = 0.8
    top_k: int = 40
    top_p: float = 0.95
    min_p: float = 0.05
    repeat_penalty: float = 1.0
    max_tokens: int = 1024
    seed: int | None = None

    @classmethod
    def from_json(cls, text: str) -> "Sampling":
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in json.loads(text).items() if k in known})


@dataclass
class Chat:
    id: int
    title: str
    model: str
    system_prompt: str
    sampling: Sampling = field(default_factory=Sampling)


@dataclass
class Message:
    id: int
    chat_id: int
    role: str       # 'user' | 'assistant'
    content: str
    state: str      # 'done' | 'streaming' | 'stopped' | 'interrupted' | 'error'
    stats: dict | None = None


class ChatStore:
    def __init__(self, path: Path):
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self.db = sqlite3.connect(path, isolation_level=None)  # autocommit: every statement is durable
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=FULL")
        self.db.execute("PRAGMA foreign_keys=ON")
        self.db.execute("PRAGMA busy_timeout=5000")
        self.db.executescript(SCHEMA)
        # A reply left 'streaming' belongs to a process that died mid-reply.
        self.db.execute("UPDATE messages SET state = 'interrupted' WHERE state = 'streaming'")

    def close(self) -> None:
        self.db.close()

    # chats

    def create_chat(self, title: str = "New chat", model: str = "", system_prompt: str = "",
                    sampling: Sampling | None = None) -> Chat:
        sampling = sampling or Sampling()
        now = time.time()
        cur = self.db.execute(
            "INSERT INTO chats (title, model, system_prompt, sampling, created, updated) VALUES (?, ?, ?, ?, ?, ?)",
            (title, model, system_prompt, json.dumps(asdict(sampling)), now, now))
        return Chat(cur.lastrowid, title, model, system_prompt, sampling)

    def get_chat(self, chat_id: int) -> Chat | None:
        row = self.db.execute("SELECT id, title, model, system_prompt, sampling FROM chats WHERE id = ?",
                              (chat_id,)).fetchone()
        return _chat(row) if row else None

    def list_chats(self, query: str = "") -> list[Chat]:
        """Chats, most recently used first; with a query, those whose title or any message contains it."""
        if not query:
            rows = self.db.execute("SELECT id, title, model, system_prompt, sampling FROM chats "
                                   "ORDER BY updated DESC, id DESC").fetchall()
            return [_chat(r) for r in rows]
        pattern = "%" + query.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"
        rows = self.db.execute(
            "SELECT id, title, model, system_prompt, sampling FROM chats WHERE title LIKE ?1 ESCAPE '\\' "
            "OR id IN (SELECT chat_id FROM messages WHERE content LIKE ?1 ESCAPE '\\') "
            "ORDER BY updated DESC, id DESC", (pattern,)).fetchall()
        return [_chat(r) for r in rows]

    def update_chat(self, chat: Chat) -> None:
        """Save a chat's title, model, system prompt and sampling settings."""
        self.db.execute("UPDATE chats SET title = ?, model = ?, system_prompt = ?, sampling = ? WHERE id = ?",
                        (chat.title, chat.model, chat.system_prompt, json.dumps(asdict(chat.sampling)), chat.id))

    def delete_chat(self, chat_id: int) -> None:
        self.db.execute("DELETE FROM chats WHERE id = ?", (chat_id,))

    # messages

    def messages(self, chat_id: int) -> list[Message]:
        rows = self.db.execute("SELECT id, chat_id, role, content, state, stats FROM messages "
                               "WHERE chat_id = ? ORDER BY id", (chat_id,)).fetchall()
        return [Message(i, c, role, content, state, json.loads(stats) if stats else None)
                for i, c, role, content, state, stats in rows]

    def add_message(self, chat_id: int, role: str, content: str, state: str = "done",
                    stats: dict | None = None) -> Message:
        now = time.time()
        with self.db:  # the message and the chat's last-used time together
            self.db.execute("BEGIN")
            cur = self.db.execute(
                "INSERT INTO messages (chat_id, role, content, state, created, stats) VALUES (?, ?, ?, ?, ?, ?)",
                (chat_id, role, content, state, now, json.dumps(stats) if stats else None))
            self.db.execute("UPDATE chats SET updated = ? WHERE id = ?", (now, chat_id))
        return Message(cur.lastrowid, chat_id, role, content, state, stats)

    def update_message(self, message_id: int, content: str, state: str, stats: dict | None = None) -> None:
        self.db.execute("UPDATE messages SET content = ?, state = ?, stats = ? WHERE id = ?",
                        (content, state, json.dumps(stats) if stats else None, message_id))

    def delete_messages_from(self, chat_id: int, message_id: int) -> None:
        """Delete a message and every later one of its chat (regenerate, edit and resend)."""
        self.db.execute("DELETE FROM messages WHERE chat_id = ? AND id >= ?", (chat_id, message_id))


def _chat(row) -> Chat:
    chat_id, title, model, system_prompt, sampling = row
    return Chat(chat_id, title, model, system_prompt, Sampling.from_json(sampling))


class StreamingReply:
    """An assistant reply saved in place as it grows: at most one write every `interval` seconds."""

    def __init__(self, store: ChatStore, chat_id: int, interval: float = 0.25):
        self.store = store
        self.interval = interval
        self.text = ""
        self.message = store.add_message(chat_id, "assistant", "", state="streaming")
        self._saved_at = time.monotonic()

    def append(self, piece: str) -> None:
        self.text += piece
        if time.monotonic() - self._saved_at >= self.interval:
            self.store.update_message(self.message.id, self.text, "streaming")
            self._saved_at = time.monotonic()

    def finish(self, state: str, stats: dict | None = None) -> Message:
        """state: 'done', 'stopped' (the user pressed Escape) or 'error'."""
        self.store.update_message(self.message.id, self.text, state, stats)
        self.message.content, self.message.state, self.message.stats = self.text, state, stats
        return self.message
