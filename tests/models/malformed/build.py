"""Raw GGUF bytes for files no well-behaved writer makes, and a corpus of malformed files.

A valid file is assembled from parts so each case changes one field and says which error it expects.
"""
import struct

import numpy as np
from gguf import GGMLQuantizationType, GGUFValueType, GGUFWriter

U32, U64 = (lambda v: struct.pack("<I", v)), (lambda v: struct.pack("<Q", v))


def string(s: bytes | str) -> bytes:
    s = s.encode() if isinstance(s, str) else s
    return U64(len(s)) + s


def kv(key: bytes | str, vtype: int, payload: bytes) -> bytes:
    return string(key) + U32(vtype) + payload


def tensor_info(name: bytes | str, dims: list[int], type_id: int, offset: int) -> bytes:
    return string(name) + U32(len(dims)) + b"".join(U64(d) for d in dims) + U32(type_id) + U64(offset)


def gguf(kvs: list[bytes] = (), infos: list[bytes] = (), data: bytes = b"", magic: bytes = b"GGUF",
         version: int = 3, n_tensors: int | None = None, n_kv: int | None = None, alignment: int = 32) -> bytes:
    head = (magic + U32(version) + U64(len(infos) if n_tensors is None else n_tensors)
            + U64(len(kvs) if n_kv is None else n_kv) + b"".join(kvs) + b"".join(infos))
    return head + b"\0" * (-len(head) % alignment) + data


NAME = kv("general.name", 8, string("tiny"))
F32_4 = tensor_info("a", [4], 0, 0)  # 16 bytes of data at offset 0


def corpus() -> dict[str, tuple[bytes, str]]:
    """name -> (file bytes, a fragment the error message must contain)."""
    big = 1 << 64
    return {
        "bad magic": (gguf([NAME], magic=b"GGML"), "bad magic"),
        "version 1": (gguf([NAME], version=1), "version 1"),
        "version 4": (gguf([NAME], version=4), "unsupported GGUF version 4"),
        "big-endian": (b"GGUF" + struct.pack(">I", 3) + b"\0" * 32, "big-endian"),
        "too short": (b"GGUF\3\0\0", "too short"),
        "huge n_kv": (gguf([NAME], n_kv=big - 1), "metadata count"),
        "huge n_tensors": (gguf([NAME], n_tensors=big - 1), "tensor count"),
        "n_kv past the pairs": (gguf([NAME], n_kv=2), "metadata key #1"),
        "huge key length": (gguf([U64(big - 1) + b"k" + U32(4) + U32(1)]), "metadata key #0: length"),
        "1 GiB string": (gguf([kv("s", 8, U64((1 << 30) + 1) + b"x")]), "exceeds the limit"),
        "string past the end": (gguf([kv("s", 8, U64(1000) + b"x")]), "value of 's'"),
        "empty key": (gguf([kv("", 4, U32(1))]), "is empty"),
        "key not UTF-8": (gguf([kv(b"\xff\xfe", 4, U32(1))]), "not valid UTF-8"),
        "value not UTF-8": (gguf([kv("s", 8, string(b"\xc3"))]), "not valid UTF-8"),
        "duplicate key": (gguf([NAME, NAME]), "duplicate metadata key 'general.name'"),
        "unknown value type": (gguf([kv("k", 13, U32(1))]), "unknown value type 13"),
        "unknown array type": (gguf([kv("k", 9, U32(99) + U64(1) + U32(1))]), "unknown array element type"),
        "huge array count": (gguf([kv("k", 9, U32(4) + U64(big - 1))]), "does not fit"),
        "huge string array": (gguf([kv("k", 9, U32(8) + U64(1 << 40))]), "does not fit"),
        "string array past the end": (gguf([kv("k", 9, U32(8) + U64(2) + string("a") + U64(99) + b"b")]),
                                      "value of 'k'[1]"),
        "string array not UTF-8": (gguf([kv("k", 9, U32(8) + U64(2) + string("a") + string(b"\x80"))]),
                                   "value of 'k'[1]: not valid UTF-8"),
        "arrays nested without end": (gguf([kv("k", 9, (U32(9) + U64(1)) * 4000)]), "nested deeper"),
        "alignment not a power of two": (gguf([kv("general.alignment", 4, U32(48))]), "power of two"),
        "alignment zero": (gguf([kv("general.alignment", 4, U32(0))]), "power of two"),
        "alignment as u64": (gguf([kv("general.alignment", 10, U64(32))]), "must be a uint32, not a uint64"),
        "n_dims 0": (gguf([NAME], [tensor_info("a", [], 0, 0)], b"\0" * 32), "n_dims 0"),
        "n_dims 5": (gguf([NAME], [tensor_info("a", [1] * 5, 0, 0)], b"\0" * 32), "n_dims 5"),
        "dimension 0": (gguf([NAME], [tensor_info("a", [4, 0], 0, 0)], b"\0" * 32), "dimension of 0"),
        "dims overflow": (gguf([NAME], [tensor_info("a", [1 << 32, 1 << 32], 0, 0)], b"\0" * 32),
                          "too many elements"),
        "dims overflow 2^63": (gguf([NAME], [tensor_info("a", [1 << 62, 2], 0, 0)], b"\0" * 32),
                               "too many elements"),
        "dims wrap to small": (gguf([NAME], [tensor_info("a", [1 << 32, 1 << 32, 1 << 32, 1 << 32], 0, 0)],
                                    b"\0" * 32), "too many elements"),
        "unknown ggml type": (gguf([NAME], [tensor_info("a", [4], 31, 0)], b"\0" * 32), "unknown ggml type 31"),
        "row not a block multiple": (gguf([NAME], [tensor_info("a", [33], 8, 0)], b"\0" * 64), "block size 32"),
        "name of 64 bytes": (gguf([NAME], [tensor_info("n" * 64, [4], 0, 0)], b"\0" * 32), "exceeds the limit"),
        "duplicate tensor": (gguf([NAME], [F32_4, tensor_info("a", [4], 0, 32)], b"\0" * 64),
                             "duplicate tensor name 'a'"),
        "offset past the end": (gguf([NAME], [tensor_info("a", [4], 0, 1 << 40)], b"\0" * 32),
                                "not within the file bounds"),
        "offset near 2^64": (gguf([NAME], [tensor_info("a", [4], 0, (1 << 64) - 32)], b"\0" * 32),
                             "not within the file bounds"),
        "data truncated": (gguf([NAME], [tensor_info("a", [64], 0, 0)], b"\0" * 32),
                           "tensor 'a' data is not within the file bounds"),
        "misaligned offset": (gguf([NAME], [F32_4, tensor_info("b", [4], 0, 48)], b"\0" * 96), "not aligned"),
        "overlapping": (gguf([NAME], [tensor_info("a", [16], 0, 0), tensor_info("b", [4], 0, 32)], b"\0" * 96),
                        "overlaps"),
        "out of order": (gguf([NAME], [tensor_info("a", [4], 0, 32), tensor_info("b", [4], 0, 0)], b"\0" * 64),
                         "overlaps or precedes"),
        "tensor infos cut short": (gguf([NAME], [F32_4], n_tensors=2), "tensor #1 name"),
    }


