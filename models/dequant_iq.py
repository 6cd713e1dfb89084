"""Reference dequantization of the IQ quants (llama.cpp's importance-matrix types), in vectorised numpy.

Bit-exact with gguf-py (gguf.quants.dequantize) as models/dequant.py's other types, in ggml's order of float
operations (dequantize_row_iq* in ggml-quants.c). The IQ2/IQ3/IQ1 types store, for each group of 4 or 8 values,
an index into a grid of fixed value vectors (models/iq_grids.py) and, for IQ2/IQ3, the group's signs; IQ4 stores
4-bit indices into a fixed non-linear table of 16 values.
Block layouts, from ggml-common.h (d: fp16 scale; qs, qh: grid indices, their low 8 and high bits):
    IQ4_NL   d | qs[16]                              element j < 16: low nibble of qs[j]; j >= 16: high of qs[j-16]
    IQ4_XS   d | scales_h u16 | scales_l[4] | qs[128]  8 sub-blocks of 32 as IQ4_NL, 6-bit scale - 32 each
    IQ2_XXS  d | u32 pairs[8]                        per 32 values: 4 grid bytes; 4 x 7 sign bits, 4-bit scale
    IQ2_XS   d | qs u16[32] | scales[8]              per 8 values: 9-bit grid index, 7 sign bits; a scale per 16
    IQ2_S    d | qs[32] | signs[32] | qh[8] | scales[8]   10-bit grid index (2 high bits in qh), 8 sign bits
    IQ3_XXS  d | qs[64] | u32[8]                     per 4 values a grid byte; per 32: 4 x 7 sign bits, scale
    IQ3_S    d | qs[64] | qh[8] | signs[32] | scales[4]   9-bit grid index per 4 values, 8 sign bits per 8
    IQ1_S    d | qs[32] | qh u16[8]                  per 8 values an 11-bit index into -1/0/+1 vectors; per 32
                                                     a 3-bit scale and the sign of a shift of 1/8
    IQ1_M    qs[32] | qh[16] | scales u16[4]         per 8 values an 11-bit index and its shift's sign (a qh
                                                     nibble); a 3-bit scale per 16; d in the scales' top nibbles
The 7 sign bits of IQ2_XXS / IQ2_XS / IQ3_XXS carry an 8th, their parity (KSIGNS).
"""
from collections.abc import Callable

import numpy as np

from models.iq_grids import GRIDS, IQ1_DELTA, KSIGNS, KVALUES_IQ4NL

SIGNS = np.where((np.arange(256)[:, None] >> np.arange(8)) & 1, np.float32(-1), np.float32(1))  # a byte -> 8 factors
_GRIDS_F32 = {name: grid.astype(np.float32) for name, grid in GRIDS.items()}


def _f16(blocks: np.ndarray, at: int) -> np.ndarray:
    """The fp16 field at byte `at` of every block, as float32: (n, 1)."""
    return blocks[:, at:at + 2].view("<f2").astype(np.float32)


def _nibbles(packed: np.ndarray) -> np.ndarray:
    """(..., k) uint8 -> (..., 2k): the k low nibbles, then the k high ones."""
    return np.concatenate([packed & np.uint8(15), packed >> np.uint8(4)], axis=-1)


def _signs7(words: np.ndarray) -> np.ndarray:
    """The 4 sign bytes of u32 words whose bits 0-27 hold 4 x 7 sign bits: (...) -> 8 factors each (..., 4, 8)."""
    return SIGNS[KSIGNS[(words[..., None] >> np.array([0, 7, 14, 21], np.uint32)) & np.uint32(127)]]


def dequant_iq4_nl(blocks: np.ndarray) -> np.ndarray:
    return _f16(blocks, 0) * KVALUES_IQ4NL[_nibbles(blocks[:, 2:18])]


