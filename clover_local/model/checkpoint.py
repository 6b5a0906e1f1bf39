"""Reading a Clover safetensors checkpoint, shared by the converter and the numpy reference.

Shards are memory-mapped and parsed here (the safetensors format is an 8-byte header length, a JSON
header, then raw little-endian data), so a tensor is read only when asked for, BF16 needs no torch,
and a truncated or corrupt shard is named precisely. Names are canonicalised: the `model.` or
`model.language_model.` prefix is stripped, and both expert layouts (fused `gate_up_proj` and
per-expert `experts.E.{gate,up,down}_proj`) are served through one accessor.
"""

from __future__ import annotations

import ctypes
import json
import mmap
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .config import CheckpointConfig, CloverConfig

PREFIXES = ("model.language_model.", "model.")
INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"
_DTYPES = {
    "BF16": (np.uint16, 2),
    "F16": (np.float16, 2),
    "F32": (np.float32, 4),
    "F64": (np.float64, 8),
}


class CheckpointError(ValueError):
    """A checkpoint file or tensor is missing, unreadable or inconsistent with its config."""


@dataclass(frozen=True)
class TensorEntry:
    """Where one stored tensor lives: shard file, dtype, shape and byte range."""

    key: str  # name as stored in the file
    path: Path
    dtype: str
    shape: tuple[int, ...]
    start: int  # absolute byte offset in the file
    end: int


def read_safetensors_header(path: Path) -> dict[str, TensorEntry]:
    """Parse one shard's header, checking that every tensor lies inside the file."""
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            head = f.read(8)
            if len(head) < 8:
                raise CheckpointError(f"{path.name}: truncated safetensors file (no header)")
            n = int.from_bytes(head, "little")
            if n <= 0 or 8 + n > size:
                raise CheckpointError(
                    f"{path.name}: corrupt safetensors header (length {n}, file {size} bytes)"
                )
            header = json.loads(f.read(n))
    except OSError as e:
        raise CheckpointError(f"{path}: cannot read ({e.strerror})") from None
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise CheckpointError(f"{path.name}: corrupt safetensors header (not JSON)") from None
    base = 8 + n
    out: dict[str, TensorEntry] = {}
    for key, info in header.items():
        if key == "__metadata__":
            continue
        dtype, shape, (a, b) = info["dtype"], tuple(info["shape"]), info["data_offsets"]
        if dtype not in _DTYPES:
            raise CheckpointError(f"{path.name}: tensor {key} has unsupported dtype {dtype}")
        if b - a != int(np.prod(shape, dtype=np.int64)) * _DTYPES[dtype][1]:
            raise CheckpointError(f"{path.name}: tensor {key} byte range does not match its shape {shape}")
        if base + b > size:
            raise CheckpointError(
                f"{path.name}: truncated shard: tensor {key} ends at byte {base + b}, file has {size}"
            )
        out[key] = TensorEntry(key, path, dtype, shape, base + a, base + b)
    return out


def canonical_name(key: str) -> str:
    """Strip the trunk prefix: `model.language_model.layers.0.x` -> `layers.0.x`."""
    if key == "lm_head.weight":
        return key
    for p in PREFIXES:
        if key.startswith(p):
            return key[len(p) :]
    return key


