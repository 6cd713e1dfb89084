"""Which layers go on the GPU: everything the GPU engine keeps in VRAM is counted before anything is uploaded.

Counted, from what the CUDA kernels allocate:
- weights: quantized as in the file (kernels/cuda/quant.to_device repacks without growing them); vectors (norms)
  as float32. The output head (and output_norm) goes on the GPU whenever a layer does: the step then ends on the
  GPU, where logits are sampled, and only the hidden state crosses to the GPU and a token id comes back.
- token_embd: on the CPU (decode needs one row a token, read from the file's pages) unless every layer is on
  the GPU, where the lookup runs on the GPU so the decode graph never waits on the host. A tied output head
  is token_embd itself and is counted once, as the head.
- KV cache: float16 k [n_kv_heads, n_ctx, head_dim] and v [n_kv_heads, n_ctx, v_head_dim] per GPU layer
  (kernels/cuda/ops.kv_cache); a sliding-window layer's is a ring of its window, a prompt chunk and some slack
  (kv_ring.cache_rows) where that is shorter than the context.
- scratch: the decode step's activations, logits and attention splits, the prefill Scratch of
  kernels/cuda/prefill for PREFILL_CHUNK tokens with a tile of half the largest layer matrix, and room
  for a CPU layer's largest matrix, which prompt chunks upload to multiply on the GPU (backend_cpu.py); with
  layers on the CPU, the ring their decode steps stream the GPU's share of their rows through (gpu_share.py).
- reserve: the CUDA context and runtime allocations outside our buffers (constants below).

Layers: like llama.cpp's -ngl (llama-model.cpp: i_gpu_start = n_layer + 1 - n_gpu_layers, the output first),
the LAST layers go on the GPU, as one contiguous segment: a hybrid step runs layers 0..k-1 on the CPU, then
one GPU segment (layers k..n-1, the head, sampling), one upload of n_embd floats a token.
"""
import gc
import math
import os
import re
from dataclasses import dataclass, replace

from inference.kv_ring import cache_rows
from models.config import ModelConfig
from models.errors import UserError
from models.gguf import TensorInfo

