"""Reference dequantization of every supported ggml type, in vectorised numpy.

This is THE reference every CPU and GPU kernel is tested against, and it is itself tested bit-exactly
against gguf-py (gguf.quants.dequantize), whose formulas follow ggml's dequantize_row_* (ggml-quants.c).

Why exact equality is a fair test for kernels too: every product here (fp16 d x integer sub-block scale x
integer quant) needs at most 23 significant bits, so it is exact in float32 whatever the order of the
multiplications. The one rounding is the final add of the min (Q4_1, Q5_1, Q2_K, Q4_K, Q5_K:
(d * sc) * q - (dmin * m)), which a fused multiply-add rounds the same way. A kernel that forms the value
from float32 products and one add or subtract is bit-identical; one that computes in fp16 or rearranges
the formula (d * sc * (q - m / sc)) is not.

Each dequantizer maps blocks to values: (n_blocks, block_bytes) uint8 -> (n_blocks, block_elems) float32.
Block layouts, from ggml-common.h (d, dmin, m: fp16 scales; q*: packed quants):
    Q4_0  d | qs[16]                    element j < 16: low nibble of qs[j]; j >= 16: high nibble of qs[j-16]
    Q4_1  d | m | qs[16]
    Q5_0  d | qh[4] | qs[16]            bit j of the little-endian u32 qh is bit 4 of element j
    Q5_1  d | m | qh[4] | qs[16]
    Q8_0  d | qs[32] (int8)
    Q2_K  scales[16] | qs[64] | d | dmin             16 sub-blocks of 16, 4-bit scale and 4-bit min each
    Q3_K  hmask[32] | qs[64] | scales[12] | d        16 sub-blocks of 16, 6-bit signed scales
    Q4_K  d | dmin | scales[12] | qs[128]            8 sub-blocks of 32, 6-bit scale and 6-bit min each
    Q5_K  d | dmin | scales[12] | qh[32] | qs[128]
    Q6_K  ql[128] | qh[64] | scales[16] (int8) | d   16 sub-blocks of 16
    MXFP4 e | qs[16]                    e8m0 scale e; element j < 16: low nibble of qs[j], else high of qs[j-16],
                                        each nibble an index into the doubled e2m1 values (KVALUES_MXFP4)
The IQ types' dequantizers are models/dequant_iq.py's.
"""
import math
from collections.abc import Callable, Sequence

import numpy as np

from models.dequant_iq import IQ_DEQUANTIZERS
from models.errors import UserError
from models.ggml_types import GGMLType, require_supported
from models.gguf import GGUFModel

# Blocks are processed in chunks of this many output values (128 KiB of float32): temporaries stay in
# cache and small enough that malloc reuses them instead of mapping fresh pages for each (at 1 MiB a chunk
# the page faults cost more than the arithmetic), and memory stays bounded on tensors of hundreds of MB.
CHUNK_ELEMS = 1 << 15


class DequantShapeError(UserError, ValueError):
    """A raw buffer that does not hold a whole tensor of the given type and shape."""


def _f16(blocks: np.ndarray, at: int) -> np.ndarray:
    """The fp16 field at byte `at` of every block, as float32: (n, 1)."""
    return blocks[:, at:at + 2].view("<f2").astype(np.float32)


def _fields(packed: np.ndarray, bits: int) -> np.ndarray:
    """Unpack bit fields: (..., k) uint8 -> (..., 8 // bits, k); field i is (byte >> i * bits) & mask."""
    shifts = np.arange(0, 8, bits, dtype=np.uint8)[:, None]  # (8 // bits, 1)
    return (packed[..., None, :] >> shifts) & np.uint8((1 << bits) - 1)


