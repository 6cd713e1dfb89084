"""llama.cpp's speculative decoding on the same file, beside bench_speculative.py in one lease: llama-server
(tests/llamacpp_peer.sh builds it) drafting from the file's MTP block (--spec-type draft-mtp) or not speculating,
greedy replies of n tokens to one prompt, and the server's own timings of each (tokens a second, drafts made and kept).

    python tests/inference/bench_llamacpp_spec.py SERVER FILE.gguf [--synth 0.7] [--spec-k 3] [-n 128] [--reps 3]

--synth F: llama-server's --spec-synth-rates F,F^2,... (benchmarking only): each draft kept with probability F while
those before it were, whatever the model says, as bench_speculative.py --synth F does for ours. Drafts of --spec-k
tokens every step (--spec-draft-p-min 0: no draft cut short on its own probability). The plain server runs first,
then the speculative one; each reply starts from an empty cache (cache_prompt off), EOS ignored so that every reply
is n tokens.
"""
import argparse
import json
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

PROMPT = "Rename the variable `chunk` to `segment` in this Python function and show the whole function:\n\n"


def serve(server: str, model: str, port: int, spec: list[str]) -> subprocess.Popen:
    """llama-server on model, all layers on the GPU, flash attention on, one slot; ready when /health says so. Its
    log goes to the temporary directory."""
    log = Path(tempfile.gettempdir()) / f"llama-server-{port}.log"
    proc = subprocess.Popen([server, "-m", model, "-ngl", "99", "-fa", "on", "-c", "4096", "-np", "1",
                             "--host", "127.0.0.1", "--port", str(port), *spec],
                            stdout=subprocess.DEVNULL, stderr=open(log, "w"))
    for _ in range(600):
        if proc.poll() is not None:
            sys.exit(f"llama-server exited ({proc.returncode}): see {log}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1) as r:
                if r.status == 200:
                    return proc
        except OSError:
            pass
        time.sleep(0.5)
    proc.kill()
    sys.exit("llama-server did not come up in 300 s")


def reply(port: int, n: int, seed: int) -> dict:
    body = {"prompt": PROMPT, "n_predict": n, "temperature": 0, "cache_prompt": False, "ignore_eos": True,
            "seed": seed}
    req = urllib.request.Request(f"http://127.0.0.1:{port}/completion", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=600) as r:
        return json.load(r)["timings"]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("server")
    p.add_argument("model")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("-n", type=int, default=128)
    p.add_argument("--spec-k", type=int, default=3)
    p.add_argument("--synth", type=float, metavar="F")
    p.add_argument("--port", type=int, default=8090)
    args = p.parse_args()
    mtp = ["--spec-type", "draft-mtp", "--spec-draft-n-max", str(args.spec_k), "--spec-draft-p-min", "0"]
    if args.synth is not None:
        mtp += ["--spec-synth-rates", ",".join(f"{args.synth ** (i + 1):.6f}" for i in range(args.spec_k))]
    for label, spec in (("plain", []), ("draft-mtp" + ("" if args.synth is None else f", {args.synth:.0%} kept "
                                                                                      "(synthetic)"), mtp)):
        proc = serve(args.server, args.model, args.port, spec)
        try:
            reply(args.port, 8, 0)  # warm-up
            for rep in range(args.reps):
                t = reply(args.port, args.n, rep)
                print(f"llama.cpp {rep} {label}: {t['predicted_n']} tokens, {t['predicted_per_second']:.1f} tok/s, "
                      f"drafted {t.get('draft_n', 0)}, accepted {t.get('draft_n_accepted', 0)}", flush=True)
        finally:
            proc.terminate()
            proc.wait(30)


if __name__ == "__main__":
    main()