MiB, GiB = 2**20, 2**30
# The CUDA context itself: nvidia-smi showed 527 MiB in use once CuPy created it on an H100 (2026-11-23).
# Free VRAM measured by memGetInfo already excludes it; a --vram-budget (a card's size) must include it.
CUDA_CONTEXT_BYTES = 528 * MiB
# Outside our buffers even when planning against measured free VRAM: the cuBLAS handle and workspace (68 MiB
# measured on the H100), kernel modules, CUDA graphs, and the memory pool rounding each buffer up.
RUNTIME_RESERVE_BYTES = 256 * MiB
# Prompt tokens the GPU backend takes a forward: each op costs ~30 us of Python and launch per chunk, so long
# chunks amortize it (and dequantize each weight tile once per chunk), at ~80 floats a token per 1024 of n_ff
# of activations. 1024 put llama3-8b's peak VRAM at file + KV + 14% (issue 5 allows 10%): 512 halves that part.
PREFILL_CHUNK = 512
# Longer chunks where the VRAM left once the layers are placed holds their buffers (placed at PREFILL_CHUNK, so
# a longer chunk never moves a layer or its experts off the GPU): each chunk dequantizes every weight tile once
# and a mixture's experts get 4x the pairs a tile. pp8192 on the H200 at 512 / 1024 / 2048 tokens a chunk:
# Qwen3.5-35B-A3B's shapes 7258 / 11498 / 13828 tok/s, Qwen3.5-27B's 4814 / 5604 / 6260 (2026-11-27).
PREFILL_CHUNKS_SPARE = (2048, 1024)
# The fp16 tile a prompt matmul dequantizes weight rows into (prefill_tile_elems): a whole matmuls call where
# that is at most 64 MiB, else half the largest layer matrix.
PREFILL_WHOLE_TILE_ELEMS = 1 << 25
# From this many tokens a prompt chunk runs the CPU layers on the GPU too, their weights uploaded for each call
# and their KV cache lent for the chunk (backend_cuda: lent layers), as llama.cpp runs a host weight's matmul on
# the GPU from 32 tokens; host experts are uploaded from this many too. Below it the CPU runs them.
OFFLOAD_MIN_TOKENS = 32
# From this many tokens a prompt chunk's experts run grouped by expert (kernels/cuda/moe_mm.cu: each chosen expert's
# weight tiles dequantized once per 64 of its pairs, tensor cores); below, per (token, slot) pair with the decode
# kernels. Qwen3-30B-A3B's layer on the H100 (kernels/bench/moe.py, us grouped / per pair): 32 tokens 603 / 300,
# 64 tokens 648 / 597, 512 tokens 709 / 4567.
GROUPED_MIN_TOKENS = 64
# The most of a CPU layer's matrix rows the GPU may multiply over PCIe (inference/gpu_share.py): the CPU keeps some
MAX_GPU_SHARE = 0.9
# The share by default: the fastest measured on the H100 machine at 16 and 24 of llama3-8b's 32 layers on the GPU.
# Session 6 found 0.6 (0.44-0.82 tried); in session 15, with the cores' matvecs ~1.2x faster from DRAM (chunks
# claimed, Q4_K/Q6_K prefetched), 0.4 ran 16 layers 1.18x faster than 0.6 (and so did the old kernels: 35.1
# against 31.6 tok/s), 24 layers level; in the next lease 0.4 beat 0.3 and 0.5 at 24 layers and was level with
# 0.5 at 16 (BENCHMARKS.md). Rates measured at load were no guide: the cores' pass over
# the CPU layers' matrices read 12-15 GB/s in 3 of 4 loads against the ~60 GB/s of their decode steps, and even the
# good reading (69 GB/s, PCIe 54) gave 0.44, no faster than the CPU alone (session 6).
DEFAULT_GPU_SHARE = 0.4
# The VRAM ring those rows stream through, in largest layer matrices: twice the largest call (gate and up) at the
# most share, and on llama3-8b (192 MB) ~3.5 ms of copies ahead at 55 GB/s, about what its 16 GPU layers take
SHARE_RING_MATRICES = 4
ATTN_SPLITS_MAX = 64  # kernels/cuda/ops.decode_scratch: at most 64 key splits per head
SAMPLE_CHUNK, SAMPLE_K_MAX = 4096, 64  # kernels/cuda/ops.sample_scratch


class GpuLayersError(UserError, ValueError):
    pass


class VramBudgetError(UserError, ValueError):
    pass


class GpuShareError(UserError, ValueError):
    pass


