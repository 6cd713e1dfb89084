"""Pilot tests that drive the real app on SmolLM2 on the CPU (greedy, short replies)."""
import asyncio
import os
import select
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from textual import events

from app.store import ChatStore, Sampling
from app.tui.app import ChatApp
from app.tui.conversation import Conversation
from app.tui.message_view import MessageView
from app.tui.prompt_input import PromptInput
from app.tui.status_bar import StatusBar

pytestmark = pytest.mark.usefixtures("cli_kernels_cached")  # SmolLM2's kernels from numba's cache (conftest)

SYSTEM = "You are a helpful assistant. Answer briefly."
SIZE = (100, 36)
ROOT = Path(__file__).resolve().parents[2]


def make_app(store, model, max_tokens=16, ctx=512, warm_up=False) -> ChatApp:
    """A chat app on model, not warmed up unless asked (chat --no-warmup): the warm-up changes no reply (test_run),
    and ~1.5 CPU-s a start over this file's apps was ~20 s of CI's 2-core machine."""
    return ChatApp(store, str(model), Sampling(temperature=0.0, max_tokens=max_tokens), SYSTEM, ctx, warm_up=warm_up)


async def wait_for(pilot, condition, timeout=120.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        await pilot.pause(0.05)


async def send(pilot, text: str) -> None:
    await pilot.press(*text)
    await pilot.press("enter")


def replied(app, store, after: int = 0):
    """A condition: the app is idle and the chat ends with a finished reply newer than message id `after`."""
    def done():
        messages = store.messages(app.chat.id)
        return (app.reply is None and messages and messages[-1].role == "assistant"
                and messages[-1].state != "streaming" and messages[-1].id > after)
    return done


def views(app) -> list[MessageView]:
    return list(app.query_one(Conversation).query(MessageView))


def notes(app) -> list[str]:
    return [n.message for n in app._notifications]


@pytest.fixture
def store(tmp_path):
    store = ChatStore(tmp_path / "chats.sqlite3")
    yield store
    store.close()


def test_send_streams_a_reply_and_typing_stays_responsive(store, smollm2):
    async def run():
        app = make_app(store, smollm2, max_tokens=400)
        async with app.run_test(size=SIZE) as pilot:
            await wait_for(pilot, lambda: app.engine is not None)
            # Watch with plain sleeps: Pilot's press and pause wait until the app is idle, by which time a
            # short reply can be complete.
            prompt, states = app.query_one(PromptInput), []
            await pilot.press(*"Write a story about a dragon.")
            prompt.post_message(events.Key("enter", None))
            deadline = time.monotonic() + 120
            while not replied(app, store)():
                assert time.monotonic() < deadline, "timed out"
                if app.reply_view is not None:
                    states.append((app.reply_view.message.content, prompt.text))
                    if states[-1][0] and not prompt.text:
                        for key in "next":  # typed while the reply streams
                            prompt.post_message(events.Key(key, key))
                await asyncio.sleep(0.01)
            user, reply = store.messages(app.chat.id)
            history = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": user.content}]
            expected = "".join(p for p in app.engine.generate(history, max_tokens=400, temperature=0.0)
                               if isinstance(p, str))
            return app, user, reply, states, expected

    app, user, reply, states, expected = asyncio.run(run())
    assert (user.content, user.state) == ("Write a story about a dragon.", "done")
    assert reply.state == "done" and reply.content == expected and "dragon" in reply.content
    shown = {content for content, _ in states}
    # the view grew piece by piece, not all at once: frames, not tokens, and fewer while the UI thread (this test's
    # loop included) is over its share of a core (app/tui/frame_budget.py), but at least every FRAME_MAX_GAP: a reply
    # of 400 tokens (~2.5 s on two cores) shows several (a fresh clone's CI saw 2 before the gap: '' and 'In')
    assert len(shown) >= 3
    assert all(reply.content.startswith(s) for s in shown)
    # the box took the keys while the reply was still growing
    assert any(typed == "next" and content != reply.content for content, typed in states)
    assert reply.stats["generated_tokens"] <= 400 and reply.stats["generation_tok_s"] > 0
    assert app.chat.title == "Write a story about a dragon."


def test_the_load_and_every_reply_run_on_one_engine_thread(store, smollm2, monkeypatch):
    """A message sent while the model loads waits for it, then it and later replies run on the load's thread: numba's
    parallel regions keep a thread pool per calling thread, and a second pool next to the load's made libgomp stop
    spinning (replies at 0.3-0.66 of run's speed). The load lingers after posting ModelLoaded, as a thread of
    asyncio's executor (textual's thread workers) did while the first reply started on another.
    A first start's kernels notice stays, its seconds counted in the status bar, until the model is ready."""
    from app.tui import engine_work
    from app.tui.events import EngineNotice
    from app.warm_up import NOTICE
    threads = []
    load, generate = engine_work.load_model, engine_work.generate_reply

    def lingering_load(model, ctx, post, options, warm):
        threads.append(("load", threading.get_ident()))
        post(EngineNotice(NOTICE))  # as warm_up says it on a first start
        post(EngineNotice(NOTICE))  # and again: the real warm-up below says it too where it is slow
        time.sleep(2.5)
        load(model, ctx, post, options, warm)
        time.sleep(0.5)

    def recorded_generate(*args, **kwargs):
        threads.append(("reply", threading.get_ident()))
        generate(*args, **kwargs)

    monkeypatch.setattr(engine_work, "load_model", lingering_load)
    monkeypatch.setattr(engine_work, "generate_reply", recorded_generate)

    async def run():
        app = make_app(store, smollm2, max_tokens=4, warm_up=True)
        async with app.run_test(size=SIZE) as pilot:
            await wait_for(pilot, lambda: app.loading_model)
            await send(pilot, "Hi")  # while the model loads
            await wait_for(pilot, lambda: app.reply_waits_for_model)
            assert app.engine is None
            app.notify("said while the kernels compile", timeout=60)
            states, noticed = set(), []
            deadline = time.monotonic() + 120
            while app.engine is None:
                assert time.monotonic() < deadline, "timed out"
                states.add(app.query_one(StatusBar).state)
                noticed.append(NOTICE in notes(app))
                await pilot.pause(0.1)
            assert "preparing the kernels (first start): 2 s, your message waits for them…" in states, states
            assert all(noticed)  # the notice lasted the whole compile (a toast of 10 s did not)
            await wait_for(pilot, replied(app, store))
            assert NOTICE not in notes(app) and "preparing" not in app.query_one(StatusBar).state
            assert "said while the kernels compile" in notes(app)  # only the kernels' notice went
            first = store.messages(app.chat.id)[-1].id
            await send(pilot, "Hello")
            await wait_for(pilot, replied(app, store, first))

    asyncio.run(run())
    assert [what for what, _ in threads] == ["load", "reply", "reply"]
    assert len({thread for _, thread in threads}) == 1 and threading.get_ident() not in {t for _, t in threads}


def test_escape_stops_mid_reply(store, smollm2):
    async def run():
        app = make_app(store, smollm2, max_tokens=400)
        async with app.run_test(size=SIZE) as pilot:
            await send(pilot, "Write a long story about a dragon.")
            await wait_for(pilot, lambda: app.reply_view is not None and len(app.reply_view.message.content) > 10)
            await pilot.press("escape")
            await wait_for(pilot, lambda: app.reply is None, timeout=10)
            shown = views(app)[-1].query_one(".stats").render()
            return store.messages(app.chat.id), str(shown)

    (user, reply), shown = asyncio.run(run())
    assert reply.state == "stopped" and len(reply.content) > 10
    assert reply.stats is None  # stopped before the engine's final stats
    assert "stopped" in shown


def test_regenerate_replaces_the_last_reply(store, smollm2):
    async def run():
        app = make_app(store, smollm2)
        async with app.run_test(size=SIZE) as pilot:
            await send(pilot, "Say hello.")
            await wait_for(pilot, replied(app, store))
            first = store.messages(app.chat.id)
            await pilot.press("ctrl+r")
            await wait_for(pilot, replied(app, store, after=first[1].id))
            return first, store.messages(app.chat.id), [v.message.content for v in views(app)]

    first, second, shown = asyncio.run(run())
    assert len(second) == 2 and second[0] == first[0]
    assert second[1].id != first[1].id and second[1].state == "done"
    assert second[1].content == first[1].content  # greedy: the same reply again
    assert shown == [m.content for m in second]


@pytest.fixture(scope="module")
def hybrid_chat_model(tmp_path_factory, smollm2):
    """A random qwen35 (Gated DeltaNet and attention layers) with SmolLM2's vocabulary and chat template."""
    from tests.inference.synthetic import write_synthetic
    path = tmp_path_factory.mktemp("hybrid") / "qwen35.gguf"
    write_synthetic(path, "qwen35", vocab_from=smollm2)
    return path


def test_regenerate_in_a_long_conversation_resumes_from_a_checkpoint(store, hybrid_chat_model):
    """A hybrid model's state cannot be rewound: regenerate resumes from the checkpoint at the end of the prompt, so
    the status bar shows a prompt of a few tokens where the first time processed the whole conversation."""
    async def run():
        app = make_app(store, hybrid_chat_model, max_tokens=8, ctx=1024)
        async with app.run_test(size=SIZE) as pilot:
            for i in range(3):
                await send(pilot, f"Tell me about the number {i} and why it matters to people.")
                await wait_for(pilot, replied(app, store))
            first = store.messages(app.chat.id)
            shown_first = app.query_one(StatusBar).prompt
            await pilot.press("ctrl+r")
            await wait_for(pilot, replied(app, store, after=first[-1].id))
            return first, store.messages(app.chat.id), shown_first, app.query_one(StatusBar).prompt

    first, second, shown_first, shown = asyncio.run(run())
    before, after = first[-1].stats, second[-1].stats
    assert before["context_tokens"] > 100 and before["prompt_tokens"] > 20, before  # the last turn's new tokens
    assert after["prompt_tokens"] <= 1, after  # the checkpoint at the end of the same prompt
    assert second[-1].content == first[-1].content  # greedy: the same reply, from the restored state
    assert shown_first.startswith(f"prompt {before['prompt_tokens']} tok in ")
    assert shown.startswith(f"prompt {after['prompt_tokens']} tok in "), shown


def test_edit_and_resend_the_last_message(store, smollm2):
    async def run():
        app = make_app(store, smollm2)
        async with app.run_test(size=SIZE) as pilot:
            await send(pilot, "Name a fruit.")
            await wait_for(pilot, replied(app, store))
            await pilot.press("ctrl+g")
            in_box = app.query_one(PromptInput).text
            left = store.messages(app.chat.id)
            await pilot.press(*" Just one word.", "enter")
            await wait_for(pilot, replied(app, store))
            await pilot.press("up")  # in the empty box: the last message sent comes back
            recalled = app.query_one(PromptInput).text
            return in_box, left, store.messages(app.chat.id), [v.message.content for v in views(app)], recalled

    in_box, left, after, shown, recalled = asyncio.run(run())
    assert recalled == "Name a fruit. Just one word."
    assert in_box == "Name a fruit." and left == []
    assert [(m.role, m.state) for m in after] == [("user", "done"), ("assistant", "done")]
    assert after[0].content == "Name a fruit. Just one word." and after[1].content
    assert shown == [m.content for m in after]


def test_switch_chats_and_search(store, smollm2):
    cats = store.create_chat("Cats", str(smollm2))
    store.add_message(cats.id, "user", "Do cats purr?")
    store.add_message(cats.id, "assistant", "Yes, cats **purr**.")
    dogs = store.create_chat("Dogs", str(smollm2))
    store.add_message(dogs.id, "user", "Do dogs bark?")
    store.add_message(dogs.id, "assistant", "Yes, dogs bark.")

    async def run():
        app = make_app(store, smollm2)
        async with app.run_test(size=SIZE) as pilot:
            opened = [v.message.content for v in views(app)]  # the most recent chat opens first
            await pilot.click("#chats", offset=(2, 1))  # the second row: Cats
            await pilot.pause()
            switched = (app.chat.title, [v.message.content for v in views(app)])
            await pilot.press("ctrl+f", *"bark")
            await pilot.pause()
            found = [item.chat.title for item in app.query("ChatItem")]
            return opened, switched, found

    opened, switched, found = asyncio.run(run())
    assert opened == ["Do dogs bark?", "Yes, dogs bark."]
    assert switched == ("Cats", ["Do cats purr?", "Yes, cats **purr**."])
    assert found == ["Dogs"]


KILLED_APP = """
import asyncio, sys, time
from pathlib import Path
from app.store import ChatStore, Sampling
from app.tui.app import ChatApp

async def main():
    store = ChatStore(Path(sys.argv[1]))
    app = ChatApp(store, sys.argv[2], Sampling(temperature=0.0, max_tokens=4000), "", 4096)  # streams past the kill
    async with app.run_test() as pilot:
        await pilot.press("ctrl+n")
        await pilot.press(*"Tell me a long story about a cat.", "enter")
        while not (app.reply and len(app.reply.text) > 40):
            await pilot.pause(0.05)
        await pilot.pause(0.5)  # past the 0.25 s save interval
        print("streaming", flush=True)
        await pilot.pause(600)

asyncio.run(main())
"""


def test_restart_finds_chats_as_they_were_with_a_killed_reply(tmp_path, smollm2):
    path = tmp_path / "chats.sqlite3"
    store = ChatStore(path)

    async def first_session():
        app = make_app(store, smollm2)
        async with app.run_test(size=SIZE) as pilot:
            await send(pilot, "Hi!")
            await wait_for(pilot, replied(app, store))
            return [(m.role, m.content) for m in store.messages(app.chat.id)]

    before = asyncio.run(first_session())
    store.close()

    proc = subprocess.Popen([sys.executable, "-c", KILLED_APP, str(path), str(smollm2)], cwd=ROOT,
                            stdout=subprocess.PIPE, text=True)
    try:
        ready, _, _ = select.select([proc.stdout], [], [], 300)
        assert ready and proc.stdout.readline() == "streaming\n"
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()

    store = ChatStore(path)

    async def second_session():
        app = make_app(store, smollm2)
        async with app.run_test(size=SIZE) as pilot:
            killed = [(v.message.role, v.message.state, v.message.content, str(v.query_one(".stats").render()))
                      for v in views(app)]
            await pilot.click("#chats", offset=(2, 1))
            await pilot.pause()
            earlier = [(v.message.role, v.message.content) for v in views(app)]
            return [c.title for c in store.list_chats()], killed, earlier

    titles, killed, earlier = asyncio.run(second_session())
    store.close()
    assert titles == ["Tell me a long story about a cat.", "Hi!"]
    assert earlier == before
    (_, _, asked, _), (role, state, partial, note) = killed
    assert asked == "Tell me a long story about a cat."
    assert (role, state) == ("assistant", "interrupted") and len(partial) > 40
    assert "interrupted" in note


def test_bad_model_file_is_a_message_not_a_crash(store, tmp_path):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"this is not a gguf file" * 10)

    async def run():
        app = make_app(store, bad)
        async with app.run_test(size=SIZE) as pilot:
            await wait_for(pilot, lambda: app.query_one(StatusBar).state.startswith("not loaded"))
            await send(pilot, "Hello?")
            await wait_for(pilot, lambda: app.reply is None and len(store.messages(app.chat.id)) == 2)
            return notes(app), store.messages(app.chat.id), app.is_running

    shown, (user, reply), running = asyncio.run(run())
    assert running
    assert any(n.startswith(f"Could not load {tmp_path / 'bad.gguf'}: ") and "Traceback" not in n for n in shown)
    assert reply.state == "error"


