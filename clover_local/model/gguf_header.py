"""A GGUF file's header (metadata and tensor infos) read in milliseconds, without its weights.

`gguf.GGUFReader` builds numpy views of every item of every array, so a 150k-250k-token vocabulary
(three arrays of that length) costs it 6-9 s in Python. The runtime needs none of those strings
(llama.cpp loads the vocabulary itself), so here a string array is skipped by walking its length
prefixes and kept as its item count (`StringArray`); everything else is decoded to plain Python
values. Every length, count and offset is bounded by the bytes actually there (the rules of
llama.cpp's `gguf_init`: known types, no nested arrays, UTF-8 keys and tensor names of at most 63
bytes, none repeated, 1-4 dimensions, aligned tensor data inside the file, not overlapping), so
gguf-py's reader (which raises IndexError on a truncated file and believes a `tensor_count` of
2^63) and llama.cpp only ever see a well-formed file: anything else is one `HeaderError` line.
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

MAGIC = b"GGUF"
VERSIONS = (2, 3)
MAX_NAME = 63  # GGML_MAX_NAME - 1
MAX_DIMS = 4
HEADER_BYTES = 24  # magic, version, tensor count, key/value count
MIN_KV_BYTES = 8 + 4 + 1  # a key's length prefix, its value type, a one-byte value
MIN_TENSOR_BYTES = 8 + 4 + 8 + 4 + 8  # name length prefix, n_dims, one dimension, type, offset
# GGUF value types: struct format of the scalars; 8 is a string, 9 an array
SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?"}
SCALARS.update({10: "<Q", 11: "<q", 12: "<d"})
STRING, ARRAY, F32 = 8, 9, 6
_U64 = struct.Struct("<Q")
NUMPY = {vtype: np.dtype(fmt) for vtype, fmt in SCALARS.items()}


class HeaderError(ValueError):
    """The file is not a readable GGUF header; the message says where it broke."""


@dataclass(frozen=True)
class StringArray:
    """A string array left unread (a vocabulary, its merges): only its length is known."""

    count: int

    def __len__(self) -> int:
        return self.count


@dataclass(frozen=True)
class TensorInfo:
    name: str
    shape: tuple[int, ...]
    type: int  # ggml type id

    @property
    def n_elements(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) if self.shape else 1


@dataclass(frozen=True)
class Header:
    version: int
    metadata: dict[str, Any]
    tensors: list[TensorInfo]


class _Cursor:
    def __init__(self, buf: memoryview, decode: frozenset[str] = frozenset()):
        self.buf, self.pos = buf, 0
        self.decode = decode  # the keys whose string arrays are read, not skipped

    @property
    def left(self) -> int:
        return len(self.buf) - self.pos

    def take(self, n: int) -> memoryview:
        if n < 0 or self.pos + n > len(self.buf):
            raise HeaderError(f"truncated at byte {self.pos} (needs {n} more bytes)")
        view = self.buf[self.pos : self.pos + n]
        self.pos += n
        return view

    def scalar(self, fmt: str) -> Any:
        return struct.unpack(fmt, self.take(struct.calcsize(fmt)))[0]

    def string(self) -> str:
        return bytes(self.take(self.scalar("<Q"))).decode("utf-8", "replace")

    def name(self, what: str) -> str:
        """A key or tensor name: UTF-8 (llama.cpp refuses anything else)."""
        raw = bytes(self.take(self.scalar("<Q")))
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            raise HeaderError(f"{what} at byte {self.pos - len(raw)} is not UTF-8") from None

    def skip_strings(self, count: int) -> None:
        """Step over `count` strings reading only their length prefixes (a vocabulary: ~0.1 s)."""
        if count > self.left // 8:
            raise HeaderError(f"truncated: {count} strings do not fit in the {self.left} bytes left")
        length, pos = _U64.unpack_from, self.pos
        for _ in range(count):
            pos += 8 + length(self.buf, pos)[0]
        if pos > len(self.buf):
            raise HeaderError(f"truncated in a string array ending past byte {len(self.buf)}")
        self.pos = pos

    def value(self, vtype: int, key: str = "") -> Any:
        if vtype == STRING:
            return self.string()
        if vtype == ARRAY:
            return self.array(key in self.decode)
        if vtype not in SCALARS:
            raise HeaderError(f"unknown value type {vtype} at byte {self.pos}")
        v = self.scalar(SCALARS[vtype])
        return float(str(np.float32(v))) if vtype == F32 else v  # 0.95, not 0.949999988

    def array(self, decode: bool = False) -> Any:
        itype, count = self.scalar("<I"), self.scalar("<Q")
        if itype == STRING and decode:
            if count > self.left // 8:
                raise HeaderError(f"truncated: {count} strings do not fit in the {self.left} bytes left")
            return [self.string() for _ in range(count)]
        if itype == STRING:
            self.skip_strings(count)
            return StringArray(count)
        if itype == ARRAY:
            raise HeaderError(f"nested array at byte {self.pos} (not GGUF)")
        if itype not in NUMPY:
            raise HeaderError(f"unknown array item type {itype} at byte {self.pos}")
        dtype = np.dtype(NUMPY[itype])
        items = np.frombuffer(self.take(count * dtype.itemsize), dtype=dtype)
        if itype == F32:
            return [float(str(x)) for x in items]
        return items.tolist()


def read_header(path: str | Path) -> Header:
    """The metadata and tensor infos of a GGUF file; `HeaderError` where it is not one."""
    with open(path, "rb") as f:
        size = f.seek(0, 2)
        if size < HEADER_BYTES:
            raise HeaderError(f"truncated ({size} bytes, the header alone is {HEADER_BYTES})")
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
            view = memoryview(m)
            try:
                return parse(view)
            finally:
                view.release()


def parse(data: bytes | memoryview, decode: tuple[str, ...] = ()) -> Header:
    """`read_header` of a GGUF held in memory; the string arrays of the keys in `decode` are read
    (a vocabulary's tokens and merges, when a caller needs them) instead of skipped."""
    try:
        # a memoryview is used as given: a second view of an mmap would outlive the mmap's close
        # in an error's traceback (BufferError instead of the HeaderError)
        buf = data if isinstance(data, memoryview) else memoryview(data)
        return _parse(_Cursor(buf, frozenset(decode)))
    except struct.error as e:
        raise HeaderError(f"corrupt header ({e})") from None


def _parse(cur: _Cursor) -> Header:
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    if bytes(cur.take(4)) != MAGIC:
        raise HeaderError("not a GGUF file (no GGUF magic)")
    version, n_tensors, n_kv = cur.scalar("<I"), cur.scalar("<Q"), cur.scalar("<Q")
    size = len(cur.buf)
    if version not in VERSIONS:
        raise HeaderError(f"unsupported GGUF version {version} (2 or 3)")
    if n_kv > cur.left // MIN_KV_BYTES:
        raise HeaderError(f"truncated or corrupt: {n_kv} key/values do not fit in {size} bytes")
    if n_tensors > cur.left // MIN_TENSOR_BYTES:
        raise HeaderError(f"truncated or corrupt: {n_tensors} tensor infos do not fit in {size} bytes")
    metadata: dict[str, Any] = {}
    for _ in range(n_kv):
        key = cur.name("a key")
        if key in metadata:
            raise HeaderError(f"duplicate key {key}")
        metadata[key] = cur.value(cur.scalar("<I"), key)
    tensors, extents, names = [], [], set()
    for _ in range(n_tensors):
        name, n_dims = cur.name("a tensor name"), cur.scalar("<I")
        if len(name.encode()) > MAX_NAME or name in names:
            raise HeaderError(f"tensor name {name[:80]!r} is too long or repeated")
        if not 1 <= n_dims <= MAX_DIMS:
            raise HeaderError(f"tensor {name!r} has {n_dims} dimensions (1 to {MAX_DIMS})")
        shape = tuple(cur.scalar("<Q") for _ in range(n_dims))
        ggml_type, offset = cur.scalar("<I"), cur.scalar("<Q")
        if ggml_type not in GGMLQuantizationType._value2member_map_:
            raise HeaderError(f"tensor {name!r} has unknown type {ggml_type}")
        block, block_bytes = GGML_QUANT_SIZES[GGMLQuantizationType(ggml_type)]
        info = TensorInfo(name, shape, ggml_type)
        if any(d >= 2**62 for d in shape) or info.n_elements >= 2**62 or shape[0] % block:
            raise HeaderError(f"tensor {name!r} has an impossible shape for its type")
        names.add(name)
        tensors.append(info)
        extents.append((offset, offset + info.n_elements // block * block_bytes, name))
    _check_data(cur, metadata.get("general.alignment", 32), extents)
    return Header(version, metadata, tensors)


def _check_data(cur: _Cursor, align: Any, extents: list[tuple[int, int, str]]) -> None:
    """Tensor data aligned, not overlapping and inside the file, as llama.cpp requires."""
    if isinstance(align, bool) or not isinstance(align, int) or align <= 0 or align & (align - 1):
        raise HeaderError("general.alignment must be a power of two")
    data = cur.pos + (-cur.pos) % align
    end = data if extents else cur.pos  # no tensors: no padded data section
    for start, stop, name in sorted(extents):
        if start % align or data + start < end:
            raise HeaderError(f"tensor {name!r} data is misaligned or overlaps another tensor")
        end = data + stop
    if end > len(cur.buf):
        raise HeaderError(f"truncated: tensor data ends at byte {end}, the file has {len(cur.buf)}")
