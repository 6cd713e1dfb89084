"""Engine.generate and Engine.logits on SmolLM2: greedy text like llama.cpp, cache reuse, limits, seeds."""
import numpy as np
import pytest

from inference import GenerationStats, PromptTooLongError, load
from inference.engine import StopScanner
from inference.speculative import common_prefix
from models.errors import UserError
from tests.inference.parity import oracle

PROMPT = "The capital of France is"


def run(engine, prompt, **kw):
    pieces = list(engine.generate(prompt, **kw))
    assert all(isinstance(p, str) for p in pieces[:-1]) and isinstance(pieces[-1], GenerationStats)
    return "".join(pieces[:-1]), pieces[-1]


def test_greedy_tokens_are_llama_cpp_top1(smollm2_engine, smollm2):
    """Each greedy token is llama.cpp's top-1 given the same text, but where llama.cpp itself has a near-tie."""
    prompt = "Monday, Tuesday, Wednesday, Thursday,"
    text, stats = run(smollm2_engine, prompt, max_tokens=16, temperature=0)
    assert stats.generated_tokens == 16 and stats.finish_reason == "length"
    n_prompt = len(smollm2_engine.tokenizer.encode(prompt))
    assert stats.prompt_tokens == n_prompt
    ids = smollm2_engine.tokenizer.encode(prompt + text)
    assert ids[:n_prompt] == smollm2_engine.tokenizer.encode(prompt) and len(ids) == n_prompt + 16
    llm = oracle(smollm2, logits_all=True, n_ctx=64, n_threads=2)
    llm.eval(ids)
    theirs = np.array(llm.scores[n_prompt - 1:len(ids) - 1])  # [16, n_vocab]: what predicts each new token
    llm.close()
    for row, token in zip(theirs, ids[n_prompt:]):
        assert row.max() - row[token] < 0.5
    assert stats.prompt_tok_s > 0 and stats.generation_tok_s > 0


def test_second_turn_reuses_the_cache_and_gives_a_fresh_runs_logits(smollm2_engine):
    """Only the new turn is processed, and its logits are a fresh run's to the rounding of the matmul paths (a
    turn of up to 4 new tokens takes the one-token path's 8-bit activations, a whole prompt the float one, so
    greedy texts may part at a near tie); stale or misplaced cache rows would not come this close."""
    engine = smollm2_engine
    first, _ = run(engine, PROMPT, max_tokens=4, temperature=0)
    longer = PROMPT + first + " It is also"
    ids = engine.tokenizer.encode(longer)
    _, reused = run(engine, longer, max_tokens=8, temperature=0)
    engine._cached = []
    _, fresh = run(engine, longer, max_tokens=8, temperature=0)
    assert fresh.prompt_tokens == len(ids) and reused.prompt_tokens < len(ids) - 4

    run(engine, PROMPT, max_tokens=4, temperature=0)
    n_new = len(ids) - common_prefix(ids, engine._cached)
    ours = engine._prefill(ids, all_logits=True)  # the new tokens only, on the first turn's cache
    ref = engine.logits(ids)[-n_new:]  # a fresh context
    assert len(ours) == n_new <= 4
    corr = [np.corrcoef(a, b)[0, 1] for a, b in zip(ours.astype(np.float64), ref.astype(np.float64))]
    top2 = np.sort(ref, axis=1)[:, -2:]
    clear = top2[:, 1] - top2[:, 0] > 0.5  # the same best token wherever the fresh run's leads clearly
    assert min(corr) > 0.999 and (ours.argmax(1) == ref.argmax(1))[clear].all(), corr


def test_seed_makes_sampling_repeatable(smollm2_engine):
    a, _ = run(smollm2_engine, PROMPT, max_tokens=12, temperature=1.0, seed=123)
    b, _ = run(smollm2_engine, PROMPT, max_tokens=12, temperature=1.0, seed=123)
    assert a == b