def test_prompt_longer_than_the_context_is_a_message(store, smollm2):
    async def run():
        app = make_app(store, smollm2, ctx=32)
        async with app.run_test(size=SIZE) as pilot:
            await send(pilot, "Tell me everything you know about the history of the Roman Empire, please.")
            await wait_for(pilot, lambda: len(store.messages(app.chat.id)) == 2 and app.reply is None)
            return notes(app), store.messages(app.chat.id)[-1]

    shown, reply = asyncio.run(run())
    assert reply.state == "error"
    assert any("context" in n for n in shown)


def test_context_full_ends_the_reply_with_a_warning(store, smollm2):
    async def run():
        app = make_app(store, smollm2, max_tokens=200, ctx=48)
        async with app.run_test(size=SIZE) as pilot:
            # a long greedy reply on every CPU path (on AVX-512 VNNI, "Count from one to fifty." got a 12-token one)
            await send(pilot, "Write a long story about a dragon.")
            await wait_for(pilot, lambda: len(store.messages(app.chat.id)) == 2 and app.reply is None)
            return notes(app), store.messages(app.chat.id)[-1], app.query_one(StatusBar)

    shown, reply, status = asyncio.run(run())
    assert reply.state == "done" and reply.stats["finish_reason"] == "context full"
    assert any(n.startswith("The context is full") for n in shown)
    assert status.ctx_used == 48 and status.n_ctx == 48