@dataclass(frozen=True)
class Placement:
    layers: tuple[str, ...]  # "gpu" or "cpu" for each layer; the GPU ones are the last
    output: str  # "gpu" or "cpu": output_norm, the output head, logits and sampling
    embedding: str  # "gpu" or "cpu": where the token embedding lookup runs
    weights_bytes: int  # VRAM for GPU layers' weights, the output head, token_embd when on the GPU
    kv_bytes: int  # VRAM for the KV cache of the GPU layers
    scratch_bytes: int  # VRAM for decode and prefill buffers
    reserve_bytes: int  # VRAM held outside our buffers (CUDA context, cuBLAS, modules)
    budget_bytes: int  # the VRAM it planned against: free VRAM, or --vram-budget
    n_ctx: int
    reason: str  # why layers (or experts) are on the CPU ("" when none are)
    cpu_expert_layers: int = 0  # the experts of layers 0 .. this - 1 stay on the CPU, the rest of those layers not
    cpu_expert_bytes: int = 0  # what those experts of GPU layers would take in VRAM
    prefill_chunk: int = PREFILL_CHUNK  # prompt tokens the GPU backend takes a forward (scratch counts them)

    @property
    def n_gpu_layers(self) -> int:
        return self.layers.count("gpu")

    @property
    def first_gpu_layer(self) -> int:
        return len(self.layers) - self.n_gpu_layers

    @property
    def total_bytes(self) -> int:
        return self.weights_bytes + self.kv_bytes + self.scratch_bytes + self.reserve_bytes

    def summary(self) -> str:
        """A few lines for run --verbose, info --plan and the TUI status."""
        n, k = len(self.layers), self.n_gpu_layers
        head = f"placement: {k}/{n} layers on GPU"
        if k == 0:
            return f"{head}: {self.reason}, everything on the CPU"
        if k < n:
            cpu = "layer 0" if self.first_gpu_layer == 1 else f"layers 0-{self.first_gpu_layer - 1}"
            head += f", {cpu} on CPU: {self.reason}"
        if self.cpu_expert_layers > self.first_gpu_layer:  # of GPU layers: the CPU ones have all on the CPU
            first, last = self.first_gpu_layer, self.cpu_expert_layers - 1
            layers = f"layer {first}" if first == last else f"layers {first}-{last}"
            head += f"; experts of {layers} on CPU ({_gib(self.cpu_expert_bytes)}): {self.reason}"
        gpu = f"layer {n - 1}" if k == 1 else f"layers {self.first_gpu_layer}-{n - 1}"
        vram = (f"  VRAM {_gib(self.total_bytes)} of {_gib(self.budget_bytes)} budget: weights "
                f"{_gib(self.weights_bytes)} ({gpu} + output head), KV cache {_gib(self.kv_bytes)} "
                f"(ctx {self.n_ctx}, f16), scratch {_gib(self.scratch_bytes)} (prompt chunks of {self.prefill_chunk} "
                f"tokens), CUDA reserve {_gib(self.reserve_bytes)}")
        where = ("  token embeddings and output head on GPU" if self.embedding == "gpu" else
                 "  token embeddings on CPU (one row a token), output head on GPU")
        return "\n".join((head, vram, where))


def all_on_cpu(n_layers: int, n_ctx: int, reason: str) -> Placement:
    return Placement(("cpu",) * n_layers, "cpu", "cpu", 0, 0, 0, 0, 0, n_ctx, reason)


def _gib(n: int) -> str:
    return f"{n / GiB:.2f} GiB"


def _vram_bytes(t: TensorInfo) -> int:
    return t.n_elems * 4 if len(t.shape) == 1 else t.nbytes  # vectors are uploaded as float32


def layer_weight_bytes(tensors: dict[str, TensorInfo], n_layers: int) -> list[int]:
    """VRAM of each layer's weights (blk.{i}.*; the multi-token-prediction blocks after them are not loaded)."""
    sizes = [0] * n_layers
    for name, t in tensors.items():
        if name.startswith("blk.") and int(name.split(".")[1]) < n_layers:
            sizes[int(name.split(".")[1])] += _vram_bytes(t)
    return sizes


def kv_bytes_per_layer(cfg: ModelConfig, rows: int, layer: int = 0) -> int:
    """The float16 k and v of an attention layer's cache of rows positions, of its own heads (gemma4's sliding and
    global layers differ; its KV-shared layers read an earlier layer's: none)."""
    if not cfg.has_kv(layer):
        return 0
    _, kv_heads, head_dim, v_head_dim = cfg.layer_heads(layer)
    return 2 * kv_heads * rows * (head_dim + v_head_dim)


def mtp_block_bytes(tensors: dict[str, TensorInfo], cfg: ModelConfig, n_ctx: int) -> int:
    """VRAM of the MTP block (blk.{n_layers}.*) that --spec mtp runs beside the model's GPU layers (mtp.py): its
    weights, its attention's KV cache (heads as the model's attention layers') and the model's states it keeps
    (float32, a row a position). Its scratch is the model's."""
    n = cfg.n_layers
    weights = sum(_vram_bytes(t) for name, t in tensors.items() if name.startswith(f"blk.{n}."))
    return weights + kv_bytes_per_layer(cfg, n_ctx, cfg.attention_layers[-1]) + 4 * n_ctx * cfg.n_embd


def context_bytes(cfg: ModelConfig, n_ctx: int, layers: range, chunk: int) -> int:
    """VRAM of these layers' context with prompt chunks of chunk tokens: an attention layer's KV cache (a sliding
    layer's ring), a recurrent layer's float32 conv and delta states (the same at any context length)."""
    state = 4 * ((cfg.ssm_conv_kernel - 1) * cfg.ssm_conv_dim + cfg.ssm_v_heads * cfg.ssm_state ** 2)
    return sum(state if cfg.is_recurrent(i) else kv_bytes_per_layer(cfg, cache_rows(cfg, n_ctx, i, chunk), i)
               for i in layers)


