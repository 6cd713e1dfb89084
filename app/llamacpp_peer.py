"""llama.cpp (llama-cpp-python) as the peer `bench --compare-llamacpp` measures and the tests' logits oracle.

Its CPU backend may keep weights in "extra buffer types": repacked for its SIMD kernels, or AMX tiles on an Intel
CPU that has them. They change its speed, not what it computes. A build from source on a VM whose CPU advertises
AMX enables the AMX one, whose tile instructions fault where the VM does not let the guest use them (a
segfault of the whole process, issue 38), so whether they work is probed in a child process first.
"""
import contextlib
import signal
import subprocess
import sys
from pathlib import Path

# a child loads the model, then runs a prompt and a decode step: where AMX's tiles fault, it dies of a signal
_PROBE = """
import sys
from app.llamacpp_peer import llama
llm = llama(sys.argv[1], extra_buffer_types=sys.argv[2] == "1", n_ctx=72, n_batch=64, n_threads=2, verbose=False)
llm.eval(list(range(100, 164)))
llm.eval([164])
"""


def llama(path, extra_buffer_types: bool = True, **kwargs):
    """llama_cpp.Llama(path, **kwargs), its model loaded with or without the extra buffer types (Llama takes no
    argument for it: its model parameters start from llama_model_default_params, patched here while it loads)."""
    import llama_cpp  # noqa: PLC0415  (optional: the test extra, or installed by hand for bench)
    import llama_cpp.llama_cpp as native  # noqa: PLC0415

    default_params = native.llama_model_default_params

    def params():
        p = default_params()
        p.use_extra_bufts = extra_buffer_types
        return p

    native.llama_model_default_params = params
    try:
        return llama_cpp.Llama(str(path), **kwargs)
    finally:
        native.llama_model_default_params = default_params


def probe(path: Path, extra_buffer_types: bool) -> str:
    """'' if llama.cpp evaluates the model in a child process this way, else why not (one line)."""
    child = subprocess.run([sys.executable, "-c", _PROBE, str(path), "1" if extra_buffer_types else "0"],
                           capture_output=True, text=True, timeout=600)
    if child.returncode == 0:
        return ""
    if child.returncode < 0:
        with contextlib.suppress(ValueError):
            return f"killed by {signal.Signals(-child.returncode).name}"
    last = (child.stderr.strip().splitlines() or [f"exit code {child.returncode}"])[-1]
    return last