def test_copy_rename_delete_and_settings(store, smollm2):
    chat = store.create_chat("Code", str(smollm2))
    store.add_message(chat.id, "user", "Show code.")
    store.add_message(chat.id, "assistant", "Here:\n\n```python\nprint(1)\n```\n\nDone.")

    async def run():
        app = make_app(store, smollm2)
        async with app.run_test(size=SIZE) as pilot:
            views(app)[-1].focus()
            await pilot.press("k")
            code = app.clipboard
            await pilot.press("c")
            message = app.clipboard
            await pilot.press("f2", "ctrl+u", *"Python code", "enter")
            await pilot.pause()
            renamed = (store.get_chat(chat.id).title, app.sub_title)
            await pilot.press("ctrl+s")
            settings = app.screen.query_one("#temperature")
            settings.value = "0.3"
            app.screen.query_one("#system_prompt").load_text("Be terse.")
            await pilot.press("ctrl+s")
            await pilot.pause()
            saved = store.get_chat(chat.id)
            await pilot.press("f8", "y")
            await pilot.pause()
            return code, message, renamed, saved, store.list_chats(), [v.message.content for v in views(app)]

    code, message, renamed, saved, left, shown = asyncio.run(run())
    assert code == "print(1)\n"
    assert message == "Here:\n\n```python\nprint(1)\n```\n\nDone."
    assert renamed == ("Python code", "Python code")
    assert (saved.sampling.temperature, saved.system_prompt) == (0.3, "Be terse.")
    assert [c.title for c in left] == ["New chat"] and shown == []  # the last chat gone, a new one opened