def share_ring_bytes(largest_matrix_bytes: int) -> int:
    """VRAM of the ring the GPU's share of the CPU layers' rows streams through (gpu_share.py)."""
    return SHARE_RING_MATRICES * largest_matrix_bytes


def prefill_tile_elems(cfg: ModelConfig, largest: int) -> int:
    """Elements of the fp16 tile of the prompt matmuls (cuda_prefill.Scratch.w16), largest the elements of the
    largest layer matrix. Each tile costs a dequantize launch and a cuBLAS call of ~25 us of Python a chunk: a
    small model's prompt is host-bound, so it gets a tile that holds its largest call (gate and up, or q, k and
    v: one tile a call, 64 MiB for llama-1b); a larger one half its largest matrix (two tiles for it rather
    than one: 117 MB less VRAM on llama3-8b)."""
    call = max(2 * cfg.n_ff, (cfg.n_heads + 2 * cfg.n_kv_heads) * cfg.head_dim) * cfg.n_embd
    return call if call <= PREFILL_WHOLE_TILE_ELEMS else largest // 2


def scratch_bytes(tensors: dict[str, TensorInfo], cfg: ModelConfig, chunk: int = PREFILL_CHUNK) -> int:
    """Decode and prefill buffers of the GPU engine (one set serves every layer: they run in turn), prompt chunks
    of chunk tokens."""
    q_dim, kv_dim = cfg.n_heads * cfg.head_dim, cfg.n_kv_heads * (cfg.head_dim + cfg.v_head_dim)
    attn_dim = cfg.n_heads * cfg.v_head_dim
    experts = cfg.n_expert + 2 * cfg.n_expert_used + 3 * cfg.n_expert_used * cfg.n_ff_exp  # logits, choice, ffn
    token_floats = 3 * cfg.n_embd + q_dim + kv_dim + attn_dim + 3 * cfg.n_ff + experts  # x, residual, norm; q, k, v; ffn
    token_floats += (q_dim if cfg.attn_output_gate else 0) + 3 * cfg.n_ff_shexp  # q's gate; the shared expert
    token_floats += 3 * cfg.ssm_conv_dim + 3 * cfg.ssm_v_heads * cfg.ssm_state  # DeltaNet: qkv, conv out; z, out
    max_cols = max(cfg.n_embd, cfg.n_ff, attn_dim, cfg.n_expert_used * cfg.n_ff_exp)  # the widest matmul input
    q8_bytes = max_cols * (1 + 8 / 32)  # q8_1: a byte a value + float32 (d, s) a block of 32
    decode = (4 * (token_floats + cfg.n_vocab) + q8_bytes
              + 4 * cfg.n_heads * ATTN_SPLITS_MAX * (cfg.head_dim + 4)  # attention splits (attention.cu: PART_EXTRA),
              * len({cfg.layer_heads(i)[:3] for i in cfg.attention_layers})  # a set a kind of heads (gemma4)
              + 8 * math.ceil(cfg.n_vocab / SAMPLE_CHUNK) * SAMPLE_K_MAX)  # sampler candidates
    matrices = [t for name, t in tensors.items() if name.startswith("blk.") and len(t.shape) == 2]
    largest, largest_bytes = max(t.n_elems for t in matrices), max(t.nbytes for t in matrices)
    prefill = (4 * chunk * token_floats  # float32 activations of a chunk
               + 2 * chunk * max_cols + chunk * q8_bytes  # Scratch.x16, Scratch.xq
               + 2 * prefill_tile_elems(cfg, largest)  # Scratch.w16: the fp16 tile
               + 2 * largest_bytes)  # a CPU layer's matrix uploaded for a prompt chunk, as read and repacked
    if cfg.n_expert:  # a chunk's pairs grouped by expert: fp16 act and float32 y a pair (and the per-pair path's
        pairs = chunk * cfg.n_expert_used  # float32 act and its q8_1: no more than these)
        prefill += pairs * (4 * cfg.n_embd + 2 * cfg.n_ff_exp)
    return int(decode + prefill)


