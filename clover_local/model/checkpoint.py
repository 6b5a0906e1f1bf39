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
from pathlib import Path, PurePosixPath

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
# dtypes and header limit of the safetensors format (its library rejects anything else)
SAFETENSORS_DTYPES = set("BOOL U8 I8 F8_E5M2 F8_E4M3 I16 U16 F16 BF16 I32 U32 F32 F64 I64 U64".split())
SAFETENSORS_MAX_HEADER = 100_000_000


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
    """Parse one shard's header with the checks of the `safetensors` library itself.

    The header is a JSON object of tensor -> {dtype, shape, data_offsets} (plus `__metadata__`,
    strings only); offsets are relative to the data block, and the tensors must tile it exactly:
    no negative or overlapping ranges, no gap, nothing after the last one. Messages name the file
    and the tensor, never bytes of the file.
    """
    name = path.name
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            head = f.read(8)
            if len(head) < 8:
                raise CheckpointError(f"{name}: truncated safetensors file (no header)")
            n = int.from_bytes(head, "little")
            if n == 0 or n > SAFETENSORS_MAX_HEADER or 8 + n > size:
                raise CheckpointError(
                    f"{name}: corrupt safetensors header (its length does not fit the file of {size} bytes)"
                )
            header = json.loads(f.read(n).decode("utf-8"))
    except OSError as e:
        raise CheckpointError(f"{path}: cannot read ({e.strerror})") from None
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError):
        raise CheckpointError(f"{name}: corrupt safetensors header (not UTF-8 JSON)") from None
    if not isinstance(header, dict):
        raise CheckpointError(f"{name}: corrupt safetensors header (not a JSON object)")
    base = 8 + n
    out: dict[str, TensorEntry] = {}
    for key, info in header.items():
        if key == "__metadata__":
            if not isinstance(info, dict) or not all(isinstance(v, str) for v in info.values()):
                raise CheckpointError(f"{name}: __metadata__ must map strings to strings")
            continue
        dtype, shape, (a, b) = _tensor_info(name, key, info)
        out[key] = TensorEntry(key, path, dtype, shape, base + a, base + b)
    _check_tiling(name, sorted(out.values(), key=lambda e: (e.start, e.end)), base, size)
    return out


def _tensor_info(name: str, key: str, info: object) -> tuple[str, tuple[int, ...], tuple[int, int]]:
    """(dtype, shape, data_offsets) of one header entry, each type- and range-checked."""
    if not isinstance(info, dict):
        raise CheckpointError(f"{name}: tensor {key}: header entry is not an object")
    dtype, shape, offsets = info.get("dtype"), info.get("shape"), info.get("data_offsets")
    if not isinstance(dtype, str) or dtype not in SAFETENSORS_DTYPES:
        raise CheckpointError(f"{name}: tensor {key}: missing or unknown dtype")
    if dtype not in _DTYPES:
        supported = ", ".join(_DTYPES)
        raise CheckpointError(f"{name}: tensor {key} has unsupported dtype {dtype} (one of {supported})")
    if not isinstance(shape, list) or not all(_is_count(d) for d in shape):
        raise CheckpointError(f"{name}: tensor {key}: shape must be a list of non-negative integers")
    if (
        not isinstance(offsets, list)
        or len(offsets) != 2
        or not all(_is_count(o) for o in offsets)
        or offsets[0] > offsets[1]
    ):
        raise CheckpointError(f"{name}: tensor {key}: data_offsets must be [begin, end], 0 <= begin <= end")
    a, b = offsets
    if b - a != int(np.prod(shape, dtype=object)) * _DTYPES[dtype][1]:
        raise CheckpointError(f"{name}: tensor {key} byte range does not match its shape {tuple(shape)}")
    return dtype, tuple(shape), (a, b)


def _check_tiling(name: str, entries: list[TensorEntry], base: int, size: int) -> None:
    """Tensors must cover the data block exactly, in some order (the safetensors rule)."""
    pos = base
    for e in entries:
        if e.start != pos:
            raise CheckpointError(
                f"{name}: tensor {e.key}: data_offsets overlap another tensor or leave a gap"
            )
        pos = e.end
    if pos > size:
        last = entries[-1]
        raise CheckpointError(
            f"{name}: truncated shard: tensor {last.key} ends at byte {last.end}, file has {size}"
        )
    if pos != size:
        raise CheckpointError(f"{name}: {size - pos} bytes after the last tensor (not a safetensors file)")


def _is_count(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


def shard_path(root: Path, name: object) -> Path:
    """The file of a shard named in the index: a relative name inside `root`, symlinks included.

    A Hugging Face cache snapshot links its files to `../../blobs/`, so there the repository's
    cache folder is the boundary.
    """
    if (
        not isinstance(name, str)
        or not name
        or "\\" in name
        or "\x00" in name
        or PurePosixPath(name).is_absolute()
        or ".." in PurePosixPath(name).parts
    ):
        shown = str(name)[:120]
        raise CheckpointError(f"{INDEX_FILE} names a shard outside the checkpoint directory: {shown!r}")
    path = root / name
    real, top = path.resolve(), root.resolve()
    bound = top.parent.parent if top.parent.name == "snapshots" else top
    if not real.is_relative_to(bound):
        raise CheckpointError(f"{name}: a symlink to a file outside the checkpoint directory")
    if not path.is_file():
        raise CheckpointError(f"{INDEX_FILE} points at a missing shard: {name}")
    return path


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
            weight_map = _read_index(index_path)
            shards = sorted(set(weight_map.values()))
        elif (self.path / SINGLE_FILE).is_file():
            weight_map, shards = {}, [SINGLE_FILE]
        else:
            raise CheckpointError(f"{self.path}: no {INDEX_FILE} or {SINGLE_FILE}")
        entries: dict[str, TensorEntry] = {}
        for shard in shards:
            spath = shard_path(self.path, shard)
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


def _read_index(path: Path) -> dict[str, str]:
    """The index's weight_map (tensor name -> shard file name), type-checked."""
    try:
        index = json.loads(path.read_bytes().decode("utf-8"))
    except OSError as e:
        raise CheckpointError(f"{path}: cannot read ({e.strerror})") from None
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError):
        index = None
    weight_map = index.get("weight_map") if isinstance(index, dict) else None
    if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
        raise CheckpointError(
            f"{INDEX_FILE}: not a valid safetensors index (needs a weight_map: tensor name -> shard file)"
        )
    return weight_map


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