def test_settings_out_of_range_are_refused(store, smollm2):
    """Max tokens below 1 (or a top-p of 0) is a message on the settings screen, which stays open unsaved."""
    chat = store.create_chat("Chat", str(smollm2))

    async def run():
        app = make_app(store, smollm2)
        async with app.run_test(size=SIZE) as pilot:
            await pilot.press("ctrl+s")
            out = []
            for name, value in (("max_tokens", "-5"), ("top_p", "0")):
                app.screen.query_one(f"#{name}").value = value
                await pilot.press("ctrl+s")
                await pilot.pause()
                out.append((type(app.screen).__name__, notes(app)))  # the model's load notice may come between
                app.screen.query_one(f"#{name}").value = "1"
            return out

    (screen, shown), (_, shown_after) = asyncio.run(run())
    assert screen == "SettingsScreen" and "Max tokens per reply: takes 1 or more, not -5" in shown
    assert "Top-p: takes above 0, at most 1, not 0" in shown_after
    assert store.get_chat(chat.id).sampling == Sampling()


def test_command_palette_runs_chat_actions(store, smollm2):
    chat = store.create_chat("Old", str(smollm2))
    store.add_message(chat.id, "user", "Hello")

    async def run():
        app = make_app(store, smollm2)
        async with app.run_test(size=SIZE) as pilot:
            await pilot.press("ctrl+p", *"new chat")
            await pilot.pause(0.5)  # the palette searches in the background
            await pilot.press("enter")
            await pilot.pause()
            return app.chat, [c.title for c in store.list_chats()]

    opened, titles = asyncio.run(run())
    assert opened.title == "New chat" and opened.id != chat.id
    assert titles == ["New chat", "Old"]