def holds_kv_sources(cfg: ModelConfig, k: int) -> bool:
    """Whether the last k layers hold every layer whose K/V cache they read (gemma4's KV-shared layers read an
    earlier layer's: the GPU's caches are its own, so a split may not fall between them)."""
    return all(cfg.kv_source(i) >= cfg.n_layers - k for i in range(cfg.n_layers - k, cfg.n_layers))


def plan_placement(tensors: dict[str, TensorInfo], cfg: ModelConfig, n_ctx: int, free_vram: int,
                   gpu_layers: int | str = "auto", vram_budget: int | None = None,
                   cpu_moe: int | str = "auto", mtp: bool = False) -> Placement:
    """Decide which layers run on the GPU. gpu_layers: "auto" (as many of the last layers as fit) or a count
    0..n_layers (0: all on the CPU). vram_budget: plan as on a card of this many bytes (at most what is free).
    cpu_moe (a model with experts): how many of the first layers keep their experts on the CPU while the rest of
    them (attention, router, norms, KV cache) runs on the GPU, as llama.cpp's --n-cpu-moe ("all": every layer's);
    "auto": none if all fits, else as few as make every layer (or gpu_layers of them) fit; only past all of them
    do layers move. mtp: the MTP block runs beside the GPU's layers (--spec mtp): its VRAM is set aside first."""
    n = cfg.n_layers
    cpu_moe = n if cpu_moe == "all" else cpu_moe
    if gpu_layers != "auto" and not (isinstance(gpu_layers, int) and 0 <= gpu_layers <= n):
        raise GpuLayersError(f"--gpu-layers must be 'auto' or 0..{n} (the model has {n} layers), got {gpu_layers}")
    if gpu_layers != "auto" and gpu_layers and not holds_kv_sources(cfg, gpu_layers):
        least = next(k for k in range(1, n + 1) if holds_kv_sources(cfg, k))
        raise GpuLayersError(f"--gpu-layers {gpu_layers} would part the last {cfg.kv_shared_layers} layers from the "
                             f"layers whose K/V they read: 0 or {least}..{n}")
    if cpu_moe != "auto" and not (isinstance(cpu_moe, int) and 0 <= cpu_moe <= n):
        raise GpuLayersError(f"--n-cpu-moe must be 0..{n} (the model has {n} layers), got {cpu_moe}")
    if vram_budget is None:
        budget, reserve = free_vram, RUNTIME_RESERVE_BYTES
    else:
        budget, reserve = min(vram_budget, free_vram + CUDA_CONTEXT_BYTES), RUNTIME_RESERVE_BYTES + CUDA_CONTEXT_BYTES
    reserve += mtp_block_bytes(tensors, cfg, n_ctx) if mtp else 0
    if gpu_layers == 0:
        return replace(all_on_cpu(n, n_ctx, "--gpu-layers 0"), budget_bytes=budget)
    experts = 0 if not cfg.n_expert else cpu_moe if cpu_moe != "auto" else None  # None: to choose

    def need(k: int, experts_on_cpu: int) -> int:
        return split(tensors, cfg, n_ctx, k, budget, reserve, "", experts_on_cpu).total_bytes

    if experts is None:  # the experts of as few first layers as make the layers wanted fit
        want = n if gpu_layers == "auto" else gpu_layers
        experts = next((e for e in range(n + 1) if need(want, e) <= budget), n)
        if need(want, experts) <= budget:
            return split(tensors, cfg, n_ctx, want, budget, reserve, "VRAM budget exhausted" if experts else
                         f"--gpu-layers {gpu_layers}", experts)
    reason_experts = f"--n-cpu-moe {cpu_moe}" if experts and cpu_moe != "auto" else ""
    if gpu_layers == "auto" and need(n, experts) <= budget:
        return split(tensors, cfg, n_ctx, n, budget, reserve, reason_experts, experts)

    if need(1, experts) > budget:
        one = split(tensors, cfg, n_ctx, 1, budget, reserve, "", experts)
        head = one.weights_bytes - (layer_weight_bytes(tensors, n)[-1] - one.cpu_expert_bytes)
        raise VramBudgetError(
            f"VRAM budget {_gib(budget)} is too small for the GPU: the output head ({_gib(head)}), one layer "
            f"({_gib(one.weights_bytes - head)} weights + {_gib(one.kv_bytes)} KV cache at ctx {n_ctx}), scratch "
            f"({_gib(one.scratch_bytes)}) and the CUDA reserve ({_gib(reserve)}) need {_gib(need(1, experts))}; use "
            "--gpu-layers 0 (CPU), a smaller --ctx or model")
    fits = max((k for k in range(1, n + 1) if need(k, experts) <= budget and holds_kv_sources(cfg, k)), default=0)
    if fits == 0:  # gemma4: a layer fits, not the KV-shared ones with those they read
        return replace(all_on_cpu(n, n_ctx, "the KV-shared layers and those they read do not fit the VRAM budget"),
                       budget_bytes=budget)
    if gpu_layers == "auto":
        return split(tensors, cfg, n_ctx, fits, budget, reserve, "VRAM budget exhausted", experts)
    if need(gpu_layers, experts) > budget:
        raise VramBudgetError(f"--gpu-layers {gpu_layers} needs {_gib(need(gpu_layers, experts))} of VRAM at ctx "
                              f"{n_ctx}, the budget is {_gib(budget)}: at most {fits} layers fit")
    return split(tensors, cfg, n_ctx, gpu_layers, budget, reserve,
                 ", ".join(filter(None, (f"--gpu-layers {gpu_layers}", reason_experts))), experts)


