"""A model the GPU kernels do not take, loaded on a machine that seems to have a GPU."""
import re

import pytest


def load_refused_by_the_gpu(path, monkeypatch, gap: str, ctx: int):
    """The engine load(device="auto") gives for path, once --device cuda is seen refused in one line naming gap (what
    engine.gpu_gap says of the model), and the CPU is seen to run it saying why."""
    from inference import engine as engine_module
    from inference.engine import DeviceError, load
    monkeypatch.setattr(engine_module, "cuda_available", lambda: True)
    with pytest.raises(DeviceError, match=f"^the GPU kernels do not take {re.escape(gap)} yet: use --device cpu$"):
        load(path, device="cuda", ctx=ctx)
    e = load(path, device="auto", ctx=ctx)
    assert e.device == "cpu" and f"do not take {gap}" in e.placement.summary()
    return e