def dequant_iq4_xs(blocks: np.ndarray) -> np.ndarray:
    n = blocks.shape[0]
    d = _f16(blocks, 0)  # (n, 1)
    ib = np.arange(8)
    high = (blocks[:, 2:4].view("<u2") >> (2 * ib).astype(np.uint16)) & np.uint16(3)  # (n, 8)
    low = (blocks[:, 4 + ib // 2] >> (4 * (ib % 2)).astype(np.uint8)) & np.uint8(15)  # (n, 8)
    dl = d * ((low | (high << 4)).astype(np.int8) - np.int8(32)).astype(np.float32)  # (n, 8)
    q = _nibbles(blocks[:, 8:].reshape(n, 8, 16))  # (n, 8, 32)
    return (dl[:, :, None] * KVALUES_IQ4NL[q]).reshape(n, 256)


def dequant_iq2_xxs(blocks: np.ndarray) -> np.ndarray:
    n = blocks.shape[0]
    d = _f16(blocks, 0)
    aux = blocks[:, 2:66].view("<u4").reshape(n, 8, 2)  # per 32 values: grid bytes, signs and scale
    db = d * (np.float32(0.5) + (aux[..., 1] >> 28).astype(np.float32)) * np.float32(0.25)  # (n, 8)
    grid = _GRIDS_F32["IQ2_XXS"][blocks[:, 2:66].reshape(n, 8, 8)[:, :, :4]]  # (n, 8, 4, 8)
    return (db[:, :, None, None] * grid * _signs7(aux[..., 1])).reshape(n, 256)


def _scales_2x4(packed: np.ndarray, d: np.ndarray) -> np.ndarray:
    """IQ2_XS / IQ2_S: a 4-bit scale per 16 values, two a byte (low nibble first) -> d * (0.5 + s) / 4: (n, 16)."""
    s = np.stack([packed & np.uint8(15), packed >> np.uint8(4)], axis=-1).reshape(packed.shape[0], -1)
    return d * (np.float32(0.5) + s.astype(np.float32)) * np.float32(0.25)


def dequant_iq2_xs(blocks: np.ndarray) -> np.ndarray:
    n = blocks.shape[0]
    qs = blocks[:, 2:66].view("<u2")  # (n, 32): 9-bit grid index, 7 sign bits
    db = _scales_2x4(blocks[:, 66:74], _f16(blocks, 0))
    grid = _GRIDS_F32["IQ2_XS"][qs & np.uint16(511)]  # (n, 32, 8)
    signs = SIGNS[KSIGNS[qs >> np.uint16(9)]]
    return (db.reshape(n, 16, 1, 1) * grid.reshape(n, 16, 2, 8) * signs.reshape(n, 16, 2, 8)).reshape(n, 256)


def dequant_iq2_s(blocks: np.ndarray) -> np.ndarray:
    n = blocks.shape[0]
    high = (blocks[:, 66:74, None] >> np.array([0, 2, 4, 6], np.uint8)) & np.uint8(3)  # (n, 8, 4)
    idx = blocks[:, 2:34].astype(np.uint16) | (high.reshape(n, 32).astype(np.uint16) << 8)
    db = _scales_2x4(blocks[:, 74:82], _f16(blocks, 0))
    grid = _GRIDS_F32["IQ2_S"][idx]  # (n, 32, 8)
    signs = SIGNS[blocks[:, 34:66]]
    return (db.reshape(n, 16, 1, 1) * grid.reshape(n, 16, 2, 8) * signs.reshape(n, 16, 2, 8)).reshape(n, 256)


def dequant_iq3_xxs(blocks: np.ndarray) -> np.ndarray:
    n = blocks.shape[0]
    aux = blocks[:, 66:98].view("<u4")  # (n, 8): per 32 values 4 x 7 sign bits and a 4-bit scale
    db = _f16(blocks, 0) * (np.float32(0.5) + (aux >> 28).astype(np.float32)) * np.float32(0.5)
    grid = _GRIDS_F32["IQ3_XXS"][blocks[:, 2:66]].reshape(n, 8, 4, 8)
    return (db[:, :, None, None] * grid * _signs7(aux)).reshape(n, 256)


def dequant_iq3_s(blocks: np.ndarray) -> np.ndarray:
    n = blocks.shape[0]
    high = (blocks[:, 66:74, None] >> np.arange(8, dtype=np.uint8)) & np.uint8(1)  # (n, 8, 8): bit 8 of an index
    idx = blocks[:, 2:66].astype(np.uint16) | (high.reshape(n, 64).astype(np.uint16) << 8)
    scales = np.stack([blocks[:, 106:110] & np.uint8(15), blocks[:, 106:110] >> np.uint8(4)], -1).reshape(n, 8)
    db = _f16(blocks, 0) * (1 + 2 * scales.astype(np.float32))  # (n, 8)
    grid = _GRIDS_F32["IQ3_S"][idx].reshape(n, 8, 4, 8)
    return (db[:, :, None, None] * grid * SIGNS[blocks[:, 74:106]].reshape(n, 8, 4, 8)).reshape(n, 256)


def dequant_iq1_s(blocks: np.ndarray) -> np.ndarray:
    n = blocks.shape[0]
    qh = blocks[:, 34:50].view("<u2")  # (n, 8): per 32 values 4 x 3 index bits, a 3-bit scale, the shift's sign
    dl = _f16(blocks, 0) * (2 * ((qh >> 12) & np.uint16(7)) + 1).astype(np.float32)
    delta = np.where(qh & np.uint16(0x8000), -IQ1_DELTA, IQ1_DELTA)
    high = (qh[:, :, None] >> np.array([0, 3, 6, 9], np.uint16)) & np.uint16(7)  # (n, 8, 4)
    idx = blocks[:, 2:34].astype(np.uint16) | (high.reshape(n, 32) << 8)
    grid = _GRIDS_F32["IQ1_S"][idx].reshape(n, 8, 4, 8)
    return (dl[:, :, None, None] * (grid + delta[:, :, None, None])).reshape(n, 256)


def dequant_iq1_m(blocks: np.ndarray) -> np.ndarray:
    n = blocks.shape[0]
    sc = blocks[:, 48:56].view("<u2")  # (n, 4): 4 x 3-bit scales each, and 4 bits of d at the top
    d_bits = (sc >> np.array([12, 8, 4, 0], np.uint16)) & np.array([0xF, 0xF0, 0xF00, 0xF000], np.uint16)
    d = np.bitwise_or.reduce(d_bits, axis=1, keepdims=True).view("<f2").astype(np.float32)  # (n, 1)
    scales = (sc[:, :, None] >> np.array([0, 3, 6, 9], np.uint16)) & np.uint16(7)  # (n, 4, 4): 2 per 32 values
    dl = d * (2 * scales.reshape(n, 16) + 1).astype(np.float32)  # (n, 16)
    nibbles = (blocks[:, 32:48, None] >> np.array([0, 4], np.uint8)) & np.uint8(15)  # (n, 16, 2): one per 8 values
    nibbles = nibbles.reshape(n, 32)
    idx = blocks[:, :32].astype(np.uint16) | ((nibbles & np.uint8(7)).astype(np.uint16) << 8)
    delta = np.where(nibbles & np.uint8(8), -IQ1_DELTA, IQ1_DELTA)
    grid = _GRIDS_F32["IQ1_S"][idx]  # (n, 32, 8)
    return (dl.reshape(n, 16, 1, 1) * (grid.reshape(n, 16, 2, 8) + delta.reshape(n, 16, 2, 1))).reshape(n, 256)


# type name -> blocks (n, block_bytes) uint8 -> values (n, block_elems) float32
IQ_DEQUANTIZERS: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "IQ4_NL": dequant_iq4_nl, "IQ4_XS": dequant_iq4_xs, "IQ2_XXS": dequant_iq2_xxs, "IQ2_XS": dequant_iq2_xs,
    "IQ2_S": dequant_iq2_s, "IQ3_XXS": dequant_iq3_xxs, "IQ3_S": dequant_iq3_s, "IQ1_S": dequant_iq1_s,
    "IQ1_M": dequant_iq1_m,
}
