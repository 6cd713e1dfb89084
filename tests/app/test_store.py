import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

from app.store import ChatStore, Sampling, StreamingReply, data_dir


def test_pragmas_wal_and_synchronous_full(tmp_path):
    store = ChatStore(tmp_path / "chats.sqlite3")
    assert store.db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert store.db.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL


def test_chats_round_trip_with_settings(tmp_path):
    path = tmp_path / "chats.sqlite3"
    store = ChatStore(path)
    chat = store.create_chat("Rust question", model="/m/a.gguf", system_prompt="Be brief.",
                             sampling=Sampling(temperature=0.0, max_tokens=32, seed=7))
    store.add_message(chat.id, "user", "hi")
    store.add_message(chat.id, "assistant", "hello", stats={"generated_tokens": 2, "generation_tok_s": 9.5})
    chat.title = "Renamed"
    chat.sampling.top_k = 1
    store.update_chat(chat)
    store.close()

    store = ChatStore(path)
    [again] = store.list_chats()
    assert again == chat
    msgs = store.messages(chat.id)
    assert [(m.role, m.content, m.state) for m in msgs] == [("user", "hi", "done"), ("assistant", "hello", "done")]
    assert msgs[1].stats == {"generated_tokens": 2, "generation_tok_s": 9.5}


def test_unknown_sampling_keys_are_dropped():
    assert Sampling.from_json('{"temperature": 0.1, "mirostat": 2}') == Sampling(temperature=0.1)


def test_list_orders_by_last_use_and_search_finds_titles_and_contents(tmp_path):
    store = ChatStore(tmp_path / "c.sqlite3")
    a = store.create_chat("About cats")
    b = store.create_chat("About dogs")
    store.add_message(b.id, "user", "what do dogs eat?")
    store.add_message(a.id, "user", "do cats like 100% tuna_fish?")
    assert [c.id for c in store.list_chats()] == [a.id, b.id]
    assert [c.id for c in store.list_chats("DOGS")] == [b.id]
    assert [c.id for c in store.list_chats("tuna")] == [a.id]
    assert [c.id for c in store.list_chats("100%")] == [a.id]
    assert store.list_chats("0%_") == []  # % and _ are literal, not wildcards
    assert store.list_chats("nothing like this") == []


def test_delete_chat_deletes_its_messages(tmp_path):
    store = ChatStore(tmp_path / "c.sqlite3")
    chat = store.create_chat()
    store.add_message(chat.id, "user", "x")
    store.delete_chat(chat.id)
    assert store.list_chats() == []
    assert store.db.execute("SELECT count(*) FROM messages").fetchone()[0] == 0


def test_delete_messages_from_cuts_the_tail(tmp_path):
    store = ChatStore(tmp_path / "c.sqlite3")
    chat = store.create_chat()
    other = store.create_chat()
    ids = [store.add_message(chat.id, r, t).id for r, t in [("user", "1"), ("assistant", "2"), ("user", "3")]]
    store.add_message(other.id, "user", "keep")
    store.delete_messages_from(chat.id, ids[1])
    assert [m.content for m in store.messages(chat.id)] == ["1"]
    assert [m.content for m in store.messages(other.id)] == ["keep"]


def test_streaming_reply_saves_at_a_bounded_rate(tmp_path):
    store = ChatStore(tmp_path / "c.sqlite3")
    chat = store.create_chat()
    reply = StreamingReply(store, chat.id, interval=3600)
    reply.append("a")
    assert store.messages(chat.id)[0].content == ""  # not yet: the interval has not passed
    reply.interval = 0
    reply.append("b")
    [m] = store.messages(chat.id)
    assert (m.content, m.state) == ("ab", "streaming")
    reply.finish("stopped", {"generated_tokens": 2})
    [m] = store.messages(chat.id)
    assert (m.content, m.state, m.stats) == ("ab", "stopped", {"generated_tokens": 2})


WRITER = """
import sys, time
from pathlib import Path
from app.store import ChatStore, StreamingReply
store = ChatStore(Path(sys.argv[1]))
chat = store.create_chat("killed")
store.add_message(chat.id, "user", "count")
reply = StreamingReply(store, chat.id, interval=0.05)
for i in range(100000):
    reply.append(f"{i} ")
    if i == 20:
        print("streaming", flush=True)
    time.sleep(0.005)
"""


def test_reply_survives_sigkill_and_is_marked_interrupted(tmp_path):
    path = tmp_path / "c.sqlite3"
    proc = subprocess.Popen([sys.executable, "-c", WRITER, str(path)], stdout=subprocess.PIPE, text=True,
                            cwd=Path(__file__).resolve().parents[2])
    assert proc.stdout.readline() == "streaming\n"
    time.sleep(0.5)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()

    # Before reopening through the store, the raw file already holds the partial reply.
    raw = sqlite3.connect(path)
    content, state = raw.execute("SELECT content, state FROM messages WHERE role = 'assistant'").fetchone()
    raw.close()
    assert state == "streaming"
    store = ChatStore(path)
    [chat] = store.list_chats()
    user, reply = store.messages(chat.id)
    assert user.content == "count"
    assert reply.state == "interrupted"
    assert reply.content == content
    numbers = reply.content.split()
    assert len(numbers) > 20 and numbers == [str(i) for i in range(len(numbers))]


def test_data_dir_from_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("GGUF_CHAT_HOME", str(tmp_path / "home"))
    assert data_dir() == tmp_path / "home"
    monkeypatch.delenv("GGUF_CHAT_HOME")
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    assert data_dir() == tmp_path / "xdg" / "gguf-chat"
