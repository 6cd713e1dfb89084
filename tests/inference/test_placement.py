"""Placement arithmetic on the CPU: real tensor tables of the packaged models and llama3-8b's built from shapes."""
import dataclasses
import os

import numpy as np
import pytest
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from inference.placement import (CUDA_CONTEXT_BYTES, PREFILL_CHUNK, RUNTIME_RESERVE_BYTES,
                                 GiB, GpuLayersError, GpuShareError, MiB, VramBudgetError, all_on_cpu, cap_gpu_share,
                                 free_vram, host_memory_available, kv_bytes_per_layer, layer_weight_bytes,
                                 parse_cpu_moe, parse_gpu_layers, parse_gpu_share, parse_vram_budget, plan_placement,
                                 prefill_tile_elems, scratch_bytes, share_ring_bytes, split)
from models.config import ModelConfig, config_from_metadata
from models.ggml_types import TYPES_BY_NAME
from models.gguf import TensorInfo, open_gguf

H100_FREE = 80552 * MiB  # memGetInfo's free on an H100 once the context exists


def tensor(name: str, shape: tuple[int, ...], type_name: str) -> TensorInfo:
    qtype = TYPES_BY_NAME[type_name]
    n = 1
    for d in shape:
        n *= d
    return TensorInfo(name, shape, qtype, 0, n // qtype.block_elems * qtype.block_bytes)


def llama3_8b_q4_k_m() -> tuple[dict[str, TensorInfo], ModelConfig]:
    """llama3-8b's tensors as llama.cpp's Q4_K_M writes them: Q6_K attn_v and ffn_down in the first and last
    eighth of the layers and every third between (use_more_bits), Q6_K output, Q4_K elsewhere."""
    L, d, ff, nkv, hd, vocab = 32, 4096, 14336, 8, 128, 128256
    t = [tensor("token_embd.weight", (d, vocab), "Q4_K"), tensor("output.weight", (d, vocab), "Q6_K"),
         tensor("output_norm.weight", (d,), "F32"), tensor("rope_freqs.weight", (hd // 2,), "F32")]
    for i in range(L):
        more_bits = i < L // 8 or i >= 7 * L // 8 or (i - L // 8) % 3 == 2
        big = "Q6_K" if more_bits else "Q4_K"
        t += [tensor(f"blk.{i}.attn_norm.weight", (d,), "F32"), tensor(f"blk.{i}.ffn_norm.weight", (d,), "F32"),
              tensor(f"blk.{i}.attn_q.weight", (d, d), "Q4_K"),
              tensor(f"blk.{i}.attn_k.weight", (d, nkv * hd), "Q4_K"),
              tensor(f"blk.{i}.attn_v.weight", (d, nkv * hd), big), tensor(f"blk.{i}.attn_output.weight", (d, d), "Q4_K"),
              tensor(f"blk.{i}.ffn_gate.weight", (d, ff), "Q4_K"), tensor(f"blk.{i}.ffn_up.weight", (d, ff), "Q4_K"),
              tensor(f"blk.{i}.ffn_down.weight", (ff, d), big)]
    cfg = ModelConfig(arch="llama", n_layers=L, n_embd=d, n_ff=ff, n_heads=32, n_kv_heads=nkv, head_dim=hd,
                      v_head_dim=hd, n_vocab=vocab, n_ctx_train=8192, rms_eps=1e-5, rope_base=500000.0, rope_dim=hd,
                      rope_scale=1.0, rope_style="normal", activation="silu")
    return {x.name: x for x in t}, cfg


@pytest.fixture(scope="module")
def llama3():
    return llama3_8b_q4_k_m()


def test_llama3_size_matches_the_published_file(llama3):
    tensors, _ = llama3
    # Meta-Llama-3-8B-Instruct.Q4_K_M.gguf is 4.92 GB, ~8 MB of it metadata and vocabulary
    assert 4.90e9 < sum(t.nbytes for t in tensors.values()) < 4.93e9


def test_llama3_at_6_gb(llama3):
    tensors, cfg = llama3
    p = plan_placement(tensors, cfg, 8192, H100_FREE, vram_budget=6 * GiB)
    assert 0 < p.n_gpu_layers < 32 and p.layers[-1] == "gpu" and p.layers[0] == "cpu"
    assert p.output == "gpu" and p.embedding == "cpu"
    assert p.kv_bytes == p.n_gpu_layers * 2 * 8 * 8192 * 256  # 32 MiB a layer at 8192
    assert p.total_bytes <= 6 * GiB
    assert p.summary().startswith(f"placement: {p.n_gpu_layers}/32 layers on GPU, layers 0-{31 - p.n_gpu_layers} "
                                  "on CPU: VRAM budget exhausted")


@pytest.fixture(scope="module", params=["smollm2", "gemma3"])
def packaged(request):
    path = request.getfixturevalue(request.param)
    model = open_gguf(path)
    yield path, model.tensors, config_from_metadata(model.metadata)
    model.close()


# ---- what is counted ----

def test_all_on_gpu_counts_every_tensor_once(packaged):
    """Tied heads (both packaged files): token_embd is the head, counted once; with every layer on the GPU the
    weights are the file's tensor bytes (gguf-py's block sizes), their vectors already float32."""
    _, tensors, cfg = packaged
    p = plan_placement(tensors, cfg, 2048, H100_FREE)
    assert p.n_gpu_layers == cfg.n_layers and p.output == "gpu" and p.embedding == "gpu" and p.reason == ""
    sizes = {t.type.id: GGML_QUANT_SIZES[GGMLQuantizationType(t.type.id)] for t in tensors.values()}
    assert {t.type.name for t in tensors.values() if len(t.shape) == 1} == {"F32"}
    assert p.weights_bytes == sum(t.n_elems // sizes[t.type.id][0] * sizes[t.type.id][1] for t in tensors.values())
    assert p.kv_bytes == cfg.n_layers * kv_bytes_per_layer(cfg, 2048)
    assert p.reserve_bytes == RUNTIME_RESERVE_BYTES and p.budget_bytes == H100_FREE


def test_vram_is_the_file_size_after_repacking(packaged):
    """The GPU keeps each matrix in cuda_layout.repack's layout: the assumption that VRAM = the file's bytes."""
    from kernels.cuda.layout import repack
    path, tensors, cfg = packaged
    model = open_gguf(path)
    for name, t in tensors.items():
        if name.startswith("blk.0.") and len(t.shape) == 2:
            raw = np.asarray(model.tensor_bytes(name)).reshape(t.shape[1], -1)
            assert repack(raw, t.type).nbytes == t.nbytes, name
    model.close()


def test_kv_cache_is_f16_k_and_v(packaged):
    _, _, cfg = packaged
    n_ctx = 4096
    # cuda_ops.kv_cache: two float16 [n_kv_heads, n_ctx, head_dim] arrays a layer
    assert kv_bytes_per_layer(cfg, n_ctx) == 2 * 2 * cfg.n_kv_heads * n_ctx * cfg.head_dim


def test_untied_head_and_embedding(llama3):
    """llama3 has its own output matrix: token_embd costs VRAM only when every layer is on the GPU."""
    tensors, cfg = llama3
    full = plan_placement(tensors, cfg, 8192, H100_FREE)
    assert full.n_gpu_layers == 32 and full.embedding == "gpu"
    assert full.weights_bytes == sum(t.nbytes if len(t.shape) == 2 else 4 * t.shape[0] for t in tensors.values())
    # one byte short of that: the last layer that does not fit is layer 0 and the embedding stays on the CPU
    short = plan_placement(tensors, cfg, 8192, needed(full, tensors, cfg) - 1)
    assert short.n_gpu_layers == 31 and short.embedding == "cpu" and short.layers[0] == "cpu"
    assert short.weights_bytes == full.weights_bytes - tensors["token_embd.weight"].nbytes - sum(
        t.nbytes if len(t.shape) == 2 else 4 * t.shape[0] for n, t in tensors.items() if n.startswith("blk.0."))
    assert plan_placement(tensors, cfg, 8192, full.total_bytes).n_gpu_layers == 32


# ---- budgets and contexts ----

BUDGETS = [int(g * GiB) for g in (1.5, 2, 3, 4, 5, 6, 8, 10, 12, 16, 24, 40, 80)]
CONTEXTS = [512, 2048, 8192, 32768, 131072]


def plans(tensors, cfg, n_ctx):
    """Placement for each budget, None where the budget is too small."""
    out = []
    for budget in BUDGETS:
        try:
            out.append(plan_placement(tensors, cfg, n_ctx, H100_FREE, vram_budget=budget))
        except VramBudgetError:
            out.append(None)
    return out


@pytest.mark.parametrize("n_ctx", CONTEXTS)
def test_more_budget_never_fewer_layers_and_never_over_budget(llama3, n_ctx):
    tensors, cfg = llama3
    ps = plans(tensors, cfg, n_ctx)
    counts = [p.n_gpu_layers if p else 0 for p in ps]
    assert counts == sorted(counts)
    n_small = ps.count(None)
    assert None not in ps[n_small:]  # too small only at the low end
    for budget, p in zip(BUDGETS, ps):
        if p:
            assert p.total_bytes <= budget
            assert p.layers == ("cpu",) * (32 - p.n_gpu_layers) + ("gpu",) * p.n_gpu_layers
            assert p.reserve_bytes == RUNTIME_RESERVE_BYTES + CUDA_CONTEXT_BYTES
    assert counts[-1] == 32  # 80 GB holds llama3-8b even at 131072 (16 GiB of KV cache)


def test_longer_context_never_more_layers(llama3):
    tensors, cfg = llama3
    for budget in BUDGETS[3:]:
        counts = [plan_placement(tensors, cfg, c, H100_FREE, vram_budget=budget).n_gpu_layers for c in CONTEXTS[:3]]
        assert counts == sorted(counts, reverse=True)
    # 128k tokens: 512 MiB of KV cache a layer, so 6 GB holds only a few layers
    assert plan_placement(tensors, cfg, 131072, H100_FREE, vram_budget=6 * GiB).n_gpu_layers < 8


def test_packaged_models_budgets(packaged):
    _, tensors, cfg = packaged
    for n_ctx in (512, 8192, 32768):
        ps = plans(tensors, cfg, n_ctx)
        counts = [p.n_gpu_layers if p else 0 for p in ps]
        assert counts == sorted(counts) and counts[-1] == cfg.n_layers
        assert all(p.total_bytes <= b for b, p in zip(BUDGETS, ps) if p)


def test_budget_is_capped_by_free_vram(llama3):
    tensors, cfg = llama3
    p = plan_placement(tensors, cfg, 8192, free_vram=4 * GiB, vram_budget=80 * GiB)
    assert p.budget_bytes == 4 * GiB + CUDA_CONTEXT_BYTES and p.total_bytes <= p.budget_bytes
    assert p.n_gpu_layers == plan_placement(tensors, cfg, 8192, free_vram=4 * GiB).n_gpu_layers


# ---- gpu_layers ----

def test_gpu_layers_zero_is_all_cpu(llama3):
    tensors, cfg = llama3
    p = plan_placement(tensors, cfg, 8192, H100_FREE, gpu_layers=0)
    assert p.layers == ("cpu",) * 32 and p.output == "cpu" and p.embedding == "cpu" and p.total_bytes == 0
    assert p.summary() == "placement: 0/32 layers on GPU: --gpu-layers 0, everything on the CPU"


def test_gpu_layers_explicit(llama3):
    tensors, cfg = llama3
    for k in (1, 8, 31, 32):
        p = plan_placement(tensors, cfg, 8192, H100_FREE, gpu_layers=k)
        assert p.n_gpu_layers == k and p.layers[32 - k:] == ("gpu",) * k and p.output == "gpu"
        assert p.embedding == ("gpu" if k == 32 else "cpu")
    assert "on CPU: --gpu-layers 8" in plan_placement(tensors, cfg, 8192, H100_FREE, gpu_layers=8).summary()


def test_gpu_layers_more_than_fit(llama3):
    tensors, cfg = llama3
    fits = plan_placement(tensors, cfg, 8192, H100_FREE, vram_budget=6 * GiB).n_gpu_layers
    assert plan_placement(tensors, cfg, 8192, H100_FREE, gpu_layers=fits, vram_budget=6 * GiB).n_gpu_layers == fits
    with pytest.raises(VramBudgetError, match=rf"^--gpu-layers 32 needs \d+\.\d\d GiB of VRAM at ctx 8192, the budget "
                                              rf"is 6\.00 GiB: at most {fits} layers fit$"):
        plan_placement(tensors, cfg, 8192, H100_FREE, gpu_layers=32, vram_budget=6 * GiB)


@pytest.mark.parametrize("bad", [33, 99, -1])
def test_gpu_layers_out_of_range(llama3, bad):
    tensors, cfg = llama3
    with pytest.raises(GpuLayersError, match=r"^--gpu-layers must be 'auto' or 0\.\.32 \(the model has 32 layers\)"):
        plan_placement(tensors, cfg, 8192, H100_FREE, gpu_layers=bad)


# ---- too small ----

def test_budget_too_small_names_the_sizes(llama3):
    tensors, cfg = llama3
    with pytest.raises(VramBudgetError) as e:
        plan_placement(tensors, cfg, 8192, H100_FREE, vram_budget=1 * GiB)
    msg = str(e.value)
    assert "\n" not in msg
    head = tensors["output.weight"].nbytes + 4 * 4096 + 4 * 64
    assert msg.startswith(f"VRAM budget 1.00 GiB is too small for the GPU: the output head ({head / GiB:.2f} GiB), "
                          "one layer (")
    assert "0.03 GiB KV cache at ctx 8192" in msg and "use --gpu-layers 0 (CPU)" in msg


def needed(p, tensors, cfg) -> int:
    """What placement p's layers need: its total with 512-token prompt chunks (what decides what fits; the chunk
    grows into what a budget has left)."""
    return p.total_bytes - scratch_bytes(tensors, cfg, p.prefill_chunk) + scratch_bytes(tensors, cfg)


def test_smallest_budget_that_loads_holds_one_layer(packaged):
    _, tensors, cfg = packaged
    one = plan_placement(tensors, cfg, 8192, H100_FREE, gpu_layers=1)
    p = plan_placement(tensors, cfg, 8192, needed(one, tensors, cfg))
    assert p.n_gpu_layers == 1 and p.total_bytes == needed(one, tensors, cfg) and p.prefill_chunk == 512
    with pytest.raises(VramBudgetError):
        plan_placement(tensors, cfg, 8192, needed(one, tensors, cfg) - 1)


def test_budget_below_the_reserve(packaged):
    _, tensors, cfg = packaged
    with pytest.raises(VramBudgetError, match="too small"):
        plan_placement(tensors, cfg, 512, H100_FREE, vram_budget=100 * MiB)


# ---- summary ----

def test_summary_all_on_gpu(packaged):
    _, tensors, cfg = packaged
    lines = plan_placement(tensors, cfg, 2048, H100_FREE).summary().splitlines()
    n = cfg.n_layers
    assert lines[0] == f"placement: {n}/{n} layers on GPU"
    assert lines[1].startswith("  VRAM ") and f"(layers 0-{n - 1} + output head)" in lines[1]
    assert "(ctx 2048, f16)" in lines[1] and "of 78.66 GiB budget" in lines[1]
    assert lines[2] == "  token embeddings and output head on GPU"


def test_summary_one_cpu_layer(llama3):
    tensors, cfg = llama3
    s = plan_placement(tensors, cfg, 8192, H100_FREE, gpu_layers=31).summary()
    assert s.splitlines()[0] == "placement: 31/32 layers on GPU, layer 0 on CPU: --gpu-layers 31"


# ---- parsing ----

@pytest.mark.parametrize("text, expected", [("6", 6 * GiB), ("6GB", 6 * GiB), ("6.5GiB", int(6.5 * GiB)),
                                            ("6 gb", 6 * GiB), ("512MiB", 512 * MiB), ("512mb", 512 * MiB),
                                            ("0.5", GiB // 2), ("24g", 24 * GiB)])
def test_parse_vram_budget(text, expected):
    assert parse_vram_budget(text) == expected


@pytest.mark.parametrize("text", ["", "0", "-1", "six", "6TB", "6 GB extra", "1e9"])
def test_parse_vram_budget_rejects(text):
    with pytest.raises(VramBudgetError, match=r"^--vram-budget takes a size like 6, 6GB, 6.5GiB or 512MiB, got"):
        parse_vram_budget(text)


def test_parse_gpu_layers():
    assert parse_gpu_layers("auto") == "auto" and parse_gpu_layers("AUTO") == "auto"
    assert parse_gpu_layers("0") == 0 and parse_gpu_layers("24") == 24
    for bad in ("-1", "all", "2.5", ""):
        with pytest.raises(GpuLayersError, match="^--gpu-layers takes 'auto' or a number of layers"):
            parse_gpu_layers(bad)


def test_parse_gpu_share():
    assert parse_gpu_share("0") == 0 and parse_gpu_share(" 0.45 ") == 0.45 and parse_gpu_share("0.9") == 0.9
    for bad in ("-0.1", "0.95", "1", "auto", "half", "nan", "inf", ""):
        with pytest.raises(GpuShareError, match=r"^--gpu-share takes a fraction from 0 to 0\.9, got"):
            parse_gpu_share(bad)


def test_gpu_share_pins_at_most_half_the_available_memory():
    assert cap_gpu_share(0.4, 10 * GiB, 64 * GiB) == 0.4  # 4 GiB pinned of 64
    assert cap_gpu_share(0.4, 10 * GiB, 4 * GiB) == pytest.approx(0.2)  # 2 GiB: half of what is available
    assert cap_gpu_share(0.4, 0, 1 * GiB) == 0.4  # no matrix the GPU can multiply
    assert 0 < host_memory_available() <= os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def test_free_vram_without_cupy(monkeypatch):
    monkeypatch.setitem(__import__("sys").modules, "cupy", None)  # import cupy raises ImportError
    assert free_vram() is None


@pytest.mark.gpu
def test_free_vram_on_a_gpu():
    import cupy
    free, total = cupy.cuda.runtime.memGetInfo()
    assert 0 < free_vram() <= total


@pytest.mark.gpu
def test_counts_cover_what_the_kernels_allocate(llama3):
    """KV cache and the kernels' own scratch (prefill Scratch, attention splits, sampler) within the counts."""
    import cupy as cp

    from kernels.cuda import ops as cuda_ops
    from kernels.cuda.prefill import Scratch
    tensors, cfg = llama3
    k, v = cuda_ops.kv_cache(cfg.n_kv_heads, 8192, cfg.head_dim)
    assert k.nbytes + v.nbytes == kv_bytes_per_layer(cfg, 8192)
    largest = max(t.n_elems for name, t in tensors.items() if name.startswith("blk.") and len(t.shape) == 2)
    max_cols = max(cfg.n_embd, cfg.n_ff, cfg.n_heads * cfg.v_head_dim)
    pool = cp.get_default_memory_pool()
    before = pool.used_bytes()
    buffers = (Scratch.empty(PREFILL_CHUNK, max_cols, prefill_tile_elems(cfg, largest)), cuda_ops.argmax_scratch(),
               cuda_ops.decode_scratch(cfg.n_heads, cfg.n_kv_heads, cfg.head_dim), cuda_ops.sample_scratch(cfg.n_vocab))
    kernel_bytes = pool.used_bytes() - before
    assert buffers and largest < kernel_bytes <= scratch_bytes(tensors, cfg)


def test_a_small_models_prompt_matmuls_take_one_tile_a_call(llama3):
    """A prompt chunk's matmuls call costs a dequantize launch and a cuBLAS call a tile (host-bound on small
    models): llama-1b's gate and up (2 x 8192 x 2048) fit one 64 MiB tile; llama3-8b keeps half its largest
    matrix (ffn 14336 x 4096), four tiles for gate and up, rather than 235 MB of VRAM for one."""
    _, cfg = llama3
    llama_1b = dataclasses.replace(cfg, n_embd=2048, n_ff=8192, n_heads=32, n_kv_heads=8, head_dim=64)
    assert prefill_tile_elems(llama_1b, 8192 * 2048) == 2 * 8192 * 2048
    assert prefill_tile_elems(cfg, 14336 * 4096) == 14336 * 4096 // 2


def test_the_share_ring_is_counted_only_with_layers_on_the_cpu(llama3):
    """With CPU layers the GPU's share of their rows streams through a VRAM ring (gpu_share.py): 4 of the
    largest layer matrix, llama3-8b's Q6_K ffn_down (14336 x 4096 at 210 bytes a 256): 192.7 MB."""
    tensors, cfg = llama3
    ring = share_ring_bytes(tensors["blk.0.ffn_down.weight"].nbytes)
    assert ring == 4 * 14336 * 4096 // 256 * 210
    assert split(tensors, cfg, 4096, 32, 80 * GiB, 0, "").scratch_bytes == scratch_bytes(tensors, cfg, 2048)
    for k in (1, 16, 31):
        assert split(tensors, cfg, 4096, k, 80 * GiB, 0, "").scratch_bytes == scratch_bytes(tensors, cfg, 2048) + ring


def test_prompt_chunks_grow_only_into_vram_the_placement_leaves(llama3):
    """Placed with 512-token prompt chunks; where the budget then has room for a longer chunk's buffers the
    chunk is the longest that fits (the layers as placed), else 512; the OOM retry counts on no spare."""
    tensors, cfg = llama3
    base = split(tensors, cfg, 4096, 32, 80 * GiB, RUNTIME_RESERVE_BYTES, "", longer_chunks=False).total_bytes
    grow = {c: scratch_bytes(tensors, cfg, c) - scratch_bytes(tensors, cfg) for c in (1024, 2048)}
    assert 0 < grow[1024] < grow[2048]
    for budget, chunk in ((base, 512), (base + grow[1024], 1024), (base + grow[2048] - 1, 1024),
                          (base + grow[2048], 2048), (80 * GiB, 2048)):
        p = plan_placement(tensors, cfg, 4096, budget)
        assert (p.n_gpu_layers, p.prefill_chunk) == (32, chunk), budget
        assert p.total_bytes <= budget
    assert plan_placement(tensors, cfg, 4096, base - 1).n_gpu_layers < 32  # 512 decides what fits
    assert split(tensors, cfg, 4096, 32, 80 * GiB, 0, "", longer_chunks=False).prefill_chunk == 512
    assert plan_placement(tensors, cfg, 1500, 80 * GiB).prefill_chunk == 1024  # none longer than the context


def test_split_counts_and_the_status_bar_text(llama3):
    """split() is what plan_placement and the OOM retry both report; the chat's status bar says it short."""
    from types import SimpleNamespace

    from app.tui.status_bar import placement_text
    tensors, cfg = llama3
    p = split(tensors, cfg, 4096, 24, 8 * GiB, RUNTIME_RESERVE_BYTES, "out of GPU memory")
    assert p.n_gpu_layers == 24 and p.embedding == "cpu" and p.reason == "out of GPU memory"
    assert p.weights_bytes == sum(layer_weight_bytes(tensors, 32)[8:]) + tensors["output.weight"].nbytes + 4 * (4096 + 64)
    assert p.kv_bytes == 24 * kv_bytes_per_layer(cfg, 4096)
    assert placement_text(SimpleNamespace(placement=p)) == "GPU 24 · CPU 8 layers"
    assert placement_text(SimpleNamespace(placement=split(tensors, cfg, 4096, 32, 0, 0, ""))) == "GPU 32/32 layers"
    assert placement_text(SimpleNamespace(placement=all_on_cpu(32, 4096, "--device cpu"))) == "CPU 32/32 layers"


def qwen3moe_30b_q4_k_m() -> tuple[dict[str, TensorInfo], ModelConfig]:
    """Qwen3-30B-A3B's tensors as tests/synth_gguf.py writes its q4_k_m: 48 layers of 128 experts
    [768 x 2048] (Q4_K gate and up, Q6_K down in the use_more_bits layers), an F32 router, Q4_K attention."""
    L, d, ff, n_exp, nh, nkv, hd, vocab = 48, 2048, 768, 128, 32, 4, 128, 151936
    t = [tensor("token_embd.weight", (d, vocab), "Q4_K"), tensor("output.weight", (d, vocab), "Q6_K"),
         tensor("output_norm.weight", (d,), "F32")]
    for i in range(L):
        more_bits = i < L // 8 or i >= 7 * L // 8 or (i - L // 8) % 3 == 2
        p = f"blk.{i}."
        t += [tensor(p + "attn_norm.weight", (d,), "F32"), tensor(p + "ffn_norm.weight", (d,), "F32"),
              tensor(p + "attn_q.weight", (d, nh * hd), "Q4_K"), tensor(p + "attn_k.weight", (d, nkv * hd), "Q4_K"),
              tensor(p + "attn_v.weight", (d, nkv * hd), "Q6_K" if more_bits else "Q4_K"),
              tensor(p + "attn_output.weight", (nh * hd, d), "Q4_K"),
              tensor(p + "attn_q_norm.weight", (hd,), "F32"), tensor(p + "attn_k_norm.weight", (hd,), "F32"),
              tensor(p + "ffn_gate_inp.weight", (d, n_exp), "F32"),
              tensor(p + "ffn_gate_exps.weight", (d, ff, n_exp), "Q4_K"),
              tensor(p + "ffn_up_exps.weight", (d, ff, n_exp), "Q4_K"),
              tensor(p + "ffn_down_exps.weight", (ff, d, n_exp), "Q6_K" if more_bits else "Q4_K")]
    cfg = ModelConfig(arch="qwen3moe", n_layers=L, n_embd=d, n_ff=ff, n_heads=nh, n_kv_heads=nkv, head_dim=hd,
                      v_head_dim=hd, n_vocab=vocab, n_ctx_train=40960, rms_eps=1e-6, rope_base=1e6, rope_dim=hd,
                      rope_scale=1.0, rope_style="neox", activation="silu", qk_norm=True, n_expert=n_exp,
                      n_expert_used=8, n_ff_exp=ff)
    return {x.name: x for x in t}, cfg


@pytest.fixture(scope="module")
def qwen3moe():
    return qwen3moe_30b_q4_k_m()


def test_qwen3moe_size_matches_the_synthetic_file(qwen3moe):
    tensors, _ = qwen3moe
    assert 18.5e9 < sum(t.nbytes for t in tensors.values()) < 18.6e9  # synth_gguf.py printed 18.55 GB of weights


def test_experts_leave_the_gpu_before_any_layer(qwen3moe):
    """Short of VRAM, the first layers' experts go to the host, as few as make every layer fit; the rest of each
    layer (attention, router, KV cache) stays on the GPU. Only a budget too small for that moves whole layers."""
    tensors, cfg = qwen3moe
    full = plan_placement(tensors, cfg, 4096, H100_FREE)
    assert (full.n_gpu_layers, full.cpu_expert_layers, full.cpu_expert_bytes) == (48, 0, 0)
    p = plan_placement(tensors, cfg, 4096, H100_FREE, vram_budget=8 * GiB)
    assert p.n_gpu_layers == 48 and 0 < p.cpu_expert_layers < 48 and p.total_bytes <= 8 * GiB
    fewer = plan_placement(tensors, cfg, 4096, H100_FREE, vram_budget=8 * GiB, cpu_moe=p.cpu_expert_layers - 1)
    assert fewer.n_gpu_layers < 48  # one layer's experts fewer on the host: a whole layer must leave
    experts = sum(t.nbytes for n, t in tensors.items() if n.endswith("_exps.weight")
                  and int(n.split(".")[1]) < p.cpu_expert_layers)
    assert p.cpu_expert_bytes == experts and full.weights_bytes - p.weights_bytes == experts
    head = p.summary().splitlines()[0]
    assert head == (f"placement: 48/48 layers on GPU; experts of layers 0-{p.cpu_expert_layers - 1} on CPU "
                    f"({experts / GiB:.2f} GiB): VRAM budget exhausted")
    tight = plan_placement(tensors, cfg, 4096, H100_FREE, vram_budget=2.5 * GiB)  # all but the experts: 3.4 GiB
    assert tight.cpu_expert_layers == 48 and 0 < tight.n_gpu_layers < 48
    assert "experts of layers" in tight.summary().splitlines()[0]


def test_cpu_moe_flags(qwen3moe):
    tensors, cfg = qwen3moe
    all_host = plan_placement(tensors, cfg, 4096, H100_FREE, cpu_moe=parse_cpu_moe(True, None))
    assert all_host.cpu_expert_layers == 48 and all_host.n_gpu_layers == 48
    assert all_host.summary().splitlines()[0].endswith("experts of layers 0-47 on CPU (16.35 GiB): --n-cpu-moe 48")
    some = plan_placement(tensors, cfg, 4096, H100_FREE, cpu_moe=parse_cpu_moe(False, "24"))
    assert some.cpu_expert_layers == 24 and "experts of layers 0-23 on CPU" in some.summary()
    assert plan_placement(tensors, cfg, 4096, H100_FREE, cpu_moe=0).cpu_expert_layers == 0
    assert parse_cpu_moe(False, None) == "auto"
    for args, message in (((True, "3"), "give one"), ((False, "x"), "takes a number")):
        with pytest.raises(GpuLayersError, match=message):
            parse_cpu_moe(*args)
    with pytest.raises(GpuLayersError, match="--n-cpu-moe must be 0..48"):
        plan_placement(tensors, cfg, 4096, H100_FREE, cpu_moe=49)
    llama, llama_cfg = llama3_8b_q4_k_m()  # no experts: the flag changes nothing
    assert plan_placement(llama, llama_cfg, 4096, H100_FREE, cpu_moe="all") == plan_placement(llama, llama_cfg, 4096,
                                                                                               H100_FREE)


def test_status_bar_says_where_experts_are(qwen3moe):
    from types import SimpleNamespace

    from app.tui.status_bar import placement_text
    tensors, cfg = qwen3moe
    p = plan_placement(tensors, cfg, 4096, H100_FREE, cpu_moe=24)
    assert placement_text(SimpleNamespace(placement=p)) == "GPU 48/48 layers · experts of 24 on CPU"


def qwen35moe_35b_q4_k_m() -> tuple[dict[str, TensorInfo], ModelConfig]:
    """Qwen3.5-35B-A3B's tensors as tests/synth_gguf.py writes its q4_k_m (--preset qwen35moe-35b-a3b): 40 layers,
    every 4th gated attention, the others Gated DeltaNet (16 key heads, 32 value heads of 128), 256 experts
    [512 x 2048] and a shared one of 512 in each."""
    from models.config import _hybrid_fields
    L, d, ff, n_exp, nh, nkv, hd, vocab, hk, hv, s = 40, 2048, 512, 256, 16, 2, 256, 248320, 16, 32, 128
    conv_dim = (2 * hk + hv) * s
    t = [tensor("token_embd.weight", (d, vocab), "Q4_K"), tensor("output.weight", (d, vocab), "Q6_K"),
         tensor("output_norm.weight", (d,), "F32")]
    for i in range(L):
        big = "Q6_K" if i < L // 8 or i >= 7 * L // 8 or (i - L // 8) % 3 == 2 else "Q4_K"
        p = f"blk.{i}."
        t += [tensor(p + "attn_norm.weight", (d,), "F32"), tensor(p + "post_attention_norm.weight", (d,), "F32")]
        if (i + 1) % 4:
            t += [tensor(p + "attn_qkv.weight", (d, conv_dim), "Q4_K"), tensor(p + "attn_gate.weight", (d, hv * s), "Q4_K"),
                  tensor(p + "ssm_conv1d.weight", (4, conv_dim), "F32"), tensor(p + "ssm_dt.bias", (hv,), "F32"),
                  tensor(p + "ssm_a", (hv,), "F32"), tensor(p + "ssm_beta.weight", (d, hv), "F32"),
                  tensor(p + "ssm_alpha.weight", (d, hv), "F32"), tensor(p + "ssm_norm.weight", (s,), "F32"),
                  tensor(p + "ssm_out.weight", (hv * s, d), "Q4_K")]
        else:
            t += [tensor(p + "attn_q.weight", (d, 2 * nh * hd), "Q4_K"), tensor(p + "attn_k.weight", (d, nkv * hd), "Q4_K"),
                  tensor(p + "attn_v.weight", (d, nkv * hd), big), tensor(p + "attn_output.weight", (nh * hd, d), "Q4_K"),
                  tensor(p + "attn_q_norm.weight", (hd,), "F32"), tensor(p + "attn_k_norm.weight", (hd,), "F32")]
        t += [tensor(p + "ffn_gate_inp.weight", (d, n_exp), "F32"),
              tensor(p + "ffn_gate_exps.weight", (d, ff, n_exp), "Q4_K"),
              tensor(p + "ffn_up_exps.weight", (d, ff, n_exp), "Q4_K"),
              tensor(p + "ffn_down_exps.weight", (ff, d, n_exp), big),
              tensor(p + "ffn_gate_inp_shexp.weight", (d,), "F32"), tensor(p + "ffn_gate_shexp.weight", (d, 512), "Q4_K"),
              tensor(p + "ffn_up_shexp.weight", (d, 512), "Q4_K"), tensor(p + "ffn_down_shexp.weight", (512, d), big)]
    meta = {"qwen35moe.ssm.conv_kernel": 4, "qwen35moe.ssm.state_size": s, "qwen35moe.ssm.group_count": hk,
            "qwen35moe.ssm.time_step_rank": hv, "qwen35moe.ssm.inner_size": hv * s,
            "qwen35moe.rope.dimension_sections": [11, 11, 10, 0]}
    hybrid = _hybrid_fields(lambda key, default=None: meta.get(f"qwen35moe.{key}", default), L)
    cfg = ModelConfig(arch="qwen35moe", n_layers=L, n_embd=d, n_ff=0, n_heads=nh, n_kv_heads=nkv, head_dim=hd,
                      v_head_dim=hd, n_vocab=vocab, n_ctx_train=262144, rms_eps=1e-6, rope_base=1e7, rope_dim=64,
                      rope_scale=1.0, rope_style="neox", activation="silu", qk_norm=True, n_expert=n_exp,
                      n_expert_used=8, n_ff_exp=ff, n_ff_shexp=512, **hybrid)
    return {x.name: x for x in t}, cfg


def test_qwen35moe_at_12_gib_keeps_every_layer_and_the_shared_experts_on_the_gpu():
    """Qwen3.5-35B-A3B's shapes with --vram-budget 12: the first layers' routed experts go to the host, every layer
    stays (its DeltaNet, attention and shared expert); the context is the 10 attention layers' KV cache and the 30
    DeltaNet layers' states (32 x 128 x 128 float32 and the conv's 3 x 8192 each), not 40 KV caches."""
    tensors, cfg = qwen35moe_35b_q4_k_m()
    assert 21.1e9 < sum(t.nbytes for t in tensors.values()) < 21.12e9  # synth_gguf.py printed 21.11 GB of weights
    p = plan_placement(tensors, cfg, 4096, H100_FREE, vram_budget=12 * GiB)
    assert p.n_gpu_layers == 40 and 0 < p.cpu_expert_layers < 40 and p.total_bytes <= 12 * GiB
    assert not any(n.endswith("_exps.weight") for n in tensors if "shexp" in n)  # named apart: they stay on the GPU
    states = 30 * 4 * (3 * 8192 + 32 * 128 * 128)
    assert p.kv_bytes == 10 * kv_bytes_per_layer(cfg, 4096) + states
    assert f"experts of layers 0-{p.cpu_expert_layers - 1} on CPU" in p.summary()


def test_the_mtp_block_is_set_aside_before_the_layers(llama3):
    """--spec mtp runs the MTP block (blk.{n_layers}.*) beside the GPU's layers: its weights, its KV cache and the
    model's states it keeps come off the budget first, so a budget that just holds every layer holds fewer with the
    block (a layer's weights and cache here ~250 MB, the block's ~390: two leave), where before the block ran out
    of VRAM after the load (a one-line refusal). Without mtp the block's tensors cost nothing (they are not layers
    of the forward)."""
    from inference.placement import mtp_block_bytes
    tensors, cfg = llama3
    n, d = cfg.n_layers, cfg.n_embd
    block = {name.replace("blk.31.", f"blk.{n}."): dataclasses.replace(t, name=name.replace("blk.31.", f"blk.{n}."))
             for name, t in tensors.items() if name.startswith("blk.31.")}
    block[f"blk.{n}.nextn.eh_proj.weight"] = tensor(f"blk.{n}.nextn.eh_proj.weight", (2 * d, d), "Q8_0")
    tensors = {**tensors, **block}
    cfg = dataclasses.replace(cfg, n_nextn_layers=1)
    full = plan_placement(tensors, cfg, 8192, H100_FREE)
    assert full.n_gpu_layers == n
    budget = needed(full, tensors, cfg)
    assert plan_placement(tensors, cfg, 8192, budget).n_gpu_layers == n
    with_block = plan_placement(tensors, cfg, 8192, budget, mtp=True)
    assert with_block.n_gpu_layers == n - 2
    weights = sum(t.nbytes if len(t.shape) == 2 else 4 * t.shape[0] for t in block.values())
    assert mtp_block_bytes(tensors, cfg, 8192) == weights + kv_bytes_per_layer(cfg, 8192) + 4 * 8192 * d
    assert plan_placement(tensors, cfg, 8192, budget + mtp_block_bytes(tensors, cfg, 8192), mtp=True).n_gpu_layers == n
