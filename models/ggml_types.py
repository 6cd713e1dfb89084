"""The ggml tensor types a GGUF file can hold: id, block size in elements, block size in bytes.

The block layouts follow ggml-common.h; the byte counts are written as sums so they read as the layout.
"""
from dataclasses import dataclass

from models.errors import UserError

QK_K = 256  # elements in a super-block of the k-quants


@dataclass(frozen=True)
class GGMLType:
    name: str
    id: int
    block_elems: int  # elements in one block
    block_bytes: int  # bytes of one block
    supported: bool = True  # False: recognised by name, refused with a clear error

    def nbytes(self, n_elems: int) -> int:
        return n_elems // self.block_elems * self.block_bytes


_TYPES = [
    GGMLType("F32", 0, 1, 4),
    GGMLType("F16", 1, 1, 2),
    GGMLType("Q4_0", 2, 32, 2 + 16),
    GGMLType("Q4_1", 3, 32, 2 + 2 + 16),
    GGMLType("Q5_0", 6, 32, 2 + 4 + 16),
    GGMLType("Q5_1", 7, 32, 2 + 2 + 4 + 16),
    GGMLType("Q8_0", 8, 32, 2 + 32),
    GGMLType("Q8_1", 9, 32, 4 + 4 + 32, supported=False),
    GGMLType("Q2_K", 10, QK_K, 2 + 2 + QK_K // 16 + QK_K // 4),
    GGMLType("Q3_K", 11, QK_K, 2 + QK_K // 4 + QK_K // 8 + 12),
    GGMLType("Q4_K", 12, QK_K, 2 + 2 + 12 + QK_K // 2),
    GGMLType("Q5_K", 13, QK_K, 2 + 2 + 12 + QK_K // 8 + QK_K // 2),
    GGMLType("Q6_K", 14, QK_K, QK_K // 2 + QK_K // 4 + QK_K // 16 + 2),
    GGMLType("Q8_K", 15, QK_K, 4 + QK_K + QK_K // 8, supported=False),
    GGMLType("IQ2_XXS", 16, QK_K, 2 + QK_K // 4),
    GGMLType("IQ2_XS", 17, QK_K, 2 + QK_K // 4 + QK_K // 32),
    GGMLType("IQ3_XXS", 18, QK_K, 2 + QK_K // 4 + QK_K // 8),
    GGMLType("IQ1_S", 19, QK_K, 2 + QK_K // 8 + QK_K // 16),
    GGMLType("IQ4_NL", 20, 32, 2 + 16),
    GGMLType("IQ3_S", 21, QK_K, 2 + QK_K // 4 + QK_K // 8 + QK_K // 32 + 4),
    GGMLType("IQ2_S", 22, QK_K, 2 + QK_K // 4 + QK_K // 16),
    GGMLType("IQ4_XS", 23, QK_K, 2 + 2 + QK_K // 2 + QK_K // 64),
    GGMLType("I8", 24, 1, 1, supported=False),
    GGMLType("I16", 25, 1, 2, supported=False),
    GGMLType("I32", 26, 1, 4, supported=False),
    GGMLType("I64", 27, 1, 8, supported=False),
    GGMLType("F64", 28, 1, 8, supported=False),
    GGMLType("IQ1_M", 29, QK_K, QK_K // 8 + QK_K // 16 + QK_K // 32),
    GGMLType("BF16", 30, 1, 2),
    GGMLType("TQ1_0", 34, QK_K, 2 + 4 * 13, supported=False),
    GGMLType("TQ2_0", 35, QK_K, 2 + 64, supported=False),
    GGMLType("MXFP4", 39, 32, 1 + 16),
]

TYPES_BY_ID: dict[int, GGMLType] = {t.id: t for t in _TYPES}
TYPES_BY_NAME: dict[str, GGMLType] = {t.name: t for t in _TYPES}


class UnsupportedTypeError(UserError, ValueError):
    """A tensor type we recognise but cannot compute with (IQ*, TQ*, ...)."""


def require_supported(t: GGMLType, tensor_name: str = "") -> GGMLType:
    if not t.supported:
        where = f" (tensor '{tensor_name}')" if tensor_name else ""
        raise UnsupportedTypeError(f"quant type {t.name}{where} is not supported by gguf-chat")
    return t