class Checkpoint:
    """A Clover checkpoint directory: config plus lazily read tensors under canonical names."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.config: CheckpointConfig = CheckpointConfig.from_dir(self.path)
        self.entries: dict[str, TensorEntry] = self._index()
        self._maps: dict[Path, np.memmap] = {}

    @property
    def model(self) -> CloverConfig:
        return self.config.model

    # -- index ------------------------------------------------------------------------------
    def _index(self) -> dict[str, TensorEntry]:
        index_path = self.path / INDEX_FILE
        if index_path.is_file():
            try:
                weight_map: dict[str, str] = json.loads(index_path.read_text())["weight_map"]
            except (json.JSONDecodeError, KeyError):
                raise CheckpointError(f"{INDEX_FILE}: not a valid safetensors index") from None
            shards = sorted(set(weight_map.values()))
        elif (self.path / SINGLE_FILE).is_file():
            weight_map, shards = {}, [SINGLE_FILE]
        else:
            raise CheckpointError(f"{self.path}: no {INDEX_FILE} or {SINGLE_FILE}")
        entries: dict[str, TensorEntry] = {}
        for shard in shards:
            spath = self.path / shard
            if not spath.is_file():
                raise CheckpointError(f"{INDEX_FILE} points at a missing shard: {shard}")
            for key, entry in read_safetensors_header(spath).items():
                name = canonical_name(key)
                if name in entries:
                    raise CheckpointError(
                        f"duplicate tensor {key} (in {entries[name].path.name} and {shard})"
                    )
                if weight_map and weight_map.get(key) != shard:
                    raise CheckpointError(
                        f"tensor {key} is in {shard} but the index says {weight_map.get(key)}"
                    )
                entries[name] = entry
        missing = [k for k in weight_map if canonical_name(k) not in entries]
        if missing:
            raise CheckpointError(f"{INDEX_FILE} lists tensor {missing[0]} that no shard contains")
        return entries

    def __contains__(self, name: str) -> bool:
        return name in self.entries or self._per_expert_key(name) is not None

    def names(self) -> list[str]:
        return list(self.entries)

    @property
    def fused_experts(self) -> bool:
        return any(n.endswith("mlp.experts.gate_up_proj") for n in self.entries)

    @property
    def has_diffusion_tensors(self) -> bool:
        return any(n.endswith("linear_attn.conv_right_weight") for n in self.entries)

    # -- reading ----------------------------------------------------------------------------
    def raw(self, name: str) -> np.ndarray:
        """The stored array, zero-copy from the mmap (BF16 comes back as uint16 bit patterns)."""
        e = self.entries.get(name)
        if e is None:
            raise CheckpointError(f"missing tensor {name}")
        mm = self._maps.get(e.path)
        if mm is None:
            mm = self._maps[e.path] = np.memmap(e.path, dtype=np.uint8, mode="r")
        np_dtype = _DTYPES[e.dtype][0]
        return mm[e.start : e.end].view(np_dtype).reshape(e.shape)

    def get(self, name: str, dtype: type = np.float32) -> np.ndarray:
        """A tensor as float32 (or `dtype`), BF16 widened exactly."""
        e = self.entries.get(name)
        if e is None:
            return self._expert_from_per_expert(name, dtype)
        return to_float(self.raw(name), e.dtype, dtype)

    def expert(
        self, layer: int, e: int, dtype: type = np.float32
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(gate [I,H], up [I,H], down [H,I]) of one routed expert, whatever the stored layout."""
        pre = f"layers.{layer}.mlp.experts."
        if self.fused_experts:
            gu = self.raw(pre + "gate_up_proj")[e]
            entry = self.entries[pre + "gate_up_proj"]
            inter = gu.shape[0] // 2
            gate = to_float(gu[:inter], entry.dtype, dtype)
            up = to_float(gu[inter:], entry.dtype, dtype)
            down = to_float(self.raw(pre + "down_proj")[e], self.entries[pre + "down_proj"].dtype, dtype)
            return gate, up, down
        return tuple(self.get(f"{pre}{e}.{p}.weight", dtype) for p in ("gate_proj", "up_proj", "down_proj"))

    def _per_expert_key(self, name: str) -> str | None:
        m = re.match(r"^layers\.(\d+)\.mlp\.experts\.(gate_up_proj|down_proj)$", name)
        return m.group(0) if m and not self.fused_experts else None

    def _expert_from_per_expert(self, name: str, dtype: type) -> np.ndarray:
        """Assemble the fused expert arrays from a per-expert checkpoint (reference use only)."""
        if self._per_expert_key(name) is None:
            raise CheckpointError(f"missing tensor {name}")
        layer = int(name.split(".")[1])
        parts = [self.expert(layer, e, dtype) for e in range(self.model.num_experts)]
        if name.endswith("gate_up_proj"):
            return np.stack([np.concatenate([g, u], axis=0) for g, u, _ in parts])
        return np.stack([d for _, _, d in parts])


def to_float(a: np.ndarray, stored: str, dtype: type = np.float32) -> np.ndarray:
    """Widen a stored array to float; BF16 bit patterns become exact float32 values."""
    if stored == "BF16":
        return (a.astype(np.uint32) << 16).view(np.float32).astype(dtype, copy=False)
    return a.astype(dtype)


def release_pages(a: np.ndarray) -> None:
    """Drop the resident pages behind a C-contiguous view of a mapped shard.

    Pages of a read-only file mapping stay counted in the process's RSS once touched; a reader
    that streams the whole checkpoint (the converter) calls this after each block so its memory
    does not grow with the model. The data stays in the page cache and faults back in if read again.
    """
    if _libc is None or a.nbytes == 0 or not _is_file_mapped(a):
        return  # never on heap memory: MADV_DONTNEED would zero it
    start = a.__array_interface__["data"][0]
    first = start - start % mmap.PAGESIZE
    _libc.madvise(ctypes.c_void_p(first), ctypes.c_size_t(start + a.nbytes - first), _MADV_DONTNEED)


def _is_file_mapped(a: np.ndarray) -> bool:
    base = a
    while base is not None:
        if isinstance(base, mmap.mmap):
            return True
        base = getattr(base, "base", None)
    return False


_MADV_DONTNEED = 4
try:
    _libc: ctypes.CDLL | None = ctypes.CDLL(None, use_errno=True)
    _libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
except (OSError, AttributeError):  # no libc madvise (non-POSIX): pages are simply left to the OS
    _libc = None


def bf16_bits(x: np.ndarray) -> np.ndarray:
    """Round float32 to BF16 (round to nearest even) and return the uint16 bit patterns."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    rounded = u + 0x7FFF + ((u >> 16) & 1)
    return (rounded >> 16).astype(np.uint16)


def conv_right_taps(w: np.ndarray, kernel: int) -> np.ndarray:
    """Accept `conv_right_weight` as [conv_dim, kernel-1] or [conv_dim, 1, kernel-1]."""
    w = w.reshape(w.shape[0], -1)
    if w.shape[1] != kernel - 1:
        raise CheckpointError(f"conv_right_weight has {w.shape[1]} taps, expected {kernel - 1}")
    return w
