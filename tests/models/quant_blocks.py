"""Random tensor bytes for testing dequantizers: random quants with finite, modest scales."""
import numpy as np

from models.ggml_types import GGMLType

# byte offsets of the fp16 scale fields (d, dmin, m) inside one block, from ggml-common.h
FP16_FIELDS = {
    "Q4_0": [0], "Q4_1": [0, 2], "Q5_0": [0], "Q5_1": [0, 2], "Q8_0": [0],
    "Q2_K": [80, 82], "Q3_K": [108], "Q4_K": [0, 2], "Q5_K": [0, 2], "Q6_K": [208],
    "MXFP4": [],  # its scale is one e8m0 byte, set below
    "IQ4_NL": [0], "IQ4_XS": [0], "IQ2_XXS": [0], "IQ2_XS": [0], "IQ2_S": [0], "IQ3_XXS": [0], "IQ3_S": [0],
    "IQ1_S": [0],
    "IQ1_M": [],  # its scale is the top nibbles of its 4 scale words, set by iq1_m_scales
}


def iq1_m_scales(blocks: np.ndarray, d: np.ndarray) -> None:
    """Writes the fp16 scales d (n_blocks,) of IQ1_M blocks: 4 bits in the top nibble of each of the scale words."""
    bits = d.astype(np.float16).view(np.uint16)[:, None]
    words = blocks[:, 48:56].copy().view("<u2")
    words[:] = (words & np.uint16(0x0FFF)) | (((bits >> np.array([0, 4, 8, 12], np.uint16)) & np.uint16(0xF)) << 12)
    blocks[:, 48:56] = words.view(np.uint8)


SPECIALS = np.array([np.nan, np.inf, -np.inf], dtype=np.float32)


def random_bytes(rng: np.random.Generator, qtype: GGMLType, n_blocks: int) -> np.ndarray:
    """Uniformly random bytes (scales may be huge, tiny, NaN or inf), with NaN, +inf and -inf planted in
    the first float field (the scale d) of the first three blocks, so those cases are always there."""
    blocks = rng.integers(0, 256, (n_blocks, qtype.block_bytes), dtype=np.uint8)
    if qtype.name == "F32":
        blocks[:3] = SPECIALS.view(np.uint8).reshape(3, 4)
    elif qtype.name == "F16":
        blocks[:3] = SPECIALS.astype(np.float16).view(np.uint8).reshape(3, 2)
    elif qtype.name == "BF16":
        blocks[:3] = (SPECIALS.view(np.uint32) >> 16).astype(np.uint16).view(np.uint8).reshape(3, 2)
    elif qtype.name == "MXFP4":  # an e8m0 scale has no NaN (ggml_e8m0_to_fp32_half): 2^127 x 12 overflows to inf
        blocks[:3, 0] = 255
        blocks[:3, 1] = 0x77  # value 12 at elements 0 and 16
    elif qtype.name == "IQ1_M":
        iq1_m_scales(blocks[:3], SPECIALS[:n_blocks])
    else:
        at = FP16_FIELDS[qtype.name][0]
        blocks[:3, at:at + 2] = SPECIALS.astype(np.float16).view(np.uint8).reshape(3, 2)
    return blocks.reshape(-1)


def random_blocks(rng: np.random.Generator, qtype: GGMLType, n_blocks: int) -> np.ndarray:
    """n_blocks random blocks whose float fields are finite and modest (|x| < 2), as uint8 bytes (1-D)."""
    if qtype.name in ("F32", "F16", "BF16"):
        values = rng.uniform(-2, 2, n_blocks).astype(np.float32)
        if qtype.name == "F16":
            return values.astype(np.float16).view(np.uint8)
        if qtype.name == "BF16":
            return (values.view(np.uint32) >> 16).astype(np.uint16).view(np.uint8)
        return values.view(np.uint8)
    blocks = random_bytes(rng, qtype, n_blocks).reshape(n_blocks, qtype.block_bytes)
    if qtype.name == "MXFP4":  # scales 2^-10 .. 2^-1 (e - 128), all of them below 2^-126 too in a few blocks
        blocks[:, 0] = rng.integers(118, 128, n_blocks)
        blocks[:2, 0] = (0, 1)[:n_blocks]
    if qtype.name == "IQ1_M":
        iq1_m_scales(blocks, rng.uniform(-0.05, 0.05, n_blocks))
    for at in FP16_FIELDS[qtype.name]:
        scale = rng.uniform(-0.05, 0.05, (n_blocks, 1)).astype(np.float16)
        blocks[:, at:at + 2] = scale.view(np.uint8)
    return blocks.reshape(-1)
