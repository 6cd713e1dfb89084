"""The GPU's share of the CPU layers' one-token matmuls (inference/gpu_share.py), on the device: the joined rows
against gguf-py's dequantization, through a roomy ring and one that makes copies wait, the GPU's rows kept in host
memory, and the default share. tests/inference/test_share_ring.py checks the ring's schedule on the CPU."""
import numpy as np
import pytest
from gguf import GGMLQuantizationType
from gguf.quants import dequantize

from inference.placement import DEFAULT_GPU_SHARE
from models.config import config_from_metadata
from models.gguf import open_gguf

pytestmark = pytest.mark.gpu


def _weights(path):
    from inference.weights import load_weights
    gguf = open_gguf(path)
    return load_weights(gguf, config_from_metadata(gguf.metadata))


def _float(m) -> np.ndarray:
    """W [n_rows, n_cols] float32, dequantized by gguf-py."""
    return dequantize(m.data, GGMLQuantizationType(m.qtype.id)).reshape(m.n_rows, m.n_cols).astype(np.float32)


@pytest.mark.parametrize("model", ["synth_1b", "synth_qwen2", "synth_gemma3"])
@pytest.mark.parametrize("use_graph", [True, False])
@pytest.mark.parametrize("ring", ["placement", "tight"])
def test_split_rows_match_the_float_product(model, use_graph, ring, request):
    """Every matmuls call of two layers (Q4_K/Q6_K; Q8_0, Q5_0, Q4_1; F16), three tokens in a row (the first
    eager and captured, then graph replays): x @ W.T within the 8-bit rounding of x (relative error < 2%: rows
    misplaced, computed twice or read before their copy landed give ~140%). The placement's ring holds every
    call here; a tight one (the largest call twice) makes copies wait for earlier calls' kernels."""
    import cupy as cp

    from inference.gpu_share import GpuShare, _layer_calls
    from inference.placement import share_ring_bytes
    w = _weights(request.getfixturevalue(model))
    calls = [ws for i in range(2) for ws in _layer_calls(w.layers[i])]
    largest = max(m.data.nbytes for ws in calls for m in ws)
    ring_bytes = share_ring_bytes(largest) if ring == "placement" else max(
        sum(m.data.nbytes for m in ws) for ws in calls)  # twice the largest call's half, with alignment to spare
    share = GpuShare(cp.cuda.Stream(non_blocking=True), w, range(2), 0.5, ring_bytes, use_graph)
    rng = np.random.default_rng(0)
    for _ in range(3):
        for ws in calls:
            call = share._calls[tuple(map(id, ws))]
            assert call.split == [m.n_rows // 2 // 16 * 16 for m in ws] and call.pinned
            x = rng.standard_normal((1, ws[0].n_cols), np.float32)
            for m, y in zip(ws, share.matmuls(ws, x)):
                ref = x @ _float(m).T
                err = np.linalg.norm(y - ref) / np.linalg.norm(ref)
                assert y.shape == (1, m.n_rows) and err < 0.02, f"{m.qtype.name} {m.n_rows} rows: {err:.4f}"
            assert (call.graph is not None) == use_graph
    assert share._schedule.since == 0  # the calls came in order: no token started over
    if ring == "tight":
        assert share.ring.nbytes < sum(c.ring_span for c in share._order)


def test_gpu_rows_live_in_pinned_host_memory(synth_1b):
    """Only the ring (and x, y, q8_1 buffers) takes VRAM; the rows are in page-locked host memory."""
    import cupy as cp

    from inference.gpu_share import GpuShare
    w = _weights(synth_1b)
    pool = cp.get_default_memory_pool()  # this process's VRAM: memGetInfo's is the device's, which -n 4's workers share
    used = pool.used_bytes()
    share = GpuShare(cp.cuda.Stream(non_blocking=True), w, range(4), 0.5, 32 * 2**20)
    matrices = sum(m.data.nbytes for lw in w.layers[:4] for m in (*lw.qkv, lw.attn_output, *lw.gate_up, lw.ffn_down))
    assert 0.45 * matrices < share.nbytes <= 0.5 * matrices and share.ring.nbytes == 32 * 2**20
    assert pool.used_bytes() - used < 48 * 2**20 < share.nbytes  # the rows would not fit in it
    for call in share._calls.values():
        for g in call.pinned:
            assert cp.cuda.runtime.pointerGetAttributes(g.weight.data.data.ptr).type == 1  # cudaMemoryTypeHost


def test_the_default_share_and_what_the_engine_says(synth_1b):
    """Loaded with layers on the CPU and no share given, the GPU takes DEFAULT_GPU_SHARE of their rows and the
    engine says so; 0 turns it off."""
    from inference import load
    engine = load(synth_1b, device="cuda", ctx=512, gpu_layers=8)
    assert engine.gpu_share is not None and engine.gpu_share.share == DEFAULT_GPU_SHARE
    text = engine.summary()
    assert f"the GPU multiplies {DEFAULT_GPU_SHARE:.0%} of the CPU layers' matrix rows each token" in text, text
    assert "MiB ring in VRAM)" in text
    assert load(synth_1b, device="cuda", ctx=512, gpu_layers=8, gpu_share=0).gpu_share is None
