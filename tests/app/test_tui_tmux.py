"""End to end: `gguf-chat chat` in a real terminal (tmux), typed into and read back from the screen;
then killed mid-reply with SIGKILL and started again."""
import os
import shlex
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.app.tmux_driver import Tmux

ROOT = Path(__file__).resolve().parents[2]


def saved_reply(home: Path) -> tuple[str, str]:
    """Content and state of the newest message, read straight from the database file."""
    db = sqlite3.connect(home / "chats.sqlite3")
    try:
        return db.execute("SELECT content, state FROM messages ORDER BY id DESC LIMIT 1").fetchone()
    finally:
        db.close()


@pytest.fixture
def tmux(tmp_path):
    t = Tmux(f"gguf-chat-test-{os.getpid()}")
    yield t
    subprocess.run(["tmux", "-L", t.socket, "kill-server"], capture_output=True)


def test_chat_in_a_real_terminal_survives_kill(tmux, tmp_path):
    home = tmp_path / "home"
    command = (f"cd {shlex.quote(str(ROOT))} && GGUF_CHAT_HOME={shlex.quote(str(home))} exec {sys.executable} "
               "-m app.cli chat --ctx 512 --temperature 0 --max-tokens 200 "
               "--system 'You are a helpful assistant. Answer briefly.'")
    tmux.start(command)
    tmux.wait_for("ctx 0/512")  # the model is loaded

    tmux("send-keys", "-t", "chat", "-l", "What is the capital of France?")
    tmux("send-keys", "-t", "chat", "Enter")
    screen = tmux.wait_for(" tok/s · prompt ")  # the reply's stats line: it is complete
    assert "Paris" in screen
    assert "What is the capital of France" in screen.split("\n")[5]  # the sidebar lists the new chat

    # Ctrl+J is a new line in every terminal; Enter sends.
    tmux("send-keys", "-t", "chat", "-l", "Write a long poem")
    tmux("send-keys", "-t", "chat", "C-j")
    tmux("send-keys", "-t", "chat", "-l", "about the sea.")
    screen = tmux.wait_for("about the sea.")
    assert "Write a long poem" in screen and "Write a long poem about" not in screen
    tmux("send-keys", "-t", "chat", "Enter")
    tmux.wait_for("generating…")
    deadline = time.monotonic() + 120
    while len(saved_reply(home)[0].split()) < 3:  # the reply saved as it streams
        assert time.monotonic() < deadline
        time.sleep(0.2)
    assert "generating…" in tmux.screen()  # still writing when it is killed
    pid = int(tmux("display-message", "-p", "-t", "chat", "#{pane_pid}"))
    os.kill(pid, signal.SIGKILL)
    partial, state = saved_reply(home)
    assert state == "streaming"

    tmux.wait_closed()
    tmux.start(command)
    screen = tmux.wait_for("interrupted: the app was closed mid-reply")
    assert partial.splitlines()[0][:30] in screen
    assert "Write a long poem" in screen and "What is the capital of France?" in screen
