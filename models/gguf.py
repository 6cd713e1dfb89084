"""A from-scratch GGUF reader: metadata, tensor infos, and zero-copy tensor data through a read-only mmap.

A model file is untrusted input. Every count, length and offset is checked against the bytes the file
actually has before anything is allocated, so a malformed file fails fast with one GGUFError that names
the field and the byte offset, never a hang, a huge allocation or a foreign exception.

Layout (little-endian, v2/v3):
    magic "GGUF" | u32 version | u64 n_tensors | u64 n_kv
    n_kv x (string key | u32 value type | value)
    n_tensors x (string name | u32 n_dims | n_dims x u64 dim | u32 ggml type | u64 offset)
    padding to general.alignment | tensor data (offsets relative to here, each aligned)
"""
import mmap
import os
import re
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from models.errors import UserError
from models.ggml_types import TYPES_BY_ID, GGMLType

GGUF_MAGIC = b"GGUF"
DEFAULT_ALIGNMENT = 32
MAX_NAME_BYTES = 64  # ggml's GGML_MAX_NAME, terminator included
MAX_STRING_BYTES = 1 << 30
MAX_ARRAY_DEPTH = 8
MAX_DIMS = 4

# GGUF value types: id -> (name, struct format); string and array have none
VALUE_TYPES: dict[int, tuple[str, str | None]] = {
    0: ("uint8", "<B"), 1: ("int8", "<b"), 2: ("uint16", "<H"), 3: ("int16", "<h"), 4: ("uint32", "<I"),
    5: ("int32", "<i"), 6: ("float32", "<f"), 7: ("bool", "<B"), 8: ("string", None), 9: ("array", None),
    10: ("uint64", "<Q"), 11: ("int64", "<q"), 12: ("float64", "<d"),
}
T_UINT32, T_BOOL, T_STRING, T_ARRAY = 4, 7, 8, 9
INTEGER_TYPES = {0, 1, 2, 3, 4, 5, 10, 11}
SCALARS = {t: struct.Struct(fmt) for t, (_, fmt) in VALUE_TYPES.items() if fmt is not None}
DTYPES = {t: np.dtype(fmt) for t, (_, fmt) in VALUE_TYPES.items() if fmt is not None}  # array elements
U32, U64, ARRAY_HEADER, TENSOR_TAIL = (struct.Struct(f) for f in ("<I", "<Q", "<IQ", "<IQ"))
HEADER_COUNTS = struct.Struct("<QQ")
DIMS = [struct.Struct(f"<{n}Q") for n in range(MAX_DIMS + 1)]

SPLIT_RE = re.compile(r"^(?P<prefix>.*)-(?P<no>\d{5})-of-(?P<count>\d{5})\.gguf$")


class GGUFError(UserError, ValueError):
    """A file that is not a valid GGUF model. The message names the field and the byte offset."""