def test_model_picker_sets_the_chat_model_and_a_bad_path_is_a_message(store, smollm2, tmp_path):
    async def run():
        app = make_app(store, smollm2)
        async with app.run_test(size=SIZE) as pilot:
            await wait_for(pilot, lambda: app.engine is not None)
            await pilot.press("ctrl+o")
            listed = [str(o.id) for o in app.screen.query_one("OptionList").options]
            await pilot.press("tab", *str(tmp_path / "missing.gguf"), "enter")
            await wait_for(pilot, lambda: any(n.startswith("Could not load") for n in notes(app)))
            return listed, store.get_chat(app.chat.id).model, notes(app), app.query_one(StatusBar).state

    listed, model, shown, state = asyncio.run(run())
    assert listed[0] == str(smollm2)
    assert model == str(tmp_path / "missing.gguf")
    assert any(str(tmp_path / "missing.gguf") in n and "Traceback" not in n for n in shown)
    assert state.startswith("not loaded")


def test_switching_chats_mid_reply_stops_it_in_its_own_chat(store, smollm2):
    other = store.create_chat("Other", str(smollm2))
    store.add_message(other.id, "user", "Earlier question")

    async def run():
        # room for a reply longer than the click takes: 400 tokens ended (done) before it on a fast 2-core VM
        app = make_app(store, smollm2, max_tokens=4000, ctx=4096)
        async with app.run_test(size=SIZE) as pilot:
            await pilot.press("ctrl+n")
            await send(pilot, "Write a long story about a dragon.")
            story = app.chat
            await wait_for(pilot, lambda: app.reply_view is not None and len(app.reply_view.message.content) > 10)
            await pilot.click("#chats", offset=(2, 1))  # Other
            await wait_for(pilot, lambda: app.reply is None, timeout=10)
            return app.chat.title, [v.message.content for v in views(app)], store.messages(story.id)

    title, shown, (asked, reply) = asyncio.run(run())
    assert (title, shown) == ("Other", ["Earlier question"])
    assert asked.content == "Write a long story about a dragon."
    assert reply.state == "stopped" and len(reply.content) > 10