def valid_file(path, alignment: int | None = None, nested: bool = True) -> None:
    """A small file written by gguf-py: every value type and tensors of three types. llama.cpp's reader
    refuses arrays of arrays, so nested=False writes a file both readers accept."""
    w = GGUFWriter(path, "llama")
    if alignment is not None:
        w.add_custom_alignment(alignment)
    for key, (value, vtype) in EVERY_VALUE_TYPE.items():
        if isinstance(value, list):  # arrays: vtype is the element type
            if nested or vtype != GGUFValueType.ARRAY:
                w.add_key_value(key, value, GGUFValueType.ARRAY, sub_type=vtype)
        else:
            w.add_key_value(key, value, vtype)
    w.add_tensor("f32", np.arange(8, dtype=np.float32).reshape(2, 4))
    w.add_tensor("q8", np.arange(2 * 34, dtype=np.uint8).reshape(2, 34), raw_dtype=GGMLQuantizationType.Q8_0)
    w.add_tensor("q4k", np.arange(144, dtype=np.uint8).reshape(1, 144), raw_dtype=GGMLQuantizationType.Q4_K)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


# key -> (value as written, GGUF value type); the reader must return each exactly
EVERY_VALUE_TYPE = {
    "t.u8": (255, GGUFValueType.UINT8), "t.i8": (-128, GGUFValueType.INT8),
    "t.u16": (65535, GGUFValueType.UINT16), "t.i16": (-32768, GGUFValueType.INT16),
    "t.u32": (2**32 - 1, GGUFValueType.UINT32), "t.i32": (-2**31, GGUFValueType.INT32),
    "t.u64": (2**64 - 1, GGUFValueType.UINT64), "t.i64": (-2**63, GGUFValueType.INT64),
    "t.f32": (1.5, GGUFValueType.FLOAT32), "t.f64": (-2.25e300, GGUFValueType.FLOAT64),
    "t.bool": (True, GGUFValueType.BOOL), "t.bool_false": (False, GGUFValueType.BOOL),
    "t.str": ("héllo ✓ 世界", GGUFValueType.STRING), "t.str_empty": ("", GGUFValueType.STRING),
    "t.arr_i32": ([1, -2, 3], GGUFValueType.INT32), "t.arr_f32": ([0.5, -1.25], GGUFValueType.FLOAT32),
    "t.arr_u8": ([0, 7, 255], GGUFValueType.UINT8), "t.arr_u64": ([2**64 - 1, 0], GGUFValueType.UINT64),
    "t.arr_bool": ([True, False, True], GGUFValueType.BOOL),
    "t.arr_str": (["a", "", "ü", "<0x0A>", "x" * 300], GGUFValueType.STRING),
    "t.arr_nested": ([[1, 2], [3], [4, 5, 6]], GGUFValueType.ARRAY),
    "t.arr_nested_str": ([["a", "b"], ["c"]], GGUFValueType.ARRAY),
}

