"""Generation speed of one streamed request through `gguf-chat serve` next to `gguf-chat run --verbose`: same
model, prompt, greedy, token count; runs interleaved so that a busy machine slows both alike (BENCHMARKS.md).

    python tests/app/bench_serve.py [MODEL] [-n 256] [-r 5] [--device cpu|cuda]

run's rate is its own GenerationStats; the server's is the same engine timer (timings.predicted_per_second)
and, as a client sees it, the content chunks after the first over the time from the first to the last. run is
a fresh process whose one reply is also its first, so a third rate is the engine warmed in this process, with
no server: serve against it is what the server costs.
"""
import argparse
import json
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[2]
PROMPT = "1, 2, 3, 4, 5,"  # counting on: no early end of text


def start_server(model: str, device: str, log: Path) -> tuple[subprocess.Popen, str]:
    out = open(log, "w")
    p = subprocess.Popen([sys.executable, "-m", "app.cli", "serve", model, "--port", "0", "--ctx", "2048",
                          "--device", device], stdout=out, stderr=out, cwd=ROOT)
    while not (m := re.search(r"on (http://[\d.]+:\d+)", log.read_text())):
        if p.poll() is not None:
            sys.exit(log.read_text())
        time.sleep(0.1)
    return p, m.group(1)


def through_server(url: str, n: int) -> tuple[float, float, int]:
    """(engine tok/s, client tok/s, tokens) of one streamed greedy completion."""
    body = {"prompt": PROMPT, "max_tokens": n, "temperature": 0, "stream": True}
    times, timings = [], None
    with httpx.stream("POST", url + "/v1/completions", json=body, timeout=600) as r:
        for line in r.iter_lines():
            if not line.startswith("data: {"):
                continue
            chunk = json.loads(line[6:])
            if chunk["choices"][0]["text"]:
                times.append(time.perf_counter())
            timings = chunk.get("timings", timings)
    return timings["predicted_per_second"], (len(times) - 1) / (times[-1] - times[0]), timings["predicted_n"]


def through_run(model: str, device: str, n: int) -> tuple[float, int]:
    r = subprocess.run([sys.executable, "-m", "app.cli", "run", model, "--raw", "-p", PROMPT, "-n", str(n),
                        "--temperature", "0", "--ctx", "2048", "--device", device, "--verbose"],
                       capture_output=True, text=True, cwd=ROOT, check=True)
    m = re.search(r"generation: (\d+) tokens, ([\d.]+) tok/s", r.stderr)
    return float(m.group(2)), int(m.group(1))


def in_process(engine, n: int) -> float:
    for piece in engine.generate(PROMPT, max_tokens=n, temperature=0):
        if not isinstance(piece, str):
            return piece.generation_tok_s


def spread(xs: list[float]) -> str:
    return f"median {statistics.median(xs):.1f} (min {min(xs):.1f}, max {max(xs):.1f})"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model", nargs="?", default=None)
    ap.add_argument("-n", type=int, default=256)
    ap.add_argument("-r", type=int, default=5)
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args()
    if args.model is None:
        from models.packaged import smollm2_path  # noqa: PLC0415
        args.model = str(smollm2_path())
    from inference import load  # noqa: PLC0415
    server, url = start_server(args.model, args.device, Path(tempfile.mkdtemp()) / "serve.log")
    try:
        local = load(args.model, device=args.device, ctx=2048)
        in_process(local, 16)  # warm-ups, not counted: the first reply of a process runs slower
        through_server(url, 16)
        runs, warm, engine, client = [], [], [], []
        for i in range(args.r):
            rate, tokens = through_run(args.model, args.device, args.n)
            runs.append(rate)
            warm.append(in_process(local, args.n))
            e, c, served = through_server(url, args.n)
            engine.append(e)
            client.append(c)
            print(f"{i + 1}: run {rate:.1f} tok/s ({tokens} tokens) | warm engine {warm[-1]:.1f} | serve {e:.1f} "
                  f"tok/s engine, {c:.1f} tok/s client ({served} tokens)", flush=True)
        print(f"run:            {spread(runs)}\nwarm engine:    {spread(warm)}\nserve (engine): {spread(engine)}"
              f"\nserve (client): {spread(client)}")
        for name, base in (("run", runs), ("warm engine", warm)):
            print(f"serve / {name}, medians: engine {statistics.median(engine) / statistics.median(base):.3f}, "
                  f"client {statistics.median(client) / statistics.median(base):.3f}")
    finally:
        server.terminate()
        server.wait(30)


if __name__ == "__main__":
    main()
