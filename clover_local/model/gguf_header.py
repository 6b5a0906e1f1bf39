"""A GGUF file's header (metadata and tensor infos) read in milliseconds, without its weights.

`gguf.GGUFReader` builds numpy views of every item of every array, so a 150k-250k-token vocabulary
(three arrays of that length) costs it 6-9 s in Python. The runtime needs none of those strings
(llama.cpp loads the vocabulary itself), so here a string array is skipped by walking its length
prefixes and kept as its item count (`StringArray`); everything else is decoded to plain Python
values. Every read is bounds-checked: a truncated or corrupt header is one `HeaderError` line.
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

MAGIC = b"GGUF"
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
    def __init__(self, buf: memoryview):
        self.buf, self.pos = buf, 0

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

    def skip_strings(self, count: int) -> None:
        """Step over `count` strings reading only their length prefixes (a vocabulary: ~0.1 s)."""
        length, pos = _U64.unpack_from, self.pos
        for _ in range(count):
            pos += 8 + length(self.buf, pos)[0]
        if pos > len(self.buf):
            raise HeaderError(f"truncated in a string array ending past byte {len(self.buf)}")
        self.pos = pos

    def value(self, vtype: int) -> Any:
        if vtype == STRING:
            return self.string()
        if vtype == ARRAY:
            return self.array()
        if vtype not in SCALARS:
            raise HeaderError(f"unknown value type {vtype} at byte {self.pos}")
        v = self.scalar(SCALARS[vtype])
        return float(str(np.float32(v))) if vtype == F32 else v  # 0.95, not 0.949999988

    def array(self) -> Any:
        itype, count = self.scalar("<I"), self.scalar("<Q")
        if itype == STRING:
            self.skip_strings(count)
            return StringArray(count)
        if itype == ARRAY:
            return [self.array() for _ in range(count)]
        if itype not in NUMPY:
            raise HeaderError(f"unknown array item type {itype} at byte {self.pos}")
        dtype = np.dtype(NUMPY[itype])
        items = np.frombuffer(self.take(count * dtype.itemsize), dtype=dtype)
        if itype == F32:
            return [float(str(x)) for x in items]
        return items.tolist()


def read_header(path: str | Path) -> Header:
    """The metadata and tensor infos of a GGUF file; `HeaderError` where it is not one."""
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
        view = memoryview(m)
        try:
            return _parse(_Cursor(view))
        except struct.error as e:
            raise HeaderError(f"corrupt header ({e})") from None
        finally:
            view.release()


def _parse(cur: _Cursor) -> Header:
    if bytes(cur.take(4)) != MAGIC:
        raise HeaderError("not a GGUF file (no GGUF magic)")
    version, n_tensors, n_kv = cur.scalar("<I"), cur.scalar("<Q"), cur.scalar("<Q")
    if version not in (2, 3):
        raise HeaderError(f"unsupported GGUF version {version} (2 or 3)")
    metadata = {}
    for _ in range(n_kv):
        key = cur.string()
        metadata[key] = cur.value(cur.scalar("<I"))
    tensors = []
    for _ in range(n_tensors):
        name, n_dims = cur.string(), cur.scalar("<I")
        if n_dims > 4:
            raise HeaderError(f"tensor {name!r} has {n_dims} dimensions (at most 4)")
        shape = tuple(cur.scalar("<Q") for _ in range(n_dims))
        ggml_type, _offset = cur.scalar("<I"), cur.scalar("<Q")
        tensors.append(TensorInfo(name, shape, ggml_type))
    return Header(version, metadata, tensors)
