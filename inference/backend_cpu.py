"""The op set of the forward pass on the CPU: numpy arrays, quantized matmuls from kernels/cpu/quant."""
import mmap

import numpy as np

from inference.kv_ring import cache_rows, ring_positions
from inference.weights import DeltaNetWeights, ExpertFFN, ModelWeights, QuantMatrix
from kernels.cpu import attention as cpu_attention, deltanet as cpu_deltanet, ops as cpu_ops, quant as cpu_quant
from kernels.cpu.quant import (OneToken, dequantize_rows, quantized_matmul, quantized_matmuls,
                               quantized_matvecs_own_rows)
from kernels.cpu.repack import LAYOUTS, Repacked, repack
from models.config import ModelConfig


def lazy_zeros(shape: tuple[int, ...]) -> np.ndarray:
    """float32 zeros whose pages are mapped on first touch, so the cache costs memory only as the context fills.

    An anonymous mmap rather than np.zeros: numpy asks for huge pages on large arrays, and faulting in a
    2 MiB page per head on the first write cost ~70 ms per layer on our test machine.
    """
    n = int(np.prod(shape))
    return np.frombuffer(mmap.mmap(-1, max(1, n) * 4), np.float32)[:n].reshape(shape)


def moe_experts(experts: ExpertFFN, h: np.ndarray, ids: np.ndarray, weights: np.ndarray, activation: str,
                out: np.ndarray | None = None) -> np.ndarray:
    """The weighted sum [n, n_embd] of the chosen experts' FFNs on h [n, n_embd]; ids, weights [n, k] (the
    router's choice), written into out (float32 [n, n_embd]) when given. Only the chosen experts are read; of
    several tokens, grouped by expert, so each chosen expert's matrices are read once a call."""
    gate, up, down = experts.gate, experts.up, experts.down
    # the types with int8 kernels as cpu_quant holds them now, what its expert checks and quantized_matmuls read:
    # the GPU tests' float32 reference (gpu_compare.float_activations) empties INT8_IDS to keep x in float32 (three
    # calls, not all() of a generator: 0.8 us less a call on the 2-core VM)
    int8 = cpu_quant.takes_int8
    if len(h) == 1 and int8(gate.qtype.id) and int8(up.qtype.id) and int8(down.qtype.id):
        # one token: its experts' gate, up and GLU, their downs and the weighted sum in one kernel call (one parallel
        # region), written straight into out; gpt-oss's biases and GLU too, gemma4's gate_up stack read in place
        return experts.one_token.ffn(h, ids[0], weights[0], activation, out)
    y = _moe_experts_listed(experts, h, ids, weights, activation)
    if out is None:
        return y
    out[:] = y
    return out


def _moe_experts_listed(experts: ExpertFFN, h: np.ndarray, ids: np.ndarray, weights: np.ndarray,
                        activation: str) -> np.ndarray:
    """moe_experts where its one-token kernel does not apply: a type with no int8 kernel, or several tokens. Biases
    (gpt-oss) are added to each expert's gate, up and down outputs."""
    bias = experts.has_biases
    if len(h) == 1:  # one token: the chosen experts' matrices as a list
        chosen = [(experts.gate.expert(e), experts.up.expert(e), experts.down.expert(e)) for e in ids[0]]
        gate_up = quantized_matmuls([m.data for g, u, _ in chosen for m in (g, u)],
                                    [m.qtype for g, u, _ in chosen for m in (g, u)], h)
        gate, up = np.concatenate(gate_up[0::2]), np.concatenate(gate_up[1::2])  # [k, n_ff]
        if bias:
            gate, up = gate + experts.gate_bias[ids[0]], up + experts.up_bias[ids[0]]
        act = cpu_ops.glu(gate, up, activation)
        ys = quantized_matvecs_own_rows([d.data for _, _, d in chosen], [d.qtype for _, _, d in chosen], act)
        if bias:
            ys = [y + experts.down_bias[e] for y, e in zip(ys, ids[0])]
        return sum(w * y for w, y in zip(weights[0], ys))
    out = np.zeros_like(h)
    for e in np.unique(ids):
        rows, slots = np.nonzero(ids == e)  # a token picks an expert at most once: rows are distinct
        gate, up, down = experts.gate.expert(e), experts.up.expert(e), experts.down.expert(e)
        g, u = quantized_matmuls([gate.data, up.data], [gate.qtype, up.qtype], np.ascontiguousarray(h[rows]))
        if bias:
            g, u = g + experts.gate_bias[e], u + experts.up_bias[e]
        y = quantized_matmul(down.data, down.qtype, cpu_ops.glu(g, u, activation))
        if bias:
            y += experts.down_bias[e]
        out[rows] += y * weights[rows, slots, None]
    return out


