"""The CUDA backend's mixture of experts (backend_cuda.CUDABackend's add_moe): the router and the choice kept on the
device, then the chosen experts' FFNs in VRAM (kernels/cuda/moe.py), uploaded for a prompt chunk from host memory, or
run by the CPU from there (host_experts.py). Functions of the backend be, whose arena, q8_1 copies and weights they use.
"""
import cupy as cp
import numpy as np

from inference.placement import GROUPED_MIN_TOKENS, OFFLOAD_MIN_TOKENS
from inference.weights import ExpertFFN, QuantExperts
from kernels.cuda import moe as cuda_moe, ops as cuda_ops, prefill as cuda_prefill
from kernels.cuda.quant import FLOAT_TYPES, DeviceWeight, to_device


def add_moe(be, x: cp.ndarray, experts: ExpertFFN, norm: np.ndarray, k: int) -> cp.ndarray:
    """x + the mixture of experts on h = rms_norm(x [n, n_embd], norm) (add_routed), and the shared expert's
    output gated by sigmoid(gate_inp . h) where the layer has one (qwen35moe)."""
    out, h = add_routed(be, x, experts, norm, k)
    sh = experts.shared
    if sh is None:
        return out
    gate, up = be.matmuls((sh.gate, sh.up), h)
    y = be.matmul(sh.down, be.glu(gate, up))
    cuda_ops.add_sigmoid_scaled(out, y, be.matmul(sh.gate_inp, h), out, stream=be.stream)
    return out


def add_routed(be, x: cp.ndarray, experts: ExpertFFN, norm: np.ndarray, k: int) -> tuple:
    """(x + the routed experts' weighted sum, h) for h = rms_norm(x [n, n_embd], norm) (kernels/cuda/moe.py): the
    router's logits and the choice of k experts a token, kept on the device (choose), then the experts' FFNs
    (add_experts)."""
    h, ids, weights = choose(be, x, experts, norm, k)
    return add_experts(be, x, experts, h, ids, weights), h


def moe(be, x: cp.ndarray, experts: ExpertFFN, norm: np.ndarray, k: int) -> cp.ndarray:
    """The routed experts' weighted sum alone [n, n_embd] on rms_norm(x, norm) (gemma4's, beside its dense FFN): as
    add_routed's, added to zeros."""
    h, ids, weights = choose(be, x, experts, norm, k)
    zeros = be._empty(x.shape)
    cp.cuda.runtime.memsetAsync(zeros.data.ptr, 0, zeros.nbytes, be.stream.ptr)  # a memset node when captured
    return add_experts(be, zeros, experts, h, ids, weights)


def choose(be, x: cp.ndarray, experts: ExpertFFN, norm: np.ndarray, k: int) -> tuple:
    """(h = rms_norm(x [n, n_embd], norm), ids int32 [n, k], weights [n, k]): the router's choice of k experts a token.
    One token: the norm, router and choice in one launch. gemma4: the router reads its own norm of x (router_norm)
    and each chosen weight is scaled by its expert's output scale."""
    n = x.shape[0]
    router = be._weight(experts.router)
    router_bias = None if experts.router_bias is None else be._weight(experts.router_bias)
    ids, weights = be._empty((n, k), cp.int32), be._empty((n, k))
    if n == 1 and router.qtype.name == "F32" and x.shape[1] % 32 == 0 and \
            x.shape[1] <= cuda_moe.ROUTER_CHUNKS * 4 * 1024 and experts.router_norm is None:
        h = be._empty(x.shape)
        cuda_moe.norm_router_route(x.reshape(-1), be._weight(norm), be.cfg.rms_eps, router, h.reshape(-1),
                                   be._q8_out(h), be._empty((router.n_rows,)), ids, weights,
                                   be._route_done, bias=router_bias, stream=be.stream)
    else:
        h = be.rms_norm(x, norm)
        routed = h if experts.router_norm is None else be.rms_norm(x, experts.router_norm)
        cuda_moe.route(router_logits(be, router, routed, router_bias), ids, weights, stream=be.stream)
    if experts.down_scale is not None:
        cuda_moe.scale_weights(ids, weights, be._weight(experts.down_scale), stream=be.stream)
    return h, ids, weights


