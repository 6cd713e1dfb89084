"""The flags shared by run, chat and bench, as inference.load's keyword arguments."""
import argparse

import pytest

from app.device_args import add_device_args, load_options
from inference.speculative import SPEC_K
from inference.placement import DEFAULT_GPU_SHARE, GpuLayersError, GpuShareError


def _options(*argv: str) -> dict:
    p = argparse.ArgumentParser()
    add_device_args(p)
    return load_options(p.parse_args(argv))


def test_defaults():
    assert _options() == {"device": "auto", "gpu_layers": "auto", "vram_budget": None, "cuda_graph": True,
                          "gpu_share": DEFAULT_GPU_SHARE, "cpu_moe": "auto", "spec": "auto", "spec_k": SPEC_K,
                          "draft": None}


def test_given_values():
    options = _options("--device", "cuda", "-ngl", "16", "--vram-budget", "6GB", "--gpu-share", "0", "--no-graph")
    assert options == {"device": "cuda", "gpu_layers": 16, "vram_budget": 6 * 2**30, "cuda_graph": False,
                       "gpu_share": 0, "cpu_moe": "auto", "spec": "auto", "spec_k": SPEC_K, "draft": None}
    with pytest.raises(GpuShareError):
        _options("--gpu-share", "auto")


def test_expert_flags():
    assert _options("--cpu-moe")["cpu_moe"] == "all"
    assert _options("--n-cpu-moe", "24")["cpu_moe"] == 24
    with pytest.raises(GpuLayersError, match="give one"):
        _options("--cpu-moe", "--n-cpu-moe", "3")


def test_speculation_flags():
    options = _options("--spec", "draft", "--spec-k", "2", "--draft", "small.gguf")
    assert (options["spec"], options["spec_k"], options["draft"]) == ("draft", 2, "small.gguf")
    with pytest.raises(SystemExit):
        _options("--spec", "sometimes")


def test_gpu_share_help_says_the_default():
    p = argparse.ArgumentParser()
    add_device_args(p)
    share = next(a for a in p._actions if "--gpu-share" in a.option_strings)
    assert f"(default {DEFAULT_GPU_SHARE};" in share.help
