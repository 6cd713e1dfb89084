"""The chat's generation speed next to `gguf-chat run`'s, and what the UI spends per token (BENCHMARKS.md).

    python tests/app/bench_chat.py [--prompt story|list] [-n 256] [-r 5] [--gguf-chat PATH] [--model MODEL]
                                   [--fresh-cache] [--type-after SECONDS]

`gguf-chat chat` runs in a real terminal (tmux, 120x36) with a fresh GGUF_CHAT_HOME. Each round sends the prompt
in a new chat (Ctrl+N), waits for the reply's stats in the store, then runs `gguf-chat run --verbose` on the same
prompt right after: pairs alternate, so a machine busy with other work slows both sides of a pair alike. The
chat's rate is its stats line's (the engine's own timer, as run's); round 1 is the chat's first reply.
--fresh-cache: an empty kernel cache (NUMBA_CACHE_DIR, a new folder, for the chat and the runs): a first start;
--type-after: the first message sent that many seconds after the start, not once the chat is ready (a user who
types while the kernels compile).

The UI's cost: CPU seconds from the reply's start (its row in the store) to its end, from /proc, per generated
token (the prompt's seconds included, when the UI is idle), of the app's main thread (the event
loop: messages, Markdown, layout, compositing), of the whole chat process (engine included) and of the tmux
server (the terminal that draws what the app writes).
"""
import argparse
import json
import os
import re
import shlex
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tmux_driver import Tmux  # run as a script, this folder is on sys.path

ROOT = Path(__file__).resolve().parents[2]
PROMPTS = {"story": "Write a long story about a dragon.",  # paragraphs of prose
           "list": "Count from 1 to 300, separated by commas."}  # SmolLM2 writes a numbered list: Markdown's worst
TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int, tid: int | None = None) -> float:
    """utime + stime of a process (all its threads), or of one of its threads."""
    path = f"/proc/{pid}/task/{tid}/stat" if tid else f"/proc/{pid}/stat"
    fields = Path(path).read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def last_reply(db: Path) -> tuple[int, str, dict | None]:
    con = sqlite3.connect(db)
    try:
        row = con.execute("SELECT id, state, stats FROM messages WHERE role = 'assistant' ORDER BY id DESC "
                          "LIMIT 1").fetchone()
    finally:
        con.close()
    return (row[0], row[1], json.loads(row[2]) if row[2] else None) if row else (0, "", None)


def chat_reply(tmux: Tmux, db: Path, prompt: str, app_pid: int, tmux_pid: int) -> dict:
    """Send the prompt in a new chat; the reply's stats and the CPU seconds spent meanwhile."""
    before = last_reply(db)[0]
    tmux("send-keys", "-t", "chat", "C-n")
    time.sleep(0.5)
    tmux("send-keys", "-t", "chat", "-l", prompt)
    tmux("send-keys", "-t", "chat", "Enter")
    while last_reply(db)[0] == before:  # counted from the reply's start: not the typing, not the user's message
        time.sleep(0.01)
    cpu0 = cpu_seconds(app_pid, app_pid), cpu_seconds(app_pid), cpu_seconds(tmux_pid)
    while True:
        time.sleep(0.1)
        reply_id, state, stats = last_reply(db)
        if state != "streaming":
            break
    cpu1 = cpu_seconds(app_pid, app_pid), cpu_seconds(app_pid), cpu_seconds(tmux_pid)
    n = stats["generated_tokens"]
    main, process, terminal = (1000 * (b - a) / n for a, b in zip(cpu0, cpu1))
    return {"tok_s": stats["generation_tok_s"], "tokens": n, "main_ms": main, "process_ms": process,
            "tmux_ms": terminal}