def split(tensors: dict[str, TensorInfo], cfg: ModelConfig, n_ctx: int, k: int, budget: int, reserve: int,
          reason: str, cpu_experts: int = 0, longer_chunks: bool = True) -> Placement:
    """The last k (>= 1) layers on the GPU, counted, the experts of layers 0 .. cpu_experts - 1 on the CPU;
    reason: why layers or experts are on the CPU (kept only when some are). Counted with prompt chunks of
    PREFILL_CHUNK tokens, or where that fits the budget and longer_chunks, the longest of PREFILL_CHUNKS_SPARE
    that fits too and is no longer than the context."""
    n = cfg.n_layers
    tied = "output.weight" not in tensors
    head = sum(_vram_bytes(tensors[name]) for name in ("token_embd.weight" if tied else "output.weight",
                                                       "output_norm.weight", "rope_freqs.weight") if name in tensors)
    embd = 0 if tied else _vram_bytes(tensors["token_embd.weight"])  # only when every layer is on the GPU
    embd += sum(_vram_bytes(t) for name, t in tensors.items() if name.startswith("per_layer_"))  # gemma4 E2B/E4B's
    by_layer, stack = [0] * n, 0  # bytes of each GPU layer's experts that stay on the host; their largest stack
    for name, t in tensors.items():
        if name.endswith("_exps.weight") and n - k <= int(name.split(".")[1]) < cpu_experts:
            by_layer[int(name.split(".")[1])] += t.nbytes
            stack = max(stack, t.nbytes)
    host_experts = sum(by_layer)
    weights = head + sum(layer_weight_bytes(tensors, n)[n - k:]) + (embd if k == n else 0) - host_experts
    largest = max(t.nbytes for name, t in tensors.items() if name.startswith("blk.") and len(t.shape) == 2)
    # a prompt chunk uploads a host layer's experts (backend_cuda._upload_experts), one stack repacked at a time:
    # so a layer's experts on the host free VRAM only once more than one layer's are
    some_on_cpu = k < n or host_experts > 0

    def counted(chunk: int) -> Placement:
        scratch = (scratch_bytes(tensors, cfg, chunk) + (share_ring_bytes(largest) if k < n else 0) + max(by_layer)
                   + stack)
        return Placement(("cpu",) * (n - k) + ("gpu",) * k, "gpu", "gpu" if k == n else "cpu", weights,
                         context_bytes(cfg, n_ctx, range(n - k, n), chunk), scratch, reserve, budget, n_ctx,
                         reason if some_on_cpu else "", cpu_experts if host_experts else 0, host_experts, chunk)

    placed = counted(PREFILL_CHUNK)
    if longer_chunks and placed.total_bytes <= budget:
        longer = (counted(c) for c in PREFILL_CHUNKS_SPARE if c <= n_ctx)  # no chunk longer than the context
        return next((p for p in longer if p.total_bytes <= budget), placed)
    return placed