def add_experts(be, x: cp.ndarray, experts: ExpertFFN, h: cp.ndarray, ids: cp.ndarray, weights: cp.ndarray):
    """x + the chosen experts' FFNs on h, weighted. One token (decode): the chosen experts' gate, up and glu in one
    launch, then their down projections weighted, summed and added to x in one. A prompt chunk: grouped by expert
    (experts_grouped). Experts in host memory: uploaded for a long prompt chunk, else run by the CPU (host_experts)."""
    n, k = ids.shape
    if id(experts.gate) in be._dev:
        gate, up, down = (be._dev[id(m)] for m in (experts.gate, experts.up, experts.down))
    elif n >= OFFLOAD_MIN_TOKENS and not any(m.qtype.name in FLOAT_TYPES for m in (experts.gate, experts.up,
                                                                                  experts.down)):
        # this layer's experts stay on the host: up for this chunk (float experts have no GPU kernels)
        gate, up, down = upload_experts(be, experts)
    else:
        return be.host_experts.add_moe(be, x, experts, h, ids, weights)
    gate_bias, up_bias, down_bias = expert_biases(be, experts)
    if n >= GROUPED_MIN_TOKENS and cuda_moe.grouped_supported(gate, up, down):
        return experts_grouped(be, x, h, gate, up, down, ids, weights, (gate_bias, up_bias), down_bias)
    hq = be._q8(h)
    act = be._empty((n * k, gate.n_rows))
    act_q = be._empty_q8(act.size)
    if gate.qtype == up.qtype and gate.n_rows % 32 == 0:
        cuda_moe.gate_up_glu(gate, up, ids, hq, act, act_q, be.cfg.activation, (gate_bias, up_bias),
                             stream=be.stream)
    else:
        gate_up = be._empty((2, n * k, gate.n_rows))
        for i, (w, b) in enumerate(((gate, gate_bias), (up, up_bias))):
            cuda_moe.gate_up((w,), ids, hq, gate_up[i:i + 1], (b,), stream=be.stream)
        cuda_ops.glu(gate_up[0], gate_up[1], act, be.cfg.activation, xq=act_q, stream=be.stream)
    out = be._empty(x.shape)
    cuda_moe.down(down, ids, weights, act_q, out, x, down_bias, stream=be.stream)
    return out


def expert_biases(be, experts: ExpertFFN) -> tuple:
    """(gate, up, down) biases of the experts on the device (gpt-oss), or Nones."""
    return tuple(None if b is None else be._weight(b)
                 for b in (experts.gate_bias, experts.up_bias, experts.down_bias))


def router_logits(be, router: DeviceWeight, h: cp.ndarray, bias: cp.ndarray | None) -> cp.ndarray:
    """h [n, n_embd] @ router.T (+ bias): an F32 router in float32 cuBLAS for a prompt chunk (the prompt matmuls'
    fp16 tiles could flip a near-tie choice against the decode step's), else (a verify step's too) as any matrix."""
    if h.shape[0] == 1 or router.qtype.name != "F32" or be.in_step:
        return be._matmul(router, h, bias)
    logits = be._empty((h.shape[0], router.n_rows))
    be._set_cublas_stream()
    with be.stream:
        cuda_prefill.matmul_f32(router.data.view(cp.float32).reshape(router.n_rows, -1), h, logits)
    if bias is not None:
        cuda_ops.add_bias(logits, bias, stream=be.stream)
    return logits


def experts_grouped(be, x, h, gate, up, down, ids: cp.ndarray, weights: cp.ndarray, gate_up_biases: tuple,
                    down_bias: cp.ndarray | None) -> cp.ndarray:
    """The experts of a prompt chunk: its (token, slot) pairs sorted by expert on the device, the gate, up
    and glu of each pair in one grouped launch (fp16 out), its down in another, and the k rows of a token
    weighted and added to x in a third (biases: gpt-oss's, added in the grouped launches)."""
    n, k = weights.shape
    pairs = cuda_moe.sort_pairs(ids, gate.n_expert, stream=be.stream)
    act16 = be._empty((n * k, gate.n_rows), cp.float16)
    y = be._empty((n * k, down.n_rows))
    cuda_moe.gate_up_glu_grouped(gate, up, be._f16(h), k, pairs, act16, be.cfg.activation, gate_up_biases,
                                 stream=be.stream)
    cuda_moe.matmul_grouped(down, act16, 1, pairs, y, down_bias, stream=be.stream)
    out = be._empty(x.shape)
    cuda_moe.combine(x, y, weights, out, stream=be.stream)
    return out


def upload_experts(be, experts: ExpertFFN) -> tuple:
    """A host layer's expert stacks (gate, up, down) in VRAM for one prompt chunk, as llama.cpp does for weights in
    host memory: ~0.34 GB a layer of Qwen3-30B-A3B over PCIe beats the CPU multiplying 128 experts' matrices. A
    gate_up stack (gemma4) goes up whole and is split on the device."""
    def up(raw: cp.ndarray, stack: QuantExperts) -> cuda_moe.DeviceExperts:
        with be.stream:
            return cuda_moe.DeviceExperts(to_device(raw.reshape(-1, raw.shape[-1]), stack.qtype),
                                           stack.data.shape[0])
    down = up(be._upload(experts.down.data), experts.down)
    if experts.gate_up is None:
        return up(be._upload(experts.gate.data), experts.gate), up(be._upload(experts.up.data), experts.up), down
    raw, ff = be._upload(experts.gate_up.data), experts.gate.n_rows  # [n_expert, 2 ff, row bytes]: gate's rows first
    with be.stream:
        gate, up_rows = (cp.ascontiguousarray(raw[:, rows]) for rows in (slice(0, ff), slice(ff, 2 * ff)))
    return up(gate, experts.gate), up(up_rows, experts.up), down