def test_thinking_streams_into_its_fold_and_stays_out_of_the_next_turn(tmp_path):
    """A reply that thinks first: the reasoning goes into a folded part above the answer as it streams (t
    unfolds it), the store keeps the whole reply, and the next turn's history has the answer alone."""
    from textual.app import App
    from textual.widgets import Collapsible, Markdown, Static

    from app.store import Chat, Message
    from app.tui.engine_work import chat_history

    reply = Message(id=2, chat_id=1, role="assistant", content="", state="streaming", stats=None)

    class One(App):
        def compose(self):
            yield MessageView(reply, "Qwen3")

    async def run():
        app = One()
        async with app.run_test() as pilot:
            view = app.query_one(MessageView)
            fold = view.query_one(Collapsible)
            assert not fold.display or "-empty" in fold.classes  # nothing to fold yet
            for piece in ["<thi", "nk>\nSeventeen has no divisors", " but 1 and itself.</th", "ink>\n\n", "Yes, 17 ",
                          "is prime."]:
                await view.append(piece)
                await pilot.pause()
            await view.finish(Message(**{**reply.__dict__, "content": view.message.content, "state": "done"}))
            await pilot.pause()
            assert view.reasoning == "Seventeen has no divisors but 1 and itself."
            assert view.query_one(Markdown).source == "Yes, 17 is prime."
            assert fold.collapsed and "-empty" not in fold.classes and fold.title.startswith("Thinking · 8 words")
            view.focus()
            await pilot.press("t")
            assert not fold.collapsed
            assert "Seventeen" in str(view.query_one(".reasoning", Static).render())
            return view.message.content

    stored = asyncio.run(run())
    assert stored.startswith("<think>") and stored.endswith("is prime.")
    chat = Chat(id=1, title="t", model="m", system_prompt="", sampling=Sampling())
    history = chat_history(chat, [Message(1, 1, "user", "Is 17 prime?", "done", None),
                                  Message(2, 1, "assistant", stored, "done", None)])
    assert history == [{"role": "user", "content": "Is 17 prime?"}, {"role": "assistant", "content": "Yes, 17 is prime."}]


