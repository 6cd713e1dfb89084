"""Snapshots of the main screens (pytest-textual-snapshot): update with `pytest --snapshot-update`.

Deterministic: stored stats instead of measured ones, a fixed context size, no notifications, no focused
text box (its blinking cursor would depend on the instant of the snapshot), and the screen unchanged over
several frames before it is taken (Markdown parses in a thread). A mismatch prints the two screens' text.
"""
import difflib
import html
import re
from pathlib import Path

import pytest

from app.store import ChatStore, Sampling
from app.tui.app import ChatApp
from app.tui.prompt_input import PromptInput

SIZE = (110, 34)
SNAPSHOTS = Path(__file__).parent / "__snapshots__" / Path(__file__).stem
CELL_WIDTH = 12.2  # of a character in rich's SVG export
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
    return ChatApp(store, str(smollm2), Sampling(temperature=0.0, max_tokens=16), "Answer briefly.", ctx=512,
                   warm_up=False)  # no first-start notice to time a screen against


async def settle(pilot) -> None:
    """Wait for the model and its load notice, then remove what varies: the notice and the blinking cursor."""
    prompt = pilot.app.query_one(PromptInput)
    while pilot.app.engine is None or not prompt.has_focus:
        await pilot.pause(0.05)
    for _ in range(100):  # notify() posts a message: the notice shows a few frames after the engine is set
        if pilot.app.screen.query("Toast"):
            break
        await pilot.pause(0.05)
    pilot.app.clear_notifications()
    while pilot.app.screen.query("Toast"):  # the notice leaves a frame later
        await pilot.pause(0.05)
    pilot.app.set_focus(None)  # no blinking cursor: whether it shows depends on the instant
    await steady(pilot)


async def steady(pilot, frames: int = 3) -> None:
    """Wait until the screen has not changed for `frames` frames in a row (at most ~5 s)."""
    last, same = None, 0
    for _ in range(100):
        await pilot.pause(0.05)
        shot = pilot.app.export_screenshot()
        same = same + 1 if shot == last else 0
        if same == frames:
            return
        last = shot


def screen_text(svg: str) -> list[str]:
    """The characters of each line of a screenshot, placed at their columns."""
    lines = {}
    for x, line, text in re.findall(r'<text[^>]* x="([\d.]+)"[^>]*terminal-(?:\d+-)?line-(\d+)\)">([^<]*)</text>', svg):
        row = lines.setdefault(int(line), [" "] * SIZE[0])
        col = round(float(x) / CELL_WIDTH)
        for i, ch in enumerate(html.unescape(text).replace("\xa0", " ")):
            if col + i < SIZE[0]:
                row[col + i] = ch
    return ["".join(lines[i]).rstrip() for i in sorted(lines)]


def assert_snapshot(snap_compare, request, app: ChatApp, run_before) -> None:
    """snap_compare, and on a mismatch the text of both screens, diffed, for CI's log."""
    shots = []

    async def run_and_keep(pilot):
        await run_before(pilot)
        shots.append(pilot.app.export_screenshot())

    if snap_compare(app, terminal_size=SIZE, run_before=run_and_keep):
        return
    stored = SNAPSHOTS / f"{request.node.name}.svg"
    diff = difflib.unified_diff(screen_text(stored.read_text()) if stored.exists() else [],
                                screen_text(shots[-1]) if shots else [], "stored", "now", lineterm="")
    pytest.fail("the screen differs from its snapshot; the text of both:\n" + "\n".join(diff)
                + "\n(no text differs: colours or styles do)", pytrace=False)


def test_main_screen(snap_compare, request, store, smollm2):
    assert_snapshot(snap_compare, request, filled_app(store, smollm2), settle)


def test_new_chat(snap_compare, request, store, smollm2):
    app = ChatApp(store, str(smollm2), Sampling(temperature=0.0), ctx=512)
    assert_snapshot(snap_compare, request, app, settle)


def test_help_screen(snap_compare, request, store, smollm2):
    async def run_before(pilot):
        await settle(pilot)
        await pilot.press("f1")
        await steady(pilot)

    assert_snapshot(snap_compare, request, filled_app(store, smollm2), run_before)


def test_settings_screen(snap_compare, request, store, smollm2):
    async def run_before(pilot):
        await settle(pilot)
        await pilot.press("ctrl+s")
        pilot.app.screen.query_one("#system_prompt").cursor_blink = False
        await steady(pilot)

    assert_snapshot(snap_compare, request, filled_app(store, smollm2), run_before)


def test_thinking_folded(snap_compare, request, store, smollm2):
    """A reasoning model's reply: its thinking folded to one line above the answer."""
    chat = store.create_chat("Is 17 prime?", str(smollm2))
    store.add_message(chat.id, "user", "Is 17 prime?")
    store.add_message(chat.id, "assistant", "<think>\nSeventeen is divisible only by 1 and by itself, so it is "
                      "prime.\n</think>\n\nYes: **17 is prime**.", stats=STATS)
    app = ChatApp(store, str(smollm2), Sampling(temperature=0.0, max_tokens=16), ctx=512)
    assert_snapshot(snap_compare, request, app, settle)
