"""`gguf-chat run` as a person or a script uses it: a subprocess with real stdin, stdout, stderr and signals."""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.usefixtures("cli_kernels_cached")  # replies compared across processes

ROOT = Path(__file__).resolve().parents[2]


def gguf_chat(*args, stdin: str | None = None, timeout: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "app.cli", *map(str, args)], input=stdin, capture_output=True,
                          text=True, cwd=ROOT, timeout=timeout)


def assert_one_line_error(r: subprocess.CompletedProcess, *words: str) -> None:
    assert r.returncode == 1 and r.stdout == ""
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("gguf-chat: error: "), r.stderr
    for w in words:
        assert w in lines[0]


def test_piped_chat_prompt_gives_json(smollm2):
    r = gguf_chat("run", smollm2, "--json", "-n", "6", "--seed", "1", stdin="What is the capital of France?")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["text"].strip()
    s = out["stats"]
    assert 1 <= s["generated_tokens"] <= 6 and s["finish_reason"] in ("stop", "length")
    assert s["prompt_tokens"] > 7  # the ChatML template wrapped the question
    assert s["prompt_tok_s"] > 0 and s["generation_tok_s"] > 0


def test_streamed_text_equals_the_json_text_and_verbose_goes_to_stderr(smollm2):
    """The same greedy reply streamed and as JSON, the one with the warm-up and the other without (--no-warmup:
    llama.cpp's flag; the warm-up changes the speed of a first reply, never its text)."""
    args = ("run", smollm2, "--raw", "-n", "8", "--temperature", "0")
    streamed = gguf_chat(*args, "-p", "-", "--verbose", "--no-warmup", stdin="Monday, Tuesday,")
    as_json = gguf_chat(*args, "--json", "-p", "Monday, Tuesday,")
    assert streamed.returncode == 0 and as_json.returncode == 0, streamed.stderr + as_json.stderr
    assert streamed.stdout == json.loads(as_json.stdout)["text"] + "\n"
    assert "load:" in streamed.stderr and "no warm-up" in streamed.stderr and "tok/s" in streamed.stderr
    assert "placement: " in streamed.stderr and "/30 layers on GPU" in streamed.stderr  # where the layers run


def test_speculative_greedy_reply_is_the_same_and_verbose_counts_drafts(smollm2):
    """--spec ngram: the greedy text is the one without it (the engine's tests compare tokens), and --verbose
    says how many drafts were checked and kept."""
    args = ("run", smollm2, "--raw", "-n", "24", "--temperature", "0", "-p", "Monday, Tuesday, Wednesday,")
    plain, spec = gguf_chat(*args), gguf_chat(*args, "--spec", "ngram", "--verbose")
    assert plain.returncode == 0 and spec.returncode == 0, plain.stderr + spec.stderr
    assert spec.stdout == plain.stdout
    assert "speculative (ngram): " in spec.stderr and " accepted (" in spec.stderr, spec.stderr


def test_user_errors_are_one_line(smollm2, gemma3, tmp_path):
    assert_one_line_error(gguf_chat("run", tmp_path / "missing.gguf", "-p", "hi"), "no such file")
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"not a model at all" * 10)
    assert_one_line_error(gguf_chat("run", bad, "-p", "hi"))
    assert_one_line_error(gguf_chat("run", smollm2, "--ctx", "8", "-p", "word " * 50), "context holds 8")
    assert_one_line_error(gguf_chat("run", gemma3, "-p", "hi"), "no chat template", "--raw")
    assert_one_line_error(gguf_chat("run", smollm2, "--gpu-layers", "most", "-p", "hi"), "--gpu-layers", "'most'")
    assert_one_line_error(gguf_chat("run", smollm2, "--vram-budget", "lots", "-p", "hi"), "--vram-budget", "'lots'")
    assert_one_line_error(gguf_chat("run", smollm2, "--gpu-share", "2", "-p", "hi"), "--gpu-share", "'2'")
    assert_one_line_error(gguf_chat("run", smollm2, "--spec", "draft", "-p", "hi"), "--draft MODEL")
    assert_one_line_error(gguf_chat("run", smollm2, "--spec", "mtp", "-p", "hi"), "no MTP block")
    assert_one_line_error(gguf_chat("run", smollm2, "--draft", gemma3, "-p", "hi"), "vocabulary")


