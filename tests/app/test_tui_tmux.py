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

ROOT = Path(__file__).resolve().parents[2]


class Tmux:
    def __init__(self, socket: str):
        self.socket = socket

    def __call__(self, *args: str) -> str:
        return subprocess.run(["tmux", "-L", self.socket, *args], check=True, capture_output=True,
                              text=True).stdout

    def start(self, command: str) -> None:
        # A shell first, then the command typed into it: the app starts at the session's size, not 80x24.
        self("new-session", "-d", "-s", "chat", "-x", "120", "-y", "36", "sh")
        self("send-keys", "-t", "chat", "-l", command)
        self("send-keys", "-t", "chat", "Enter")

    def wait_closed(self) -> None:
        """Until the session whose process was killed is gone and its server has exited."""
        deadline = time.monotonic() + 30
        while subprocess.run(["tmux", "-L", self.socket, "list-sessions"], capture_output=True).returncode == 0:
            assert time.monotonic() < deadline
            time.sleep(0.1)
        time.sleep(0.5)

    def screen(self) -> str:
        return self("capture-pane", "-p", "-t", "chat")

    def wait_for(self, text: str, timeout: float = 180.0) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            screen = self.screen()
            if text in screen:
                return screen
            time.sleep(0.2)
        raise AssertionError(f"{text!r} not on the screen after {timeout} s:\n{self.screen()}")


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
