"""Drives a program in a real terminal: a tmux server of its own (`-L socket`), a session "chat" 120 x 36.
Used by tests/app/test_tui_tmux.py and the bench script tests/app/bench_chat.py (which runs without pytest)."""
import subprocess
import time


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
