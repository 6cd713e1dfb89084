"""How the server turns a request into prompt ids: whether the template leaves the reply inside <think> (the
packaged models do not think, so the test engine here is a real template and tokenizer of a stand-in); and on which
thread its engine loads."""
import threading
from pathlib import Path
from types import SimpleNamespace

import pytest

from app.server_schema import GenRequest, ollama_chat
from app.server_worker import EngineWorker, PromptError, prompt_ids
from models.errors import UserError
from models.chat_template import ChatTemplate

# DeepSeek-R1 distills end the generation prompt with <think>; Qwen3 writes an empty think block when told not to
R1 = "{% for m in messages %}<|{{ m.role }}|>{{ m.content }}{% endfor %}{{ '<|assistant|><think>\\n' }}"
QWEN3 = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}<|im_start|>assistant\n"
         "{% if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n{% endif %}")
HI = [{"role": "user", "content": "hi"}]


def engine(source: str | None, n_ctx: int = 100):
    tokenizer = SimpleNamespace(encode_prompt=lambda text: [ord(c) for c in text])  # a token a character
    return SimpleNamespace(chat_template=ChatTemplate(source) if source else None, tokenizer=tokenizer, n_ctx=n_ctx,
                           prompt_ids=lambda text: [ord(c) for c in text])


def test_a_prompt_ending_in_think_starts_the_reply_in_its_reasoning():
    ids, thinks, _ = prompt_ids(engine(R1), GenRequest(model=None, prompt=HI))
    assert thinks and "".join(map(chr, ids)).endswith("<think>\n")
    assert not prompt_ids(engine(QWEN3), GenRequest(model=None, prompt=HI))[1]  # Qwen3 opens <think> itself


def test_ollamas_think_false_reaches_the_template():
    on = ollama_chat({"model": "m", "messages": HI, "think": True})
    off = ollama_chat({"model": "m", "messages": HI, "think": False})
    assert "".join(map(chr, prompt_ids(engine(QWEN3), off)[0])).endswith("</think>\n\n")
    assert "".join(map(chr, prompt_ids(engine(QWEN3), on)[0])).endswith("assistant\n")


def test_prompt_errors():
    with pytest.raises(PromptError, match="no chat template: send plain text to /v1/completions"):
        prompt_ids(engine(None), GenRequest(model=None, prompt=HI))
    with pytest.raises(PromptError, match="the prompt is 129 tokens but the context holds 100") as e:
        prompt_ids(engine(R1), GenRequest(model=None, prompt=[{"role": "user", "content": "x" * 100}]))
    assert e.value.code == "context_length_exceeded"
    with pytest.raises(PromptError, match="the prompt is empty"):
        prompt_ids(engine(R1), GenRequest(model=None, prompt=""))


def test_the_engine_loads_and_warms_up_on_the_thread_that_runs_it():
    """numba's parallel regions run on a pool of the calling thread's: a load or warm-up on the main thread left a
    second pool, and serve generated at ~40% of run's speed on 2 cores (BENCHMARKS.md, session 10)."""
    calls = []

    def load(model, ctx, progress, **options):
        calls.append(("load", threading.get_ident()))
        return SimpleNamespace(path=Path(model))
    worker = EngineWorker("model.gguf", load, {}, None, 4)
    worker.start(None, lambda engine: calls.append(("warm_up", threading.get_ident())))
    assert calls == [("load", worker.thread.ident), ("warm_up", worker.thread.ident)]
    assert worker.home == Path("model.gguf")
    assert worker.thread.ident != threading.get_ident() and worker.thread.is_alive()  # it goes on to take the jobs


def test_a_failed_load_is_raised_by_start():
    def load(model, ctx, progress, **options):
        raise UserError("no such file: missing.gguf")
    with pytest.raises(UserError, match="no such file"):
        EngineWorker("missing.gguf", load, {}, None, 4).start(None, lambda engine: None)


def test_a_reasoning_effort_reaches_a_template_that_reads_it_and_is_refused_by_one_that_does_not():
    from pathlib import Path
    oss = (Path(__file__).parents[1] / "models" / "templates" / "openai-gpt-oss-120b.jinja").read_text()
    high = ollama_chat({"model": "m", "messages": HI, "think": "high"})
    assert high.template_vars == {"enable_thinking": True, "reasoning_effort": "high"}
    assert "Reasoning: high\n" in "".join(map(chr, prompt_ids(engine(oss, n_ctx=1000), high)[0]))
    with pytest.raises(UserError, match="reasoning effort 'high' is not supported by this model"):
        prompt_ids(engine(QWEN3), high)