def rope_speeds(cfg: ModelConfig, rope: tuple[float, float, int, bool], rope_freqs: np.ndarray | None) -> np.ndarray:
    """The rotation speed of each pair of rotated dims, float64 [rope_dim // 2], for a layer's rope (ModelConfig's
    layer_rope: base, scale, rotated dims, whether rope_freqs apply): YaRN's blend of scaled and unscaled speeds where
    the model has it (gpt-oss; there are no rope_freqs then), else the speeds divided by rope_freqs (llama3; gemma4's
    global layers), times scale. Both backends' rope (cos and sin times cfg.rope_mscale)."""
    base, scale, dim, with_freqs = rope
    if cfg.rope_yarn_orig_ctx:
        return cpu_ops.yarn_inv_freq(dim, base, scale, cfg.rope_yarn_orig_ctx)
    return cpu_ops.rope_inv_freq(dim, base, rope_freqs if with_freqs else None) * scale


def repacked_matrices(weights: ModelWeights, layers: range) -> dict[int, Repacked]:
    """id(matrix) -> the matrix repacked eight rows at a time (kernels/cpu/repack), for the layers' matrices of the
    types that layout has (Q4_0, Q4_1, Q5_0, Q5_1; experts are left as they are)."""
    out = {}
    for i in layers:
        lw = weights.layers[i]
        for m in (*lw.qkv, lw.attn_output, lw.ffn_gate, lw.ffn_up, lw.ffn_down):
            if m is not None and m.qtype.id in LAYOUTS:
                out[id(m)] = repack(m.data, m.qtype.id)
    return out


# what matmuls returns in up's place when it gave gate's GLU itself (a decode step's gate and up, see matmuls): glu
# then passes gate through
GLU_DONE = object()


def _read_only(a: np.ndarray) -> np.ndarray:
    a.flags.writeable = False  # as the file's mmap: the kernels compile once for read-only weights
    return a


