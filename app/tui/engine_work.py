"""The two jobs that run off the UI thread, loading a model and writing a reply, as plain functions.

They report through `post` (the app's post_message) with the messages of app/tui/events.py, a reply's text
through a PieceBuffer that the UI drains once a frame, and never raise: an error the user can cause becomes a
readable line in the UI, and the app stays up.
"""
import gc
import threading
import time
from dataclasses import asdict

from app.store import Chat, Message, Sampling
from app.reply_split import split_reply
from app.warm_up import warm_up
from app.tui.events import EngineNotice, ModelFailed, ModelLoaded, ModelProgress, ReplyFailed, ReplyFinished
from app.tui.piece_buffer import PieceBuffer
from models.errors import UserError


def error_text(e: Exception) -> str:
    if isinstance(e, UserError):
        return str(e)
    if isinstance(e, MemoryError):
        return "out of memory: try a smaller model, a smaller context or fewer GPU layers"
    return f"{type(e).__name__}: {e}"


def load_model(model: str, ctx: int | None, post, options: dict | None = None, warm: bool = True) -> None:
    """options: more arguments of inference.load (device, gpu_layers, vram_budget); warm: warm the model up."""
    from inference import load  # heavy: numba, and CuPy when there is a GPU

    gc.unfreeze()  # the model loaded before (frozen below), dropped by the app, can be collected again

    def progress(file: str, done: int, total: int) -> None:
        post(ModelProgress(model, file, done, total))

    start = time.monotonic()
    try:
        engine = load(model, ctx=ctx, progress=progress, notify=lambda text: post(EngineNotice(text)),
                      **(options or {}))
        if warm:
            warm_up(engine, lambda text: post(EngineNotice(text)))  # the first reply at full speed
    except Exception as e:  # noqa: BLE001 - any failure is shown, never a crash
        post(ModelFailed(model, error_text(e)))
        return
    # What is alive now (the model, numba's kernels, the UI) stays: out of the cyclic GC's full collections, which
    # otherwise scanned it all every other reply (~90 ms on the UI thread, BENCHMARKS.md session 10). Garbage
    # collected first: frozen, a replaced model's cycles would outlive it
    gc.collect()
    gc.freeze()
    post(ModelLoaded(model, engine, time.monotonic() - start))


def chat_history(chat: Chat, messages: list[Message]) -> list[dict]:
    """What the model sees: the system prompt, then every message that has text; of a reasoning model's replies
    the answer alone, as the templates of Qwen3, the R1 distills and gpt-oss expect (the reasoning stays in the
    store)."""
    history = [{"role": "system", "content": chat.system_prompt}] if chat.system_prompt else []
    for m in messages:
        content = split_reply(m.content)[1] if m.role == "assistant" else m.content
        if content:
            history.append({"role": m.role, "content": content})
    return history


def generate_reply(engine, history: list[dict], sampling: Sampling, stop: threading.Event, pieces: PieceBuffer,
                   post, drop_old_turns: bool = False, template_vars: dict | None = None) -> None:
    """Put the reply's text into `pieces` as it comes, then post how it ended; when `stop` is set, close the
    generator at the next piece. template_vars: what the chat template is given (enable_thinking, reasoning_effort)."""
    stats = None
    try:
        template = engine.chat_template
        reply = engine.generate(history, drop_old_turns=drop_old_turns, template_vars=template_vars,
                                shown=template.reply_markup if template else (), **asdict(sampling))
        try:
            for piece in reply:
                if stop.is_set():
                    break
                if isinstance(piece, str):
                    pieces.put(piece)
                else:
                    stats = piece
        finally:
            reply.close()
    except Exception as e:  # noqa: BLE001 - context full, out of memory...: shown, never a crash
        post(ReplyFailed(error_text(e)))
        return
    if stats is None:
        post(ReplyFinished(None, stopped=True))
    else:
        post(ReplyFinished(stats.to_dict(), stopped=False))