def test_chunked_prompt_gives_the_same_logits(smollm2_engine, monkeypatch):
    """Chunks of 16 against the whole prompt at once: the same logits to the int8 activations' noise (a prompt's
    x goes to 8 bits, as llama.cpp's; attention's BLAS rounds other shapes a little differently, which flips some
    roundings and spreads: min correlation ~0.9988 here, where a chunk at a wrong position gives far less)."""
    ids = smollm2_engine.tokenizer.encode("one two three four five six seven eight nine ten " * 4)[:40]
    whole = smollm2_engine.logits(ids)
    monkeypatch.setattr(smollm2_engine._be, "prefill_chunk", 16)
    chunked = smollm2_engine.logits(ids)
    corr = [np.corrcoef(a, b)[0, 1] for a, b in zip(chunked.astype(np.float64), whole.astype(np.float64))]
    top2 = np.sort(whole, axis=1)[:, -2:]
    clear = top2[:, 1] - top2[:, 0] > 0.5
    assert min(corr) > 0.995 and (chunked.argmax(1) == whole.argmax(1))[clear].all(), corr


def test_full_context_ends_with_context_full(smollm2):
    engine = load(smollm2, device="cpu", ctx=12)
    n_prompt = len(engine.tokenizer.encode(PROMPT))
    text, stats = run(engine, PROMPT, max_tokens=100, temperature=0)
    assert stats.finish_reason == "context full"
    assert stats.generated_tokens == 12 - n_prompt + 1  # the last token needs no room in the cache
    assert stats.context_tokens == 12  # so it is not in the context either
    with pytest.raises(PromptTooLongError, match="the context holds 12") as e:
        run(engine, PROMPT * 5, max_tokens=4)
    assert isinstance(e.value, UserError)
    with pytest.raises(UserError, match="empty"):
        run(engine, "", max_tokens=4)  # SmolLM2 adds no BOS: no token at all


def test_an_end_of_generation_token_is_not_counted_in_the_reply(smollm2_engine):
    """A reply that ends at the end-of-generation token counts its own tokens, which with the prompt are what the
    cache holds after it (every reply token was run through the model, the end token not)."""
    engine = smollm2_engine
    engine._cached = []  # the whole prompt counted in prompt_tokens
    text, stats = run(engine, [{"role": "user", "content": "Say hello."}], max_tokens=64, temperature=0)
    assert stats.finish_reason == "stop" and text
    assert stats.context_tokens == len(engine._cached) == stats.prompt_tokens + stats.generated_tokens


def test_unknown_device_and_missing_file_are_user_errors(smollm2, tmp_path):
    with pytest.raises(UserError, match="device 'tpu'"):
        load(smollm2, device="tpu")
    with pytest.raises(UserError, match="no such file"):
        load(tmp_path / "missing.gguf")


def test_the_same_prompt_again_gives_the_same_greedy_reply(smollm2_engine):
    """Regenerate: the prompt is not re-run at all (its last token alone would go through the one-token matmuls,
    whose 8-bit activations give other logits than the prompt's float path), and the first reply's cache rows
    are overwritten."""
    chat = [{"role": "user", "content": "Say hello."}]  # a near tie there once parted the two paths
    first, _ = run(smollm2_engine, chat, max_tokens=48, temperature=0, stop=())
    again, _ = run(smollm2_engine, chat, max_tokens=48, temperature=0, stop=())
    smollm2_engine._cached = []
    fresh, _ = run(smollm2_engine, chat, max_tokens=48, temperature=0, stop=())
    assert again == first == fresh


