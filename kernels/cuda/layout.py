"""How a weight tensor lies in VRAM for the CUDA matvec kernels (numpy only: no device needed).

Each ggml block is split into a "bulk" part whose size is a multiple of 16 bytes (the quants, read with
16-byte loads) and a "meta" part (the fields that broke that alignment, mostly the fp16 scale). A tensor
[n_rows, row_bytes] becomes bulk [n_rows, n_blocks, bulk] followed by meta [n_rows, n_blocks, meta] (a block's
front fields, then its back ones): the same bytes, reordered, so VRAM stays the file size.
kernels/cuda/quant_dot.cuh reads this layout.
"""
import numpy as np

from models.ggml_types import GGMLType

# type name -> (meta bytes taken from the front of a block, meta bytes taken from the back)
META_SPLIT: dict[str, tuple[int, int]] = {
    "Q4_0": (2, 0),  # d | qs
    "Q4_1": (4, 0),  # d m | qs
    "Q5_0": (6, 0),  # d qh | qs
    "Q5_1": (8, 0),  # d m qh | qs
    "Q8_0": (2, 0),  # d | qs
    "Q2_K": (0, 4),  # scales qs | d dmin
    "Q3_K": (0, 14),  # hmask qs | scales d
    "Q4_K": (0, 0),  # d dmin scales qs: 144 bytes, kept
    "Q5_K": (0, 0),  # d dmin scales qh qs: 176 bytes, kept
    "Q6_K": (0, 2),  # ql qh scales | d
    "MXFP4": (1, 0),  # e | qs
    "IQ4_NL": (2, 0),  # d | qs
    "IQ4_XS": (8, 0),  # d scales_h scales_l | qs
    "IQ2_XXS": (2, 0),  # d | qs
    "IQ2_XS": (2, 8),  # d | qs | scales
    "IQ2_S": (2, 16),  # d | qs signs | qh scales
    "IQ3_XXS": (2, 0),  # d | qs signs-and-scales
    "IQ3_S": (2, 44),  # d | qs | qh signs scales
    "IQ1_S": (2, 16),  # d | qs | qh
    "IQ1_M": (0, 24),  # qs | qh scales
    "F32": (0, 0),
    "F16": (0, 0),
    "BF16": (0, 0),
}


# Weights one GPU thread handles per step (an "item", see quant_dot.cuh: QK / ITEMS; matvec.cu: 8 floats)
ELEMS_PER_ITEM: dict[str, int] = {
    "Q4_0": 32, "Q4_1": 32, "Q5_0": 32, "Q5_1": 32, "Q8_0": 16,
    "Q2_K": 64, "Q3_K": 64, "Q4_K": 64, "Q5_K": 64, "Q6_K": 64,
    "MXFP4": 32, "IQ4_NL": 32, "IQ4_XS": 64, "IQ2_XXS": 32, "IQ2_XS": 64, "IQ2_S": 64, "IQ3_XXS": 32, "IQ3_S": 32,
    "IQ1_S": 32, "IQ1_M": 64,
    "F32": 8, "F16": 8, "BF16": 8,
}


def bulk_meta_bytes(qtype: GGMLType) -> tuple[int, int]:
    """Bytes of one block's bulk and meta parts."""
    front, back = META_SPLIT[qtype.name]
    return qtype.block_bytes - front - back, front + back


# Types whose bulk is 16-byte groups of 4-bit table codes that the device reads in sequence (table16_in_sequence)
TABLE16_IN_SEQUENCE = {"IQ4_XS"}


def table16_in_sequence(qs):
    """uint8 [..., 16] groups of 32 4-bit codes in ggml's order (byte l: weight l in its low nibble, 16 + l in its
    high one) -> the same codes in sequence: 32-bit word j holds weights 4j..4j+3 in its low 16 bits and
    16+4j..19+4j in its high ones, nibble by nibble. The table lookup (quant_dot_iq.cuh's table16_seq) then leaves
    the values in x's order without the two permutes a word that ggml's order needs (a matvec's ALU work, which
    bounds IQ4_XS's decode matvecs on the H200: BENCHMARKS.md, session 27). Array methods only, as repack."""
    lo = (qs & 15).reshape(*qs.shape[:-1], 4, 2, 2)  # [word j, byte of its half, nibble]: weight 4j + 2p + e
    hi = (qs >> 4).reshape(*qs.shape[:-1], 4, 2, 2)  # weight 16 + 4j + 2p + e
    out = qs.copy().reshape(*qs.shape[:-1], 4, 4)
    out[..., :2] = lo[..., 0] | (lo[..., 1] << 4)
    out[..., 2:] = hi[..., 0] | (hi[..., 1] << 4)
    return out.reshape(qs.shape)


def repack(raw: np.ndarray, qtype: GGMLType) -> np.ndarray:
    """raw uint8 [n_rows, row_bytes] as in the file -> uint8 [n_rows * row_bytes] in the device layout.

    raw may be a numpy or a CuPy array."""
    n_rows, row_bytes = raw.shape
    front, back = META_SPLIT[qtype.name]
    if front == back == 0:
        return raw.reshape(-1)
    n_blocks = row_bytes // qtype.block_bytes
    blocks = raw.reshape(n_rows, n_blocks, qtype.block_bytes)
    bulk = blocks[:, :, front : qtype.block_bytes - back]
    if qtype.name in TABLE16_IN_SEQUENCE:
        bulk = table16_in_sequence(bulk.reshape(n_rows, n_blocks, -1, 16))
    out = raw.reshape(-1).copy()  # array methods only, so a CuPy array repacks on the device too
    out[: bulk.size] = bulk.reshape(-1)
    meta = out[bulk.size :].reshape(n_rows, n_blocks, front + back)  # a view: the front bytes, then the back ones
    meta[:, :, :front] = blocks[:, :, :front]
    meta[:, :, front:] = blocks[:, :, qtype.block_bytes - back :]
    return out


def expert_rows(raw: np.ndarray) -> int | None:
    """Of raw uint8 [n_expert, n_rows, row_bytes] (an expert stack, or a view of one whose experts have other rows
    between them: gemma4's gate or up of ffn_gate_up_exps), the rows from one expert's first row to the next's; None
    where an expert's rows are not back to back or the experts not a whole number of rows apart."""
    n_expert, n_rows, row_bytes = raw.shape
    step = raw.strides[0]
    if raw.dtype != np.uint8 or raw.strides[1:] != (row_bytes, 1) or step % row_bytes or step < n_rows * row_bytes:
        return None
    return step // row_bytes
