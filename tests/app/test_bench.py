"""`gguf-chat bench` as a script uses it: JSON rows llama-bench would print, depth, one-line errors."""
import json
import os
import subprocess
import sys

from tests.app.test_run import ROOT, assert_one_line_error, gguf_chat


def test_bench_json_at_depth(smollm2):
    r = gguf_chat("bench", smollm2, "-p", "16", "-n", "4", "-r", "2", "-d", "24", "--device", "cpu", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["model"] == smollm2.name
    assert [(row["engine"], row["test"]) for row in out["results"]] == [("gguf-chat cpu", "pp16 @ d24"),
                                                                       ("gguf-chat cpu", "tg4 @ d24")]
    assert all(len(row["runs"]) == 2 and row["tok_s"] > 0 for row in out["results"])


def test_bench_bad_arguments(smollm2):
    assert_one_line_error(gguf_chat("bench", smollm2, "-p", "0"), "-p, -n and -r")
    assert_one_line_error(gguf_chat("bench", smollm2, "-d", "8", "--compare-llamacpp"), "--depth")


# Loaded first by every Python process of the environment: llama.cpp's model load dies of SIGSEGV when asked for its
# extra buffer types (always: 1; only then: 0), as its AMX path does on a VM that advertises AMX but faults on it
CRASHING_LLAMACPP = """
import os, signal
import llama_cpp._internals as internals
_init = internals.LlamaModel.__init__
def init(self, *args, params, **kwargs):
    if params.use_extra_bufts or os.environ["LLAMACPP_CRASHES_ALWAYS"] == "1":
        os.kill(os.getpid(), signal.SIGSEGV)
    _init(self, *args, params=params, **kwargs)
internals.LlamaModel.__init__ = init
"""


def test_compare_llamacpp_where_its_amx_path_crashes(smollm2, tmp_path):
    """Where llama.cpp's extra buffer types kill the process, bench measures llama.cpp without them and says so
    in one line; where llama.cpp dies either way, a one-line error: never a silent exit 139."""
    (tmp_path / "sitecustomize.py").write_text(CRASHING_LLAMACPP)
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{ROOT}", "LLAMACPP_CRASHES_ALWAYS": "0"}
    args = [sys.executable, "-m", "app.cli", "bench", str(smollm2), "-p", "8", "-n", "2", "-r", "1", "--device", "cpu",
            "--compare-llamacpp", "--json"]
    r = subprocess.run(args, capture_output=True, text=True, cwd=ROOT, env=env, timeout=240)
    assert r.returncode == 0, r.stderr
    engines = [row["engine"] for row in json.loads(r.stdout)["results"]]
    assert engines == ["gguf-chat cpu"] * 2 + ["llama.cpp cpu 2t"] * 2
    assert r.stderr.strip().splitlines() == ["llama.cpp: its extra buffer types (AMX, repacked weights) fail on this "
                                             "machine (killed by SIGSEGV): measured without them"]
    r = subprocess.run(args, capture_output=True, text=True, cwd=ROOT, env=env | {"LLAMACPP_CRASHES_ALWAYS": "1"},
                       timeout=240)
    assert_one_line_error(r, "llama.cpp cannot run", "killed by SIGSEGV")