def parse_gpu_layers(text: str) -> int | str:
    """'auto' or a layer count, as --gpu-layers takes it (the range is checked against the model by plan_placement)."""
    if text.strip().lower() == "auto":
        return "auto"
    if not text.strip().isdigit():
        raise GpuLayersError(f"--gpu-layers takes 'auto' or a number of layers, got '{text}'")
    return int(text)


def cap_gpu_share(share: float, matrix_bytes: int, available: int) -> float:
    """share lowered, if need be, so that the GPU's rows of the CPU layers (share of their matrix_bytes, pinned:
    never paged out) take at most half the host memory available: the CPU's rows are file pages it reads every
    token, and pinning them out of the page cache would make tokens wait on the disk."""
    return min(share, available / 2 / matrix_bytes) if matrix_bytes > 0 else share


def host_memory_available() -> int:
    """Bytes the host can give without swapping (Linux's MemAvailable: free memory and reclaimable caches)."""
    try:
        with open("/proc/meminfo") as f:
            return next(int(line.split()[1]) * 1024 for line in f if line.startswith("MemAvailable:"))
    except (OSError, StopIteration):
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")


def parse_cpu_moe(cpu_moe: bool, n_cpu_moe: str | None) -> int | str:
    """--cpu-moe (every layer's experts on the CPU) and --n-cpu-moe N -> plan_placement's cpu_moe ("all", N or,
    with neither, "auto")."""
    if cpu_moe and n_cpu_moe is not None:
        raise GpuLayersError("--cpu-moe and --n-cpu-moe say the same thing: give one")
    if cpu_moe:
        return "all"
    if n_cpu_moe is None:
        return "auto"
    if not n_cpu_moe.strip().isdigit():
        raise GpuLayersError(f"--n-cpu-moe takes a number of layers, got '{n_cpu_moe}'")
    return int(n_cpu_moe)


def parse_gpu_share(text: str) -> float:
    """A fraction 0..MAX_GPU_SHARE, as --gpu-share takes it."""
    try:
        share = float(text)
    except ValueError:
        share = -1.0
    if not 0 <= share <= MAX_GPU_SHARE:
        raise GpuShareError(f"--gpu-share takes a fraction from 0 to {MAX_GPU_SHARE}, got '{text}'")
    return share


def parse_vram_budget(text: str) -> int:
    """'6', '6GB', '6.5GiB', '512MiB' -> bytes. GB and MB are read as GiB and MiB, as cards are sold."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*(g|gb|gib|m|mb|mib)?\s*", text, re.IGNORECASE)
    if m is None or float(m.group(1)) <= 0:
        raise VramBudgetError(f"--vram-budget takes a size like 6, 6GB, 6.5GiB or 512MiB, got '{text}'")
    unit = MiB if (m.group(2) or "g").lower().startswith("m") else GiB
    return int(float(m.group(1)) * unit)


def free_vram() -> int | None:
    """Free bytes on the current CUDA device for a new engine, or None without CUDA (no CuPy, driver or device).
    An engine dropped but not yet collected (a chat switching models: its backends hold reference cycles) and
    the blocks CuPy's pool keeps cached would otherwise count as taken: both are released first, and the pinned
    host blocks of its GPU share (gpu_share.py) go back to the system."""
    try:
        import cupy
        gc.collect()
        cupy.get_default_memory_pool().free_all_blocks()
        cupy.get_default_pinned_memory_pool().free_all_blocks()
        return cupy.cuda.runtime.memGetInfo()[0]
    except (ImportError, RuntimeError):  # CUDARuntimeError is a RuntimeError
        return None