def _k_scales(packed: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The 8 six-bit scales and 8 six-bit mins of a Q4_K/Q5_K block: (n, 12) uint8 -> 2 x (n, 8) float32.

    bytes 0-3: scales 0-3 in bits 0-5, bits 6-7 are bits 4-5 of scales 4-7
    bytes 4-7: mins 0-3 in bits 0-5, bits 6-7 are bits 4-5 of mins 4-7
    bytes 8-11: low nibble: bits 0-3 of scales 4-7, high nibble: bits 0-3 of mins 4-7
    """
    lo, hi, extra = packed[:, 0:4], packed[:, 4:8], packed[:, 8:12]
    scales = np.concatenate([lo & 63, (extra & 15) | ((lo >> 6) << 4)], axis=1)
    mins = np.concatenate([hi & 63, (extra >> 4) | ((hi >> 6) << 4)], axis=1)
    return scales.astype(np.float32), mins.astype(np.float32)


def dequant_f32(blocks: np.ndarray) -> np.ndarray:
    return blocks.view("<f4")


def dequant_f16(blocks: np.ndarray) -> np.ndarray:
    return blocks.view("<f2").astype(np.float32)


def dequant_bf16(blocks: np.ndarray) -> np.ndarray:
    # bf16 is the top half of a float32
    return (blocks.view("<u2").astype(np.uint32) << 16).view(np.float32)


def dequant_q4_0(blocks: np.ndarray) -> np.ndarray:
    n = blocks.shape[0]
    d = _f16(blocks, 0)  # (n, 1)
    q = _fields(blocks[:, 2:], 4).reshape(n, 32).astype(np.int8) - np.int8(8)
    return d * q.astype(np.float32)


def dequant_q4_1(blocks: np.ndarray) -> np.ndarray:
    n = blocks.shape[0]
    d, m = _f16(blocks, 0), _f16(blocks, 2)  # (n, 1)
    q = _fields(blocks[:, 4:], 4).reshape(n, 32)
    return d * q.astype(np.float32) + m


def dequant_q5_0(blocks: np.ndarray) -> np.ndarray:
    n = blocks.shape[0]
    d = _f16(blocks, 0)  # (n, 1)
    high = np.unpackbits(blocks[:, 2:6], axis=1, bitorder="little")  # (n, 32): bit j of the u32
    q = (_fields(blocks[:, 6:], 4).reshape(n, 32) | (high << 4)).astype(np.int8) - np.int8(16)
    return d * q.astype(np.float32)


def dequant_q5_1(blocks: np.ndarray) -> np.ndarray:
    n = blocks.shape[0]
    d, m = _f16(blocks, 0), _f16(blocks, 2)  # (n, 1)
    high = np.unpackbits(blocks[:, 4:8], axis=1, bitorder="little")  # (n, 32)
    q = _fields(blocks[:, 8:], 4).reshape(n, 32) | (high << 4)
    return d * q.astype(np.float32) + m


def dequant_q8_0(blocks: np.ndarray) -> np.ndarray:
    d = _f16(blocks, 0)  # (n, 1)
    return d * blocks[:, 2:].view(np.int8).astype(np.float32)


def dequant_q2_k(blocks: np.ndarray) -> np.ndarray:
    n = blocks.shape[0]
    packed_scales = blocks[:, 0:16]
    d, dmin = _f16(blocks, 80), _f16(blocks, 82)  # (n, 1)
    scale = (d * (packed_scales & 15).astype(np.float32))[:, :, None]  # (n, 16, 1)
    minimum = (dmin * (packed_scales >> 4).astype(np.float32))[:, :, None]  # (n, 16, 1)
    # each 128-element half reads 32 bytes at shifts 0, 2, 4, 6: element 128h + 32s + l
    q = _fields(blocks[:, 16:80].reshape(n, 2, 32), 2).reshape(n, 16, 16)
    return (scale * q.astype(np.float32) - minimum).reshape(n, 256)


def dequant_q3_k(blocks: np.ndarray) -> np.ndarray:
    n = blocks.shape[0]
    d = _f16(blocks, 108)  # (n, 1)
    # 16 six-bit scales: low 4 bits from bytes 0-7 (low nibbles, then high nibbles),
    # high 2 bits from bytes 8-11 (shift 0, 2, 4, 6); stored with an offset of 32
    low = _fields(blocks[:, 96:104], 4).reshape(n, 16)
    high = _fields(blocks[:, 104:108], 2).reshape(n, 16)
    scales = ((low | (high << 4)).astype(np.int8) - np.int8(32)).astype(np.float32)
    scale = (d * scales)[:, :, None]  # (n, 16, 1)
    q = _fields(blocks[:, 32:96].reshape(n, 2, 32), 2).reshape(n, 16, 16)  # as in Q2_K
    # bit b of hmask[l] is the high bit of element 32b + l; a clear bit means subtract 4
    minus4 = (_fields(blocks[:, 0:32], 1) ^ np.uint8(1)).reshape(n, 16, 16) << np.uint8(2)
    q = (q.astype(np.int8) - minus4.astype(np.int8)).astype(np.float32)
    return (scale * q).reshape(n, 256)


def dequant_q4_k(blocks: np.ndarray) -> np.ndarray:
    n = blocks.shape[0]
    d, dmin = _f16(blocks, 0), _f16(blocks, 2)  # (n, 1)
    scales, mins = _k_scales(blocks[:, 4:16])  # (n, 8)
    scale, minimum = (d * scales)[:, :, None], (dmin * mins)[:, :, None]  # (n, 8, 1)
    # each 64-element group reads 32 bytes: low nibbles are sub-block 2i, high nibbles 2i + 1
    q = _fields(blocks[:, 16:].reshape(n, 4, 32), 4).reshape(n, 8, 32)
    return (scale * q.astype(np.float32) - minimum).reshape(n, 256)


def dequant_q5_k(blocks: np.ndarray) -> np.ndarray:
    n = blocks.shape[0]
    d, dmin = _f16(blocks, 0), _f16(blocks, 2)  # (n, 1)
    scales, mins = _k_scales(blocks[:, 4:16])  # (n, 8)
    scale, minimum = (d * scales)[:, :, None], (dmin * mins)[:, :, None]  # (n, 8, 1)
    low = _fields(blocks[:, 48:].reshape(n, 4, 32), 4).reshape(n, 8, 32)  # as in Q4_K
    high = _fields(blocks[:, 16:48], 1)  # (n, 8, 32): bit b of qh[l] is bit 4 of element 32b + l
    q = low | (high << 4)
    return (scale * q.astype(np.float32) - minimum).reshape(n, 256)


def dequant_q6_k(blocks: np.ndarray) -> np.ndarray:
    n = blocks.shape[0]
    d = _f16(blocks, 208)  # (n, 1)
    scale = (d * blocks[:, 192:208].view(np.int8).astype(np.float32))[:, :, None]  # (n, 16, 1)
    # each 128-element half: low 4 bits from 64 ql bytes (low nibbles, then high nibbles),
    # high 2 bits from 32 qh bytes at shifts 0, 2, 4, 6; stored with an offset of 32
    low = _fields(blocks[:, 0:128].reshape(n, 2, 64), 4).reshape(n, 16, 16)
    high = _fields(blocks[:, 128:192].reshape(n, 2, 32), 2).reshape(n, 16, 16)
    q = ((low | (high << 4)).astype(np.int8) - np.int8(32)).astype(np.float32)
    return (scale * q).reshape(n, 256)


# the e2m1 values doubled (ggml's kvalues_mxfp4): a block's scale is halved to match (e8m0_to_fp32_half)
KVALUES_MXFP4 = np.array([0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12], np.float32)


def e8m0_to_fp32_half(e: np.ndarray) -> np.ndarray:
    """2^(e - 128) as ggml's ggml_e8m0_to_fp32_half builds it: the float32 bits (e - 1) << 23, and for e < 2 the
    subnormals 2^-128 and 2^-127 (0x00200000 << e). No NaN: e = 255 is 2^127."""
    e = e.astype(np.uint32)
    return np.where(e < 2, np.uint32(0x00200000) << e, (e - np.uint32(1)) << np.uint32(23)).view(np.float32)


def dequant_mxfp4(blocks: np.ndarray) -> np.ndarray:
    n = blocks.shape[0]
    d = e8m0_to_fp32_half(blocks[:, :1])  # (n, 1)
    q = _fields(blocks[:, 1:], 4).reshape(n, 32)  # low nibbles are elements 0-15, high ones 16-31
    return d * KVALUES_MXFP4[q]


# type name -> blocks (n, block_bytes) uint8 -> values (n, block_elems) float32
DEQUANTIZERS: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "F32": dequant_f32, "F16": dequant_f16, "BF16": dequant_bf16,
    "Q4_0": dequant_q4_0, "Q4_1": dequant_q4_1, "Q5_0": dequant_q5_0, "Q5_1": dequant_q5_1,
    "Q8_0": dequant_q8_0,
    "Q2_K": dequant_q2_k, "Q3_K": dequant_q3_k, "Q4_K": dequant_q4_k, "Q5_K": dequant_q5_k,
    "Q6_K": dequant_q6_k, "MXFP4": dequant_mxfp4, **IQ_DEQUANTIZERS,
}


def dequantize(raw: np.ndarray, qtype: GGMLType, shape: Sequence[int]) -> np.ndarray:
    """Dequantize the raw bytes of a tensor to float32.

    raw: the tensor's bytes (uint8, any shape, C-contiguous), as GGUFModel.tensor_bytes returns them.
    shape: ggml order, shape[0] is the contiguous row length.
    Returns a new array with the shape reversed (rows x cols for a matrix), like gguf-py's
    gguf.quants.dequantize on a (rows, row_bytes) array, and bit-identical to it.
    """
    require_supported(qtype)
    shape = tuple(int(s) for s in shape)
    if raw.dtype != np.uint8:
        raise TypeError(f"raw tensor data must be uint8 bytes, got {raw.dtype}")
    if not shape or min(shape) < 1 or shape[0] % qtype.block_elems:
        raise DequantShapeError(f"shape {shape} is not a valid {qtype.name} tensor shape (the row length "
                                f"shape[0] must be a positive multiple of {qtype.block_elems})")
    n_elems = math.prod(shape)
    if raw.size != qtype.nbytes(n_elems):
        raise DequantShapeError(f"a {qtype.name} tensor of shape {shape} needs {qtype.nbytes(n_elems)} "
                                f"bytes, got {raw.size}")
    n_blocks = n_elems // qtype.block_elems
    blocks = raw.reshape(n_blocks, qtype.block_bytes)  # a view for contiguous raw
    dequant = DEQUANTIZERS[qtype.name]
    out = np.empty((n_blocks, qtype.block_elems), dtype=np.float32)
    step = max(1, CHUNK_ELEMS // qtype.block_elems)
    for start in range(0, n_blocks, step):
        out[start:start + step] = dequant(blocks[start:start + step])
    return out.reshape(shape[::-1])


def dequantize_tensor(model: GGUFModel, name: str) -> np.ndarray:
    """Dequantize one tensor of an open GGUFModel: float32, shape reversed from ggml order (rows x cols)."""
    info = model.tensors[name]
    require_supported(info.type, name)
    return dequantize(model.tensor_bytes(name), info.type, info.shape)
