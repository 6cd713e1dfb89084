"""How the server turns a request into prompt ids: whether the template leaves the reply inside <think> (the
packaged models do not think, so the test engine here is a real template and tokenizer of a stand-in)."""
from types import SimpleNamespace

import pytest

from app.server_schema import GenRequest, ollama_chat
from app.server_worker import PromptError, prompt_ids
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
    ids, thinks = prompt_ids(engine(R1), GenRequest(model=None, prompt=HI))
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