class CPUBackend:
    """Holds the KV cache of its layers and the input buffers (tokens, start position) the forward pass reads.

    layers: the layers it runs (default all); with the GPU holding the rest, they are the first ones.
    with_gpu: a GPU backend runs the other layers, and prompt chunks of placement.OFFLOAD_MIN_TOKENS or more
    run these layers too (backend_cuda: lent layers); this backend then runs their decode steps and short chunks.
    share: a gpu_share.GpuShare, set after construction, through which the GPU multiplies the first rows of
    this backend's matrices for one token while the CPU does the rest (None: the CPU does all)."""

    prefill_chunk = 256  # prompt tokens a forward: bounds the attention scores to [heads, 256, ctx]
    _repacked: dict[int, Repacked] = {}  # set in __init__; empty here for a backend made without it (tests' op checks)

    def __init__(self, cfg: ModelConfig, weights: ModelWeights, n_ctx: int, layers: range | None = None,
                 with_gpu: bool = False, head: tuple | None = None):
        self.cfg = cfg
        self.n_ctx = n_ctx
        self.layers = range(cfg.n_layers) if layers is None else layers
        self.share = None
        # the attention layers' caches, each of its layer's heads (gemma4's KV-shared layers have none: they read
        # their kv_source's)
        attention = [i for i in self.layers if not cfg.is_recurrent(i) and cfg.has_kv(i)]
        # a sliding-window layer's cache is a ring (kv_ring.py) unless a GPU reads these caches (lent layers)
        self.slots = {i: n_ctx if with_gpu else cache_rows(cfg, n_ctx, i, self.prefill_chunk) for i in attention}
        self.rings = ring_positions(self.slots, n_ctx, cfg.sliding_window)  # which position each ring row holds
        self.k_cache = {i: lazy_zeros((cfg.layer_heads(i)[1], self.slots[i], cfg.layer_heads(i)[2])) for i in attention}
        self.v_cache = {i: lazy_zeros((cfg.layer_heads(i)[1], self.slots[i], cfg.layer_heads(i)[3])) for i in attention}
        # the recurrent layers' states (kernels/cpu/deltanet): the context of those layers, at state_pos tokens
        recurrent = [i for i in self.layers if cfg.is_recurrent(i)]
        self.conv_state = {i: np.zeros((cfg.ssm_conv_kernel - 1, cfg.ssm_conv_dim), np.float32) for i in recurrent}
        self.delta_state = {i: np.zeros((cfg.ssm_v_heads, cfg.ssm_state, cfg.ssm_state), np.float32) for i in recurrent}
        self.state_pos = {i: 0 for i in recurrent}
        self._conv_taps = {i: cpu_deltanet.conv_taps(weights.layers[i].delta_net.conv) for i in recurrent}
        self.tokens = np.zeros(0, np.int32)  # [n] the tokens of this step
        self.pos = 0  # position of tokens[0]
        self._snapshots = False  # set_input's: the next forward keeps the states after each token (a verify step)
        # layer -> (conv [n, K - 1, C], delta [n, Hv, S, S]): the snapshot rows verify steps write, kept from one to the
        # next (grown to the longest): a fresh 1 MB copy of a 0.8B's delta state a token and layer, allocated and
        # freed each step, took a 4-token verify from 38 to 69 ms on the 2-core VM (page faults and munmaps)
        self._snapshot_rows = {}
        self._inv_freq = {}  # a layer's rope (ModelConfig.layer_rope) -> [rope_dim // 2]
        self._cos_sin = {}  # a layer's rope -> ((pos, n), (cos, sin) [n, rope_dim // 2]) of the last positions
        self._rope_freqs = weights.rope_freqs
        # the output head's bytes copied to anonymous memory when this backend runs the head (no GPU part): the
        # largest matrix, read whole every token (Gemma 3 270M: 178 MB, ~40% of a token), read ~13% faster from
        # the copy than from the file's mmap on the 2-core machine (numpy puts it on huge pages). Made here, at
        # load (~0.1-0.5 s for Gemma's), not in the first reply. head: another backend's copy (the MTP block's
        # backend shares the model's)
        self._head = head or ((weights.output.data, _read_only(np.array(weights.output.data))) if not with_gpu
                              else None)
        # the layers' 4-bit 32-value block matrices repacked when no GPU reads them in the file's layout: their
        # matvecs read 8 rows a vector, ~2x faster a core (Q4_1 576 x 1536: 13.6 -> 30.5 GB/s on one)
        self._repacked = repacked_matrices(weights, self.layers) if not with_gpu else {}
        # the layers' (gate, up) pairs by id: their decode step's matmuls give the GLU at once (see matmuls)
        self._one_token_plans = {}  # see _one_token
        lws = [weights.layers[i] for i in self.layers]
        shared = [lw.experts.shared for lw in lws if lw.experts is not None and lw.experts.shared is not None]
        self._glu_pairs = {(id(lw.ffn_gate), id(lw.ffn_up)) for lw in lws if lw.ffn_gate is not None} | {
            (id(sh.gate), id(sh.up)) for sh in shared}

    def set_input(self, tokens: np.ndarray, pos: int, snapshots: bool = False) -> None:
        """The next forward runs tokens [n] at positions pos..pos+n-1. snapshots: its recurrent layers keep a copy
        of their states after each token (a verify step's, speculative.py), for rewind_states."""
        self.tokens = np.asarray(tokens, np.int32)
        self.pos = pos
        self._snapshots = snapshots
        if self.rings:  # the rows the forward of these tokens writes
            self.rings.wrote(pos, len(tokens))

    def to_host(self, x: np.ndarray) -> np.ndarray:
        return x

    def argmax_rows(self, logits: np.ndarray) -> np.ndarray:
        """Each row's argmax (the smallest id on ties)."""
        return np.argmax(logits, axis=-1).astype(np.int32)

    def copy(self, x: np.ndarray) -> np.ndarray:
        return x.copy()

    def rows(self, width: int) -> np.ndarray:
        """float32 [n_ctx, width], a row for each position of the context, its pages mapped as they fill
        (lazy_zeros): the MTP drafter's record of the model's states (put_rows writes them)."""
        return lazy_zeros((self.n_ctx, width))

    def put_rows(self, rows: np.ndarray, pos: int, x: np.ndarray) -> np.ndarray:
        """rows (rows()') with x [n, width] at positions pos..pos + n - 1."""
        rows[pos:pos + len(x)] = x
        return rows

    def embed(self, table: QuantMatrix, scale: float) -> np.ndarray:
        x = dequantize_rows(table.data, table.qtype, self.tokens)  # [n, n_embd]
        return x * np.float32(scale) if scale != 1.0 else x

    def rms_norm(self, x: np.ndarray, weight: np.ndarray) -> np.ndarray:
        return cpu_ops.rms_norm(x, weight, self.cfg.rms_eps)

    def matmul(self, w: QuantMatrix, x: np.ndarray, bias: np.ndarray | None = None) -> np.ndarray:
        if self.share is not None and len(x) == 1:
            y = self.share.matmuls((w,), x)[0]
        else:
            y = quantized_matmul(self._repacked.get(id(w), w.data), w.qtype, x)  # [n, n_rows]
        return y + bias if bias is not None else y

    def _one_token(self, ws: tuple[QuantMatrix, ...]) -> OneToken | None:
        """The decode step's kernel arguments for the matrices ws (cpu_quant.OneToken: checked and built once, where a
        quantized_matmuls call pays ~20 us of Python each time), made on first use and kept with ws (so their ids
        stay theirs; LayerWeights.qkv makes a new tuple each time, its matrices are the same). None where the
        one-token path does not apply: the GPU shares the rows, a type has no int8 kernel, or a float32 reference
        (tests' gpu_compare) set cpu_quant.MATVEC_MAX_TOKENS to 0."""
        if self.share is not None or cpu_quant.MATVEC_MAX_TOKENS < 1:
            return None
        plans = self._one_token_plans
        key = (id(ws[0]), len(ws))
        plan = plans.get(key)
        if plan is None or any(a is not b for a, b in zip(plan[0], ws)):
            plan = plans[key] = (tuple(ws), OneToken([self._repacked.get(id(w), w.data) for w in ws],
                                                     [w.qtype for w in ws]))
        return plan[1] if plan[1].int8 else None

    def matmuls(self, ws: tuple[QuantMatrix, ...], x: np.ndarray, biases: tuple | None = None) -> tuple:
        """The matmuls of several matrices by one x. For a few tokens, one kernel call quantizes x once and runs
        all their rows in one parallel region: a layer's decode step makes 4 of each instead of 7.
        A decode step's gate and up (a layer's ffn_gate, ffn_up, no biases, one type and shape) return (GLU of
        the two, GLU_DONE): each thread applies the GLU to the rows it made (OneToken.glu, the same floats as glu of
        the two), and glu passes it through: SmolLM2's glu call took ~22 us a layer on 2 cores, most of it one core
        reading the other's half of gate and up; a token 12.22 -> 11.93 ms (median of 8 runs, alternated)."""
        plan = self._one_token(ws) if len(x) == 1 else None
        if plan is not None:
            x = np.ascontiguousarray(x, np.float32)
            if len(ws) == 2 and biases is None and (id(ws[0]), id(ws[1])) in self._glu_pairs:
                act = plan.glu(x, self.cfg.activation)
                if act is not None:
                    return act, GLU_DONE
            ys = plan.matmuls(x)
        elif self.share is not None and len(x) == 1:
            ys = self.share.matmuls(ws, x)
        else:
            ys = quantized_matmuls([self._repacked.get(id(w), w.data) for w in ws], [w.qtype for w in ws], x)
        return tuple(y + b if b is not None else y for y, b in zip(ys, biases or (None,) * len(ws)))

    def _rope_cos_sin(self, rope: tuple, n: int) -> tuple[np.ndarray, np.ndarray]:
        """cos, sin [n, rope_dim // 2] of positions pos..pos+n-1 for a layer's rope (ModelConfig.layer_rope)."""
        key = rope
        cfg = self.cfg
        if key not in self._inv_freq:
            self._inv_freq[key] = rope_speeds(cfg, rope, self._rope_freqs)
        at, cos_sin = self._cos_sin.get(key, (None, None))
        if at != (self.pos, n):  # once a forward pass per base, not for each layer's q and k
            at = (self.pos, n)
            cos_sin = cpu_ops.rope_cos_sin(np.arange(self.pos, self.pos + n), self._inv_freq[key])
            if cfg.rope_mscale != 1.0:
                cos_sin = tuple(a * np.float32(cfg.rope_mscale) for a in cos_sin)
            self._cos_sin[key] = at, cos_sin
        return cos_sin

    def rope_kv_write(self, layer: int, q: np.ndarray, k: np.ndarray | None, v: np.ndarray | None, rope: tuple,
                      head_norms: tuple | None = None) -> np.ndarray:
        """q and k rotated for positions pos..pos+n-1 by the layer's rope (ModelConfig.layer_rope), k and v stored in
        layer's cache; returns the rotated q. k and v None: q alone (gemma4's KV-shared layers). head_norms (q_norm,
        k_norm[, v_norm]): q, k (and v: gemma4) normalized per head first (qwen3, gemma3)."""
        if head_norms is not None:
            q = self.rms_norm(q, head_norms[0])
            if k is not None:
                k = self.rms_norm(k, head_norms[1])
                if len(head_norms) > 2:
                    v = self.rms_norm(v, head_norms[2])
        cos, sin = self._rope_cos_sin(rope, len(q))
        if k is None:
            return cpu_ops.rope_rotate(q, cos, sin, self.cfg.rope_style)
        # one call: rope_rotate's arithmetic for q and k and the two cache writes (were four calls, three copies)
        return cpu_ops.rope_kv_store(q, k, v, cos, sin, self.cfg.rope_style, self.k_cache[layer],
                                     self.v_cache[layer], self.pos, self.slots[layer] < self.n_ctx)

    def attention(self, layer: int, q: np.ndarray, window: int, scale: float,
                  sinks: np.ndarray | None = None) -> np.ndarray:
        return cpu_attention.attention(q, self.k_cache[layer], self.v_cache[layer], self.pos, window, scale, sinks,
                                       self.slots[layer] < self.n_ctx)

    def can_resume(self, keep: int) -> bool:
        """Whether a prompt can go on after the first keep cached tokens: the rings still hold the window before
        position keep (later tokens overwrite it)."""
        return self.rings is None or self.rings.can_resume(keep)

    def sigmoid_mul(self, a: np.ndarray, gate: np.ndarray) -> np.ndarray:
        """a [n, d] * sigmoid(gate) (its d values in any shape): the attention output's gate (qwen35)."""
        return a / (1 + np.exp(-gate.reshape(a.shape)))

    def delta_net(self, layer: int, dn: DeltaNetWeights, qkv: np.ndarray, z: np.ndarray, alpha: np.ndarray,
                  beta: np.ndarray) -> np.ndarray:
        """The DeltaNet mixer of a recurrent layer on its projections (forward.delta_net): the causal conv, the
        delta rule and the gated norm, moving the layer's states on from pos to pos + n: [n, Hv * S]."""
        if self.pos == 0:  # a new context
            self.conv_state[layer][:] = 0
            self.delta_state[layer][:] = 0
        elif self.state_pos[layer] != self.pos:  # the engine restores a checkpoint before it rewinds
            raise RuntimeError(f"layer {layer}'s recurrent state is at token {self.state_pos[layer]}, "
                               f"not at {self.pos}")
        conv, delta = self.conv_state[layer], self.delta_state[layer]
        n, snapshots = len(qkv), None
        if self._snapshots:  # the states after each token but the last (a rewind keeps one token at least and
            # drops one at least): the conv's are its last K - 1 inputs, the delta rule's the kernel writes as it goes
            conv_rows, delta_rows = self._snapshot_buffers(layer, n - 1)
            inputs = np.concatenate([conv, qkv])
            for t in range(n - 1):
                conv_rows[t] = inputs[t + 1:t + 1 + len(conv)]
            snapshots = delta_rows[:n - 1]
        y = cpu_deltanet.conv_silu(qkv, conv, self._conv_taps[layer])
        out = cpu_deltanet.delta_rule(y, alpha, beta, dn.dt_bias, dn.a, z, dn.norm, delta, self.cfg.ssm_k_heads,
                                      self.cfg.rms_eps, snapshots)
        self.state_pos[layer] = self.pos + n
        return out

    def _snapshot_buffers(self, layer: int, n: int) -> tuple[np.ndarray, np.ndarray]:
        """The layer's snapshot rows for n tokens (made or grown here, then reused)."""
        rows = self._snapshot_rows.get(layer)
        if rows is None or len(rows[0]) < n:
            conv, delta = self.conv_state[layer], self.delta_state[layer]
            rows = self._snapshot_rows[layer] = (np.empty((n, *conv.shape), np.float32),
                                                 np.empty((n, *delta.shape), np.float32))
        return rows

    def rewind_states(self, n: int) -> None:
        """The recurrent states back to after the context's first n tokens, from the copies the last forward kept
        (set_input's snapshots; n inside that forward's tokens). Attention's cache needs nothing: its rows past n
        are written again before anything reads them (a ring's too: it holds more than the window, so a row
        written past n never held one still in the window)."""
        for i in self.state_pos:
            if self.state_pos[i] != n:
                conv_rows, delta_rows = self._snapshot_rows[i]
                conv, delta = conv_rows[n - self.pos - 1], delta_rows[n - self.pos - 1]
                self.conv_state[i][:] = conv
                self.delta_state[i][:] = delta
                self.state_pos[i] = n

    def recurrent_state(self) -> dict:
        """A copy of its recurrent layers' states, layer -> (position, conv, delta): a checkpoint of the context."""
        return {i: (self.state_pos[i], self.conv_state[i].copy(), self.delta_state[i].copy()) for i in self.state_pos}

    def restore_recurrent_state(self, saved: dict) -> None:
        """Its layers' states from a checkpoint (recurrent_state's, merged with the other segments')."""
        for i in self.state_pos:
            self.state_pos[i], conv, delta = saved[i]
            self.conv_state[i][:] = conv
            self.delta_state[i][:] = delta

    def glu(self, gate: np.ndarray, up: np.ndarray) -> np.ndarray:
        """activation(gate) * up; up GLU_DONE: gate is that already (matmuls of a decode step's gate and up)."""
        return gate if up is GLU_DONE else cpu_ops.glu(gate, up, self.cfg.activation)

    def add(self, x: np.ndarray, y: np.ndarray) -> np.ndarray:
        return x + y

    def concat(self, x: np.ndarray, y: np.ndarray) -> np.ndarray:
        """[x y]: x [n, a] and y [n, b] side by side, [n, a + b]."""
        return np.concatenate((x, y), axis=1)

    def scale(self, x: np.ndarray, s: float) -> np.ndarray:
        return x * np.float32(s)

    def add_bias(self, x: np.ndarray, bias: np.ndarray) -> np.ndarray:
        """x [n, d] + bias [d] on every row (gpt-oss's attention output bias, onto the residual)."""
        return x + bias

    def add_matmul(self, x: np.ndarray, w: QuantMatrix, a: np.ndarray, norm: np.ndarray | None = None) -> np.ndarray:
        """x + W a, W a normalized by norm first when given (sandwich norms); the GPU fuses the add, and so does a
        decode step here (the add and the norm in the matvec's call: OneToken.add_matmul)."""
        plan = self._one_token((w,)) if len(a) == 1 else None
        if plan is not None:
            return plan.add_matmul(np.ascontiguousarray(a, np.float32), np.asarray(x, np.float32), norm,
                                   self.cfg.rms_eps)
        y = self.matmul(w, a)
        return x + (self.rms_norm(y, norm) if norm is not None else y)

    def add_moe(self, x: np.ndarray, experts: ExpertFFN, norm: np.ndarray, k: int) -> np.ndarray:
        """x + moe(x, ...)."""
        return x + self.moe(x, experts, norm, k)

    def moe(self, x: np.ndarray, experts: ExpertFFN, norm: np.ndarray, k: int) -> np.ndarray:
        """The mixture of experts on h = rms_norm(x [n, n_embd], norm): each token's k chosen experts' GLU outputs,
        weighted (the router's logits biased where it has a bias: gpt-oss; the router reading its own norm of x and
        each expert's output scaled where it has them: gemma4)."""
        h = self.rms_norm(x, norm)
        routed = h if experts.router_norm is None else self.rms_norm(x, experts.router_norm)
        ids, weights = cpu_ops.route(self.matmul(experts.router, routed, experts.router_bias), k)  # [n, k] each
        if experts.down_scale is not None:  # a scale of expert e's output is one of its weight
            weights = weights * experts.down_scale[ids]
        y = moe_experts(experts, h, ids, weights, self.cfg.activation)
        sh = experts.shared
        if sh is not None:  # every token's shared expert, scaled by sigmoid(gate_inp . h) (qwen35moe)
            gate, up = self.matmuls((sh.gate, sh.up), h)
            y += self.matmul(sh.down, self.glu(gate, up)) / (1 + np.exp(-self.matmul(sh.gate_inp, h)))
        return y

    def logits(self, w: QuantMatrix, x: np.ndarray) -> np.ndarray:
        data = self._head[1] if self._head is not None and self._head[0] is w.data else w.data
        y = quantized_matmul(data, w.qtype, x)  # [n, n_vocab]
        c = self.cfg.final_softcap
        return c * np.tanh(y / c) if c > 0 else y