def run_reply(gguf_chat: list[str], model: list[str], prompt: str, n: int) -> dict:
    r = subprocess.run([*gguf_chat, "run", *model, "-p", prompt, "-n", str(n), "--temperature", "0", "--verbose"],
                       capture_output=True, text=True, check=True, cwd=ROOT)
    m = re.search(r"generation: (\d+) tokens, ([\d.]+) tok/s", r.stderr)
    return {"tok_s": float(m.group(2)), "tokens": int(m.group(1))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-n", type=int, default=256, help="tokens a reply (chat --max-tokens, run -n)")
    ap.add_argument("-r", type=int, default=5, help="rounds: a chat reply then a run each")
    ap.add_argument("--gguf-chat", help="the gguf-chat executable (default: this checkout's python -m app.cli)")
    ap.add_argument("--prompt", choices=PROMPTS, default="story")
    ap.add_argument("--model", help="default: the chat's and run's own default (the packaged SmolLM2)")
    ap.add_argument("--fresh-cache", action="store_true", help="an empty kernel cache: the chat's first start")
    ap.add_argument("--type-after", type=float, help="send the first message this many seconds after the start")
    args = ap.parse_args()
    if args.fresh_cache:
        os.environ["NUMBA_CACHE_DIR"] = tempfile.mkdtemp(prefix="bench_chat_kernels_")  # the chat's and the runs'
    gguf_chat = [args.gguf_chat] if args.gguf_chat else [sys.executable, "-m", "app.cli"]
    model = [args.model] if args.model else []
    home = Path(tempfile.mkdtemp(prefix="bench_chat_"))
    tmux = Tmux(f"bench-chat-{os.getpid()}")
    cache = f"NUMBA_CACHE_DIR={shlex.quote(os.environ['NUMBA_CACHE_DIR'])} " if args.fresh_cache else ""
    command = (f"cd {shlex.quote(str(ROOT))} && {cache}GGUF_CHAT_HOME={shlex.quote(str(home))} exec "
               f"{shlex.join(gguf_chat)} chat {shlex.join(model)} --temperature 0 --max-tokens {args.n}")
    # A shell first, then the command typed into it: the app starts at the session's size.
    tmux("new-session", "-d", "-s", "chat", "-x", "120", "-y", "36", "sh")
    try:
        tmux("send-keys", "-t", "chat", "-l", command)
        tmux("send-keys", "-t", "chat", "Enter")
        t0 = time.monotonic()
        if args.type_after is None:
            tmux.wait_for("ctx 0/", timeout=600)  # loaded, kernels compiled
            print(f"chat ready after {time.monotonic() - t0:.1f} s (load and warm-up)", flush=True)
        else:
            time.sleep(max(0.0, t0 + args.type_after - time.monotonic()))
        app_pid = int(tmux("display-message", "-p", "-t", "chat", "#{pane_pid}"))
        tmux_pid = int(tmux("display-message", "-p", "#{pid}"))
        pairs = []
        for i in range(args.r):
            chat = chat_reply(tmux, home / "chats.sqlite3", PROMPTS[args.prompt], app_pid, tmux_pid)
            run = run_reply(gguf_chat, model, PROMPTS[args.prompt], args.n)
            pairs.append((chat, run))
            print(f"round {i + 1}: chat {chat['tok_s']:.1f} tok/s ({chat['tokens']} tokens; per token: main thread "
                  f"{chat['main_ms']:.2f} ms, process {chat['process_ms']:.2f} ms, tmux {chat['tmux_ms']:.2f} ms)"
                  f" | run {run['tok_s']:.1f} tok/s ({run['tokens']} tokens) | chat/run "
                  f"{chat['tok_s'] / run['tok_s']:.0%}", flush=True)
    finally:
        subprocess.run(["tmux", "-L", tmux.socket, "kill-server"], capture_output=True)
    ratios = [c["tok_s"] / r["tok_s"] for c, r in pairs]
    print(f"chat/run: first reply {ratios[0]:.0%}, later replies {', '.join(f'{x:.0%}' for x in ratios[1:])} "
          f"(median {statistics.median(ratios[1:] or ratios):.0%}); main thread per token: median "
          f"{statistics.median(c['main_ms'] for c, _ in pairs):.2f} ms")


if __name__ == "__main__":
    main()
