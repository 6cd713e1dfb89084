"""Snapshots of the main screens (pytest-textual-snapshot): update with `pytest --snapshot-update`.

Deterministic: stored stats instead of measured ones, a fixed context size, no notifications, no focused
text box (its blinking cursor would depend on the instant of the snapshot).
"""

import pytest

from app.store import ChatStore, Sampling
from app.tui.app import ChatApp
from app.tui.prompt_input import PromptInput

SIZE = (110, 34)
REPLY = """Here is the program:

```python
def main():
    print("Hello, world!")
```

Run it with `python hello.py`."""
STATS = {"prompt_tokens": 31, "prompt_seconds": 0.5, "generated_tokens": 27, "generation_seconds": 0.9,
         "finish_reason": "stop", "prompt_tok_s": 62.0, "generation_tok_s": 30.0, "context_tokens": 58}


@pytest.fixture
def store(tmp_path):
    store = ChatStore(tmp_path / "chats.sqlite3")
    yield store
    store.close()


def filled_app(store, smollm2) -> ChatApp:
    older = store.create_chat("Rust lifetimes", str(smollm2))
    store.add_message(older.id, "user", "What is a lifetime?")
    chat = store.create_chat("Hello world in Python", str(smollm2))
    store.add_message(chat.id, "user", "Write hello world in Python.")
    store.add_message(chat.id, "assistant", REPLY, stats=STATS)
    store.add_message(chat.id, "user", "And in C?")
    store.add_message(chat.id, "assistant", "In C you write:\n\n```c\n#include", state="interrupted")
    return ChatApp(store, str(smollm2), Sampling(temperature=0.0, max_tokens=16), "Answer briefly.", ctx=512)


async def settle(pilot) -> None:
    """Wait for the model, then remove what varies: the load-time notice and the blinking cursor."""
    prompt = pilot.app.query_one(PromptInput)
    while pilot.app.engine is None or not prompt.has_focus:
        await pilot.pause(0.1)
    pilot.app.clear_notifications()
    while pilot.app.screen.query("Toast"):  # the load-time notice leaves a frame later
        await pilot.pause(0.05)
    pilot.app.set_focus(None)  # no blinking cursor: whether it shows depends on the instant
    await pilot.pause()


def test_main_screen(snap_compare, store, smollm2):
    assert snap_compare(filled_app(store, smollm2), terminal_size=SIZE, run_before=settle)


def test_new_chat(snap_compare, store, smollm2):
    app = ChatApp(store, str(smollm2), Sampling(temperature=0.0), ctx=512)
    assert snap_compare(app, terminal_size=SIZE, run_before=settle)


def test_help_screen(snap_compare, store, smollm2):
    async def run_before(pilot):
        await settle(pilot)
        await pilot.press("f1")

    assert snap_compare(filled_app(store, smollm2), terminal_size=SIZE, run_before=run_before)


def test_settings_screen(snap_compare, store, smollm2):
    async def run_before(pilot):
        await settle(pilot)
        await pilot.press("ctrl+s")
        pilot.app.screen.query_one("#system_prompt").cursor_blink = False

    assert snap_compare(filled_app(store, smollm2), terminal_size=SIZE, run_before=run_before)