@dataclass(frozen=True)
class TensorInfo:
    name: str
    shape: tuple[int, ...]  # ggml order: shape[0] is the contiguous (row) dimension
    type: GGMLType
    offset: int  # absolute byte offset of the data in its file
    nbytes: int
    part: int = 0  # which file of a split model holds the data

    @property
    def n_elems(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n


class _Cursor:
    """Bounds-checked little-endian reads over the mapped file."""

    def __init__(self, buf: mmap.mmap, size: int, path: str):
        self.buf, self.pos, self.size, self.path = buf, 0, size, path

    def fail(self, what: str, at: int | None = None) -> GGUFError:
        return GGUFError(f"{self.path}: {what} (at byte {self.pos if at is None else at})")

    def need(self, n: int, what: str) -> None:
        if self.pos + n > self.size:
            raise self.fail(f"{what}: needs {n} bytes but the file ends at byte {self.size}; "
                            "it is truncated or corrupted")

    def unpack(self, fmt: struct.Struct, what: str):
        self.need(fmt.size, what)
        vals = fmt.unpack_from(self.buf, self.pos)
        self.pos += fmt.size
        return vals[0] if len(vals) == 1 else vals

    def string(self, what: str, limit: int = MAX_STRING_BYTES) -> str:
        start = self.pos
        n = self.unpack(U64, f"{what} length")
        if n > limit:
            raise self.fail(f"{what}: length {n} exceeds the limit of {limit} bytes", start)
        self.need(n, what)
        try:
            s = self.buf[self.pos:self.pos + n].decode("utf-8")
        except UnicodeDecodeError:
            raise self.fail(f"{what}: not valid UTF-8", start) from None
        self.pos += n
        return s

    def strings(self, count: int, what: str) -> list[str]:
        """count strings in a tight loop (a 262k-token vocabulary is the bulk of a header); on any problem
        the checked path walks them again to name the element and byte offset."""
        buf, pos, size, unpack_len = self.buf, self.pos, self.size, U64.unpack_from
        raw = []
        for _ in range(count):
            if pos + 8 > size:
                break
            (n,) = unpack_len(buf, pos)
            end = pos + 8 + n
            if n > MAX_STRING_BYTES or end > size:
                break
            raw.append(buf[pos + 8:end])
            pos = end
        else:
            try:
                strings = list(map(bytes.decode, raw))
            except UnicodeDecodeError:
                pass
            else:
                self.pos = pos
                return strings
        return [self.string(f"{what}[{i}]") for i in range(count)]

    def array(self, what: str, depth: int = 0):
        start = self.pos
        if depth >= MAX_ARRAY_DEPTH:
            raise self.fail(f"{what}: arrays nested deeper than {MAX_ARRAY_DEPTH}", start)
        etype, count = self.unpack(ARRAY_HEADER, f"{what} array header")
        if etype not in VALUE_TYPES:
            raise self.fail(f"{what}: unknown array element type {etype}", start)
        dtype = DTYPES.get(etype)
        # every element needs at least this many bytes, so a huge count fails before any allocation
        min_elem = dtype.itemsize if dtype else (8 if etype == T_STRING else 12)
        if count > (self.size - self.pos) // min_elem:
            raise self.fail(f"{what}: array of {count} elements does not fit in the file; "
                            "it is truncated or corrupted", start)
        if dtype is not None:
            arr = np.frombuffer(self.buf, dtype=dtype, count=count, offset=self.pos).copy()
            self.pos += count * dtype.itemsize
            return arr.astype(bool) if etype == T_BOOL else arr
        if etype == T_STRING:
            return self.strings(count, what)
        return [self.array(f"{what}[{i}]", depth + 1) for i in range(count)]

    def value(self, vtype: int, what: str):
        if vtype == T_STRING:
            return self.string(what)
        if vtype == T_ARRAY:
            return self.array(what)
        v = self.unpack(SCALARS[vtype], what)
        return bool(v) if vtype == T_BOOL else v


class GGUFFile:
    """One .gguf file: parsed header, metadata and tensor infos; tensor data stays in the mmap."""

    def __init__(self, path: str | Path, part: int = 0):
        self.path = Path(path)
        if not self.path.is_file():  # a FIFO or device would block or lie about its size
            what = "does not exist" if not self.path.exists() else "is not a regular file"
            raise GGUFError(f"{self.path}: {what}")
        try:
            with open(self.path, "rb") as f:
                self.file_size = os.fstat(f.fileno()).st_size
                if self.file_size < 24:
                    raise GGUFError(f"{self.path}: {self.file_size} bytes is too short for a GGUF header "
                                    "(at byte 0)")
                self._mmap = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        except OSError as e:
            raise GGUFError(f"{self.path}: cannot open: {e.strerror}") from None
        try:
            self._parse(part)
        except BaseException:
            self._mmap.close()
            raise

    def _parse(self, part: int) -> None:
        c = _Cursor(self._mmap, self.file_size, str(self.path))
        magic = self._mmap[:4]
        if magic != GGUF_MAGIC:
            raise c.fail(f"bad magic {magic!r}, not a GGUF file")
        c.pos = 4
        version = c.unpack(U32, "version")
        if version not in (2, 3):
            if version == 1:
                raise c.fail("GGUF version 1 (from before September 2023) is not supported; "
                             "convert the model again with a current llama.cpp", 4)
            swapped = int.from_bytes(version.to_bytes(4, "little"), "big")
            if swapped in (1, 2, 3):
                raise c.fail("big-endian GGUF files are not supported", 4)
            raise c.fail(f"unsupported GGUF version {version} (only 2 and 3 are supported)", 4)
        self.version = version
        n_tensors, n_kv = c.unpack(HEADER_COUNTS, "tensor and metadata counts")
        # a key-value pair takes at least 8 (key length) + 1 (key) + 4 (type) + 1 (value) bytes,
        # a tensor info at least 8 (name length) + 4 (n_dims) + 8 (one dim) + 4 (type) + 8 (offset)
        if n_tensors > (self.file_size - c.pos) // 32:
            raise c.fail(f"tensor count {n_tensors} cannot fit in the file", 8)
        if n_kv > (self.file_size - c.pos) // 14:
            raise c.fail(f"metadata count {n_kv} cannot fit in the file", 16)

        self.metadata: dict[str, Any] = {}
        self.value_types: dict[str, int] = {}
        for i in range(n_kv):
            start = c.pos
            key = c.string(f"metadata key #{i}")
            if not key:
                raise c.fail(f"metadata key #{i} is empty", start)
            if key in self.metadata:
                raise c.fail(f"duplicate metadata key {key!r}", start)
            vtype = c.unpack(U32, f"type of {key!r}")
            if vtype not in VALUE_TYPES:
                raise c.fail(f"unknown value type {vtype} for key {key!r}", c.pos - 4)
            value_at = c.pos
            self.metadata[key] = c.value(vtype, f"value of {key!r}")
            self.value_types[key] = vtype
            if key == "general.alignment":
                a = self.metadata[key]
                if vtype != T_UINT32:
                    raise c.fail(f"general.alignment must be a uint32, not a {VALUE_TYPES[vtype][0]}", value_at)
                if a == 0 or a & (a - 1):
                    raise c.fail(f"general.alignment {a} is not a power of two", value_at)
        self.alignment = self.metadata.get("general.alignment", DEFAULT_ALIGNMENT)

        infos = []
        for i in range(n_tensors):
            start = c.pos
            name = c.string(f"tensor #{i} name", limit=MAX_NAME_BYTES - 1)
            n_dims = c.unpack(U32, f"tensor {name!r} n_dims")
            if not 1 <= n_dims <= MAX_DIMS:
                raise c.fail(f"tensor {name!r} has n_dims {n_dims}, must be 1..{MAX_DIMS}", c.pos - 4)
            shape = c.unpack(DIMS[n_dims], f"tensor {name!r} dims")
            shape = (shape,) if n_dims == 1 else shape
            type_id, offset = c.unpack(TENSOR_TAIL, f"tensor {name!r} type and offset")
            if type_id not in TYPES_BY_ID:
                raise c.fail(f"tensor {name!r} has unknown ggml type {type_id}", c.pos - 12)
            infos.append((start, name, shape, TYPES_BY_ID[type_id], offset))

        self.data_offset = -(-c.pos // self.alignment) * self.alignment
        self.tensors: dict[str, TensorInfo] = {}
        data_size = self.file_size - self.data_offset
        end_of_previous = 0
        for start, name, shape, t, offset in infos:
            if name in self.tensors:
                raise c.fail(f"duplicate tensor name {name!r}", start)
            n = 1
            for d in shape:
                if d < 1:
                    raise c.fail(f"tensor {name!r} has a dimension of {d}", start)
                n *= d  # python ints: no overflow; bounded just below
                if n >= 1 << 63:
                    raise c.fail(f"tensor {name!r} shape {shape} has too many elements", start)
            if shape[0] % t.block_elems:
                raise c.fail(f"tensor {name!r} row of {shape[0]} is not a multiple of the "
                             f"{t.name} block size {t.block_elems}", start)
            nbytes = t.nbytes(n)
            if offset % self.alignment:
                raise c.fail(f"tensor {name!r} data offset {offset} is not aligned to {self.alignment}", start)
            if offset < end_of_previous:
                raise c.fail(f"tensor {name!r} data at offset {offset} overlaps or precedes the "
                             f"previous tensor (which ends at {end_of_previous})", start)
            if offset + nbytes > data_size:
                raise c.fail(f"tensor {name!r} data is not within the file bounds "
                             f"(needs bytes {self.data_offset + offset}..{self.data_offset + offset + nbytes}"
                             f" of a {self.file_size}-byte file); the model is corrupted or incomplete", start)
            end_of_previous = offset + nbytes
            self.tensors[name] = TensorInfo(name, shape, t, self.data_offset + offset, nbytes, part)

    def tensor_bytes(self, info: TensorInfo) -> np.ndarray:
        """The raw blocks of a tensor as a read-only uint8 view into the mmap (no copy)."""
        return np.frombuffer(self._mmap, dtype=np.uint8, count=info.nbytes, offset=info.offset)

    def close(self) -> None:
        try:
            self._mmap.close()
        except BufferError:  # numpy views still alive: the map closes when they go
            pass


class GGUFModel:
    """A model as one object: a single .gguf file or all parts of a split model (name-0000N-of-0000M.gguf).

    Parts are written like llama.cpp's gguf-split: every part carries split.no (0-based) and split.count,
    the first holds the metadata and split.tensors.count, and each tensor lives in exactly one part.
    """

    def __init__(self, path: str | Path):
        path = Path(path)
        paths = split_part_paths(path)
        self.files: list[GGUFFile] = []
        try:
            for i, p in enumerate(paths):
                self.files.append(GGUFFile(p, part=i))
            self._join_parts()
        except BaseException:
            self.close()
            raise
        first = self.files[0]
        self.path, self.version, self.alignment = path, first.version, first.alignment
        self.metadata = first.metadata
        self.value_types = first.value_types

    def _join_parts(self) -> None:
        self.tensors: dict[str, TensorInfo] = {}
        for f in self.files:
            for name, info in f.tensors.items():
                if name in self.tensors:
                    raise GGUFError(f"{f.path}: tensor {name!r} appears in two parts of the split model "
                                    f"(at byte {info.offset})")
                self.tensors[name] = info
        if len(self.files) == 1:
            return
        for i, f in enumerate(self.files):
            no, count = _int_key(f, "split.no"), _int_key(f, "split.count")
            if (no, count) != (i, len(self.files)):
                raise GGUFError(f"{f.path}: its split.no {no} and split.count {count} do not make it part "
                                f"{i + 1} of {len(self.files)} (at byte 0)")
        expected = _int_key(self.files[0], "split.tensors.count")
        if expected != len(self.tensors):
            raise GGUFError(f"{self.files[0].path}: split.tensors.count says {expected} tensors but the "
                            f"{len(self.files)} parts hold {len(self.tensors)} (at byte 0)")

    @property
    def file_size(self) -> int:
        return sum(f.file_size for f in self.files)

    def tensor_bytes(self, name: str) -> np.ndarray:
        info = self.tensors[name]
        return self.files[info.part].tensor_bytes(info)

    def close(self) -> None:
        for f in self.files:
            f.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _int_key(f: GGUFFile, key: str) -> int:
    if f.value_types.get(key) not in INTEGER_TYPES:
        raise GGUFError(f"{f.path}: part of a split model without an integer {key} (at byte 0)")
    return f.metadata[key]


def split_part_paths(path: Path) -> list[Path]:
    """All parts of a split model, given any one of them; [path] for an ordinary file."""
    m = SPLIT_RE.match(path.name)
    if not m:
        return [path]
    count = int(m["count"])
    if not 1 <= int(m["no"]) <= count:
        raise GGUFError(f"{path}: the name says part {m['no']} of {m['count']}, which cannot be")
    paths = [path.with_name(f"{m['prefix']}-{i:05d}-of-{count:05d}.gguf") for i in range(1, count + 1)]
    missing = [p.name for p in paths if not p.exists()]
    if missing:
        more = f" and {len(missing) - 1} more" if len(missing) > 1 else ""
        raise GGUFError(f"{path}: this split model has {count} parts; missing {missing[0]}{more}")
    return paths


def open_gguf(path: str | Path) -> GGUFModel:
    return GGUFModel(path)