def test_ctrl_c_stops_cleanly_with_the_partial_text(smollm2):
    """Ctrl-C during a sampled reply: exit 130, the partial text kept, no traceback. A reply that ends on its own
    before the signal tests nothing, and which seed runs long moves whenever the kernels' rounding does (seed 10's
    ran 1122 tokens until silu's exp changed, then 42 words; seed 3's, 2's before it), so seeds are tried in turn
    until the signal finds one generating. --verbose tells them apart: a reply that ended prints its stats (and a
    signal that came while its process was finishing killed it, -2, in a CI run)."""
    for seed in range(10, 20):
        # SIGINT as a terminal leaves it: a shell's background job (`.ci/run &`) ignores it, and Python then installs
        # no KeyboardInterrupt handler, so the reply ran to its end (exit 0) in two such CI runs
        p = subprocess.Popen([sys.executable, "-m", "app.cli", "run", smollm2, "--raw", "-p", "Once upon a time",
                              "-n", "2000", "--ctx", "2048", "--seed", str(seed), "--temperature", "1", "--min-p", "0",
                              "--verbose"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=ROOT, text=True,
                             preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
        first = p.stdout.read(1)  # blocks until the reply starts streaming
        time.sleep(1.0)
        if p.poll() is None:
            p.send_signal(signal.SIGINT)
        rest, err = p.communicate(timeout=60)
        if "generation:" not in err:  # interrupted: no stats
            break
    else:
        pytest.fail("every seed's reply ended before the signal: nothing was interrupted")
    assert first and (first + rest).strip()
    assert p.returncode == 130, err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err


def test_second_start_compiles_nothing(smollm2):
    """Numba's on-disk caches make a second start cheap (1-2 s to the first token on an idle 2-core machine):
    every kernel it runs is loaded from the cache, none compiled. Checked by numba's own cache log rather than
    a clock, which a loaded CI machine makes flaky; the time bound only catches a start that compiles again."""
    args = [sys.executable, "-m", "app.cli", "run", smollm2, "-p", "Hello!", "-n", "2"]
    subprocess.run(args, capture_output=True, cwd=ROOT, timeout=240, check=True)  # fills the caches if needed
    t = time.perf_counter()
    second = subprocess.run(args, capture_output=True, text=True, cwd=ROOT, timeout=240,
                            env=os.environ | {"NUMBA_DEBUG_CACHE": "1"})
    elapsed = time.perf_counter() - t
    assert second.returncode == 0, second.stderr
    log = second.stdout + second.stderr
    assert "[cache] data loaded from" in log and "[cache] data saved to" not in log
    assert elapsed < 15.0


def test_thinking_goes_apart_from_the_answer(smollm2):
    """A prompt that opens <think> (as the DeepSeek-R1 distills' templates do): what follows is reasoning until
    </think>, which SmolLM2 never writes. It goes to --json's "thinking" and to stderr, not to stdout or "text";
    --hide-thinking drops it."""
    args = ("run", smollm2, "--raw", "-p", "Is 17 a prime number? <think>", "-n", "8", "--temperature", "0")
    as_json = json.loads(gguf_chat(*args, "--json").stdout)
    assert as_json["thinking"].strip() and as_json["text"] == ""
    streamed = gguf_chat(*args)
    assert streamed.returncode == 0 and streamed.stdout == "\n"
    assert as_json["thinking"].strip() in streamed.stderr
    hidden = gguf_chat(*args, "--hide-thinking")
    assert hidden.stdout == "\n" and as_json["thinking"].strip() not in hidden.stderr
    plain = json.loads(gguf_chat("run", smollm2, "--raw", "-p", "Monday, Tuesday,", "-n", "8", "--temperature", "0",
                                 "--json").stdout)
    assert plain["text"].strip() and plain["thinking"] == ""


def test_max_tokens_below_one_is_an_error_but_minus_one(smollm2):
    for n in ("-5", "0"):
        assert_one_line_error(gguf_chat("run", smollm2, "-p", "hi", "-n", n), "-n/--max-tokens", n)
    assert_one_line_error(gguf_chat("chat", smollm2, "--max-tokens", "-5"), "--max-tokens", "-5")  # before the UI
    r = gguf_chat("run", smollm2, "--raw", "-p", "1, 2, 3,", "-n", "-1", "--ctx", "24", "--json", "--temperature", "0")
    assert r.returncode == 0, r.stderr
    stats = json.loads(r.stdout)["stats"]
    assert stats["finish_reason"] in ("context full", "stop"), stats  # not "length": -1 set no count


def test_reasoning_effort_errors_are_one_line(smollm2, tmp_path):
    """A level other than low, medium, high is refused before anything loads (the missing file is never reached);
    SmolLM2's template takes no reasoning effort, so asking for one is refused, not ignored."""
    missing = tmp_path / "missing.gguf"
    assert_one_line_error(gguf_chat("run", missing, "-p", "hi", "--reasoning-effort", "max"),
                          "--reasoning-effort takes low, medium, high (got 'max')")
    assert_one_line_error(gguf_chat("chat", missing, "--reasoning-effort", "none"), "--reasoning-effort", "'none'")
    assert_one_line_error(gguf_chat("run", smollm2, "--raw", "-p", "hi", "--reasoning-effort", "low"),
                          "--raw is plain completion", "--reasoning-effort")
    assert_one_line_error(gguf_chat("run", smollm2, "-p", "hi", "--reasoning-effort", "high"),
                          "reasoning effort 'high' is not supported by this model", "gpt-oss")