def test_stop_string_ends_the_reply_before_it(smollm2_engine):
    full, _ = run(smollm2_engine, "Monday, Tuesday,", max_tokens=12, temperature=0)
    stop = full[len(full) // 2:][:4]  # from the middle of the greedy reply, whatever it says
    assert len(stop) == 4 and full.find(stop) > 0
    text, stats = run(smollm2_engine, "Monday, Tuesday,", max_tokens=12, temperature=0, stop=(stop,))
    assert text == full[:full.find(stop)] and stats.finish_reason == "stop" and stats.stop_string == stop


def test_stop_scanner_holds_back_a_possible_stop_string():
    s = StopScanner(["lo W"])
    assert s.feed("Hel") == ("He", None)  # "l" may begin "lo W"
    assert s.feed("lo") == ("l", None)  # "lo" may begin "lo W"
    assert s.feed(" Wo") == ("", "lo W")  # which one: Anthropic's stop_sequence
    s = StopScanner(["###"])
    assert s.feed("a#") == ("a", None)
    assert s.feed("b") == ("#b", None)
    assert s.feed("#", final=True) == ("#", None)


def test_old_turns_are_dropped_when_asked(smollm2):
    engine = load(smollm2, device="cpu", ctx=160)
    chat = [{"role": "system", "content": "Answer in one word."}]
    for i in range(8):
        chat += [{"role": "user", "content": f"Question number {i}: what is the colour of the sky?"},
                 {"role": "assistant", "content": "Blue, as it is on most clear days."}]
    chat.append({"role": "user", "content": "And the grass?"})
    assert len(engine.prompt_ids(chat)) > 160
    with pytest.raises(PromptTooLongError):
        run(engine, chat, max_tokens=8)
    text, stats = run(engine, chat, max_tokens=8, temperature=0, drop_old_turns=True)
    assert text and stats.prompt_tokens + 8 <= 160
    kept = engine._fit_messages(chat, None, room=8)
    rendered = engine.tokenizer.decode(kept, special=True)
    assert "Answer in one word." in rendered and "And the grass?" in rendered and "number 0:" not in rendered
    assert rendered.split("<|im_start|>")[2].startswith("user")  # the first turn after the system prompt


def test_a_long_prompt_stops_between_chunks_when_cancelled(smollm2_engine):
    """cancelled() is asked before each prompt chunk (256 tokens on the CPU): True after the first ends the call
    with finish_reason "cancelled" and no text; the chunk done stays cached, and the same prompt again goes on
    from it to what a fresh run gives."""
    engine = smollm2_engine
    ids = engine.tokenizer.encode(" ".join(["The history of the city begins with a small fishing village."] * 35))[:400]
    assert len(ids) > engine._segments[0][0].prefill_chunk  # two chunks, in a context of 512
    engine._cached = []
    asked = []

    def after_one_chunk() -> bool:
        asked.append(1)
        return len(asked) > 1

    pieces = list(engine.generate(ids, max_tokens=4, temperature=0, cancelled=after_one_chunk))
    assert len(pieces) == 1 and pieces[0].finish_reason == "cancelled" and pieces[0].generated_tokens == 0
    assert pieces[0].prompt_tokens == len(engine._cached) == engine._segments[0][0].prefill_chunk
    text, stats = run(engine, ids, max_tokens=4, temperature=0)
    assert stats.prompt_tokens == len(ids) - engine._segments[0][0].prefill_chunk  # went on from the cached chunk
    engine._cached = []
    assert run(engine, ids, max_tokens=4, temperature=0)[0] == text


def test_the_engine_warm_up_leaves_no_trace(smollm2_engine):
    """After it, the cache is empty and a reply is what it is without it."""
    engine = smollm2_engine
    engine._cached = []
    before = run(engine, "The capital of France is", max_tokens=8, temperature=0)[0]
    engine.warm_up()
    assert engine._cached == [] and engine._prompt_logits is None
    assert run(engine, "The capital of France is", max_tokens=8, temperature=0)[0] == before


def test_the_warm_up_takes_the_long_context_paths_and_fits_a_small_context(smollm2, monkeypatch):
    """Its decode steps reach the parallel attention loop (which a first reply would otherwise compile: issue 21's
    first reply at 57% of the next), and a context smaller than its prompt shortens the prompt, not fails."""
    from kernels.cpu import attention as cpu_attention
    calls = []
    parallel = cpu_attention._attention_loop_parallel
    monkeypatch.setattr(cpu_attention, "_attention_loop_parallel", lambda *a: calls.append(1) or parallel(*a))
    load(smollm2, device="cpu", ctx=512).warm_up()
    assert calls
    small = load(smollm2, device="cpu", ctx=8)
    small.warm_up()
    assert small._cached == []


def test_template_variables_reach_the_template_in_every_path(smollm2):
    """generate's template_vars (a reasoning effort) are rendered into the prompt, also where old turns are dropped;
    SmolLM2 given a template that reads reasoning_effort as gpt-oss's does."""
    from models.chat_template import ChatTemplate
    engine = load(smollm2, device="cpu", ctx=160)
    engine.chat_template = ChatTemplate("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n"
                                        "{% endfor %}<|im_start|>system\nReasoning: {{ reasoning_effort | default('') }}"
                                        "<|im_end|>\n<|im_start|>assistant\n")
    chat = [{"role": "user", "content": "Hi"}]
    high = {"reasoning_effort": "high"}
    assert "Reasoning: high" in engine.prompt_text(chat, None, high)
    ids = engine.prompt_ids(chat, None, high)
    assert ids != engine.prompt_ids(chat)
    for drop in (False, True):
        run(engine, chat, max_tokens=2, temperature=0, template_vars=high, drop_old_turns=drop)
        assert engine._cached[:len(ids)] == ids  # what ran
        engine.reset()