def test_a_harmony_reply_folds_its_analysis_and_shows_its_final_channel(tmp_path):
    """gpt-oss: a reply whose template speaks harmony streams its analysis channel into the fold and its final
    channel as the answer, markup cut anywhere; the stored reply is split the same way when shown again, and the
    next turn's history has the final channel alone."""
    from textual.app import App
    from textual.widgets import Collapsible, Markdown

    from app.store import Chat, Message
    from app.tui.engine_work import chat_history

    reply = Message(id=2, chat_id=1, role="assistant", content="", state="streaming", stats=None)

    class One(App):
        def compose(self):
            yield MessageView(reply, "gpt-oss")

    async def run():
        app = One()
        async with app.run_test() as pilot:
            view = app.query_one(MessageView)
            view.reply_format = "harmony"
            for piece in ["<|chan", "nel|>analysis<|message|>Seventeen has no divisors", " but 1 and itself.<|e",
                          "nd|><|start|>assistant<|channel|>final<|mess", "age|>Yes, 17 ", "is prime."]:
                await view.append(piece)
                await pilot.pause()
            await view.finish(Message(**{**reply.__dict__, "content": view.message.content, "state": "done"}))
            await pilot.pause()
            assert view.reasoning == "Seventeen has no divisors but 1 and itself."
            assert view.query_one(Markdown).source == "Yes, 17 is prime."
            assert view.query_one(Collapsible).title.startswith("Thinking · 8 words")
            return view.message.content

    stored = asyncio.run(run())
    assert stored.startswith("<|channel|>analysis<|message|>")
    shown_again = MessageView(Message(2, 1, "assistant", stored, "done", None), "gpt-oss")
    assert (shown_again.reasoning, shown_again.answer) == ("Seventeen has no divisors but 1 and itself.",
                                                           "Yes, 17 is prime.")
    chat = Chat(id=1, title="t", model="m", system_prompt="", sampling=Sampling())
    history = chat_history(chat, [Message(1, 1, "user", "Is 17 prime?", "done", None),
                                  Message(2, 1, "assistant", stored, "done", None)])
    assert history[-1] == {"role": "assistant", "content": "Yes, 17 is prime."}


def test_a_reasoning_effort_the_models_template_cannot_take_is_said_and_the_chat_goes_on(store, smollm2):
    async def run():
        app = ChatApp(store, str(smollm2), Sampling(temperature=0.0, max_tokens=8), SYSTEM, 512,
                      reasoning_effort="high")
        async with app.run_test(size=SIZE) as pilot:
            await wait_for(pilot, lambda: app.engine is not None)
            await send(pilot, "Hi")
            await wait_for(pilot, replied(app, store))
            return notes(app), store.messages(app.chat.id)[-1]

    shown, reply = asyncio.run(run())
    assert any(n.startswith("reasoning effort 'high' is not supported by this model") and
               n.endswith("its replies go without it") for n in shown), shown
    assert reply.state == "done" and reply.content


def test_a_gpt_oss_chat_folds_the_analysis_and_gives_its_template_the_reasoning_effort(store, tmp_path, monkeypatch):
    """The chat on a scripted engine that replies in harmony (tests/app/scripted_engine.py): the reply's split is
    chosen by the loaded model's template, and --reasoning-effort reaches its system message."""
    import inference
    from tests.app.scripted_engine import ANSWER, REASONING, ScriptedEngine
    engine = ScriptedEngine(tmp_path / "gpt-oss-20b-mxfp4.gguf")
    monkeypatch.setattr(inference, "load", lambda *a, **k: engine)
    streamed, show = [], MessageView._show

    async def record(view, reasoning, answer):  # what the reply showed as it streamed, before its end re-split it
        streamed.append(answer)
        await show(view, reasoning, answer)
    monkeypatch.setattr(MessageView, "_show", record)

    async def run():
        app = ChatApp(store, "gpt-oss", Sampling(temperature=0.0, max_tokens=64), "", 512, reasoning_effort="low")
        async with app.run_test(size=SIZE) as pilot:
            await wait_for(pilot, lambda: app.engine is not None)
            await send(pilot, "What is 2+2?")
            await wait_for(pilot, replied(app, store))
            view = views(app)[-1]
            return view.reasoning, view.query_one("Markdown").source, notes(app)

    reasoning, answer, shown = asyncio.run(run())
    assert (reasoning, answer) == (REASONING, ANSWER) and "".join(streamed) == ANSWER
    assert engine.reasoning_line() == "Reasoning: low" and not any("reasoning effort" in n for n in shown)
