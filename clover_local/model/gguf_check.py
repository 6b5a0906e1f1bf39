"""A GGUF's structure and hyperparameters checked before anything else reads it.

gguf-py's reader raises IndexError on a truncated file and believes a `tensor_count` of 2^63;
llama.cpp aborts, hangs or divides by zero on valid-but-absurd values (`expert_count` 0, a NaN
norm epsilon, a rotary dimension count of 0). `check_gguf` walks the file with every length,
count and offset bounded by the bytes actually there (the rules of llama.cpp's `gguf_init`), then
range-checks the Clover hyperparameters against `hparam_limits`. It runs before `GGUFReader` and
`llama_model_load`, for the runtime and for `clover info`; a failure is one line naming the key.
"""

from __future__ import annotations

import math
import mmap
import re
import struct
from pathlib import Path
from typing import Any

from . import gguf_names as gn
from .hparam_limits import LIMITS, check_values

VERSIONS = (2, 3)
MAX_NAME = 63  # GGML_MAX_NAME - 1
MAX_DIMS = 4
# GGUF value type -> struct format (8 is a string, 9 an array)
_SCALARS = dict(enumerate(("<B", "<b", "<H", "<h", "<I", "<i", "<f", "<?"))) | {10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9
SPLIT = re.compile(r"-(\d{5})-of-(\d{5})\.gguf$")


class GGUFError(ValueError):
    """The file is not a well-formed GGUF, or holds a value llama.cpp cannot run."""


class _Cursor:
    """Bounded little-endian reads over the file's bytes."""

    def __init__(self, buf: Any, name: str):
        self.buf, self.pos, self.name = buf, 0, name

    def take(self, n: int, what: str) -> bytes:
        if n < 0 or self.pos + n > len(self.buf):
            raise GGUFError(f"{self.name}: truncated GGUF (ends inside {what})")
        out = self.buf[self.pos : self.pos + n]
        self.pos += n
        return out

    def scalar(self, vtype: int, what: str) -> Any:
        fmt = _SCALARS[vtype]
        return struct.unpack(fmt, self.take(struct.calcsize(fmt), what))[0]

    def u32(self, what: str) -> int:
        return self.scalar(4, what)

    def u64(self, what: str) -> int:
        return self.scalar(10, what)

    def string(self, what: str) -> bytes:
        return self.take(self.u64(what), what)

    @property
    def left(self) -> int:
        return len(self.buf) - self.pos


def read_structure(path: Path) -> tuple[dict[str, Any], dict[str, tuple[int, tuple[int, ...]]]]:
    """(key -> value, tensor -> (ggml type, shape)) of a structurally valid GGUF, else GGUFError.

    Scalars and strings are decoded; an array comes back as its length (its elements are not
    needed by any check), except the token list, whose length is the vocabulary size.
    """
    name = path.name
    try:
        with open(path, "rb") as f:
            size = f.seek(0, 2)
            if size < 24:
                raise GGUFError(f"{name}: truncated GGUF ({size} bytes, the header alone is 24)")
            with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
                return _walk(_Cursor(buf, name), size)
    except OSError as e:
        raise GGUFError(f"{path}: cannot read ({e.strerror})") from None


def _walk(c: _Cursor, size: int) -> tuple[dict[str, Any], dict[str, tuple[int, tuple[int, ...]]]]:
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    if c.take(4, "the magic") != b"GGUF":
        raise GGUFError(f"{c.name}: not a GGUF file")
    version = c.u32("the header")
    if version not in VERSIONS:
        raise GGUFError(f"{c.name}: GGUF version {version} is not supported (2 or 3)")
    n_tensors, n_kv = c.u64("the header"), c.u64("the header")
    if n_kv > c.left // 13:  # a key/value takes at least 8 + 1 + 4 bytes
        raise GGUFError(f"{c.name}: truncated or corrupt GGUF: {n_kv} key/values do not fit in {size} bytes")
    if n_tensors > c.left // 25:  # a tensor info takes at least 8 + 1 + 4 + 8 + 4 bytes
        raise GGUFError(
            f"{c.name}: truncated or corrupt GGUF: {n_tensors} tensor infos do not fit in {size} bytes"
        )
    meta: dict[str, Any] = {}
    for _ in range(n_kv):
        key = _text(c, c.string("a key"), "a key")
        if key in meta:
            raise GGUFError(f"{c.name}: duplicate key {key}")
        meta[key] = _value(c, c.u32(key), key)
    tensors: dict[str, tuple[int, tuple[int, ...]]] = {}
    ranges: list[tuple[int, int, str]] = []
    for _ in range(n_tensors):
        tname = _text(c, c.string("a tensor name"), "a tensor name")
        if len(tname.encode()) > MAX_NAME or tname in tensors:
            raise GGUFError(f"{c.name}: tensor name {tname[:80]!r} is too long or repeated")
        n_dims = c.u32(tname)
        if not 1 <= n_dims <= MAX_DIMS:
            raise GGUFError(f"{c.name}: tensor {tname} has {n_dims} dimensions (1..{MAX_DIMS})")
        shape = tuple(c.u64(tname) for _ in range(n_dims))
        ttype, offset = c.u32(tname), c.u64(tname)
        if ttype not in GGMLQuantizationType._value2member_map_:
            raise GGUFError(f"{c.name}: tensor {tname} has unknown type {ttype}")
        block, nbytes_per_block = GGML_QUANT_SIZES[GGMLQuantizationType(ttype)]
        n = math.prod(shape)
        if any(d >= 2**62 for d in shape) or n >= 2**62 or shape[0] % block:
            raise GGUFError(f"{c.name}: tensor {tname} has an impossible shape for its type")
        tensors[tname] = (ttype, shape)
        ranges.append((offset, offset + n // block * nbytes_per_block, tname))
    align = meta.get("general.alignment", 32)
    if not isinstance(align, int) or align <= 0 or align & (align - 1):
        raise GGUFError(f"{c.name}: general.alignment must be a power of two")
    data = c.pos + (-c.pos) % align
    end = data if ranges else c.pos  # no tensors: no padded data section
    for start, stop, tname in sorted(ranges):
        if start % align or start < end - data:
            raise GGUFError(f"{c.name}: tensor {tname} data is misaligned or overlaps another tensor")
        end = data + stop
    if end > size:
        raise GGUFError(f"{c.name}: truncated GGUF (tensor data ends at byte {end}, file has {size})")
    return meta, tensors


def _value(c: _Cursor, vtype: int, key: str) -> Any:
    if vtype in _SCALARS:
        return c.scalar(vtype, key)
    if vtype == _STRING:
        return _text(c, c.string(key), key, strict=False)
    if vtype != _ARRAY:
        raise GGUFError(f"{c.name}: key {key} has unknown value type {vtype}")
    etype, count = c.u32(key), c.u64(key)
    if etype in _SCALARS:
        c.take(count * struct.calcsize(_SCALARS[etype]), key)
    elif etype == _STRING:
        if count > c.left // 8:
            raise GGUFError(f"{c.name}: truncated GGUF (ends inside {key})")
        for _ in range(count):
            c.string(key)
    else:
        raise GGUFError(f"{c.name}: key {key} is an array of type {etype} (nested arrays are not GGUF)")
    return _Array(count)


class _Array(int):
    """An array value, standing for its length."""


def _text(c: _Cursor, raw: bytes, what: str, strict: bool = True) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        if strict:
            raise GGUFError(f"{c.name}: {what} is not UTF-8") from None
        return raw.decode("utf-8", "replace")


def check_gguf(path: Path) -> dict[str, Any]:
    """Structure of the file (and of every part of a split file), then the Clover hyperparameters.

    Returns the decoded key/values of the first part.
    """
    meta, _ = read_structure(path)
    parts = int(meta.get("split.count", 1) or 1)
    if parts > 1 and SPLIT.search(path.name):
        for i in range(2, parts + 1):
            part = path.with_name(SPLIT.sub(f"-{i:05d}-of-{parts:05d}.gguf", path.name))
            if not part.is_file():
                raise GGUFError(f"{part}: missing part {i} of {parts} of a split GGUF")
            read_structure(part)
    if meta.get("general.architecture") == gn.ARCH:
        check_hparams(path.name, meta)
    return meta


def check_hparams(name: str, meta: dict[str, Any]) -> None:
    """Every `hparam_limits` row present in the file, the mask and end-of-generation ids."""
    values = {k: (None if isinstance(v, _Array) else v) for k, v in meta.items()}
    bad = check_values(values, LIMITS, by_key=True)
    if bad:
        lim, value, why = bad
        raise GGUFError(f"{name}: {lim.key} is {value}: {why}")
    vocab = meta.get("tokenizer.ggml.tokens")
    for key in (gn.MASK_TOKEN_ID, "tokenizer.ggml.eos_token_id"):
        tid = meta.get(key)
        if isinstance(vocab, _Array) and isinstance(tid, int) and not 0 <= tid < vocab:
            raise GGUFError(f"{name}: {key} is {tid}: not a token of the {int(vocab)}-token vocabulary")
