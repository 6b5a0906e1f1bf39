"""A streaming BF16 safetensors writer: shards planned up front, tensors written chunk by chunk.

The `safetensors` package serialises whole in-memory dicts; a full-width test checkpoint is several
gigabytes, so here every header is computed from the shapes alone and each tensor's data is then
streamed from a generator of chunks. Memory stays bounded by the largest chunk per worker. Shards
are written by a pool of threads (numpy's generators and copies release the GIL), so generating a
full-width checkpoint on a many-core machine is not bound to one core.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np

INDEX_FILE = "model.safetensors.index.json"
BF16_BYTES = 2

# name, shape -> the tensor's BF16 bit patterns, in row-major order, in one or more uint16 chunks
ChunkSource = Callable[[str, tuple[int, ...]], Iterable[np.ndarray]]


@dataclass(frozen=True)
class Shard:
    """One planned shard: its file name and the (name, shape) of each tensor, in file order."""

    file: str
    tensors: tuple[tuple[str, tuple[int, ...]], ...]

    @property
    def nbytes(self) -> int:
        return sum(_nbytes(shape) for _, shape in self.tensors)


def _nbytes(shape: tuple[int, ...]) -> int:
    return math.prod(shape) * BF16_BYTES


def plan_shards(tensors: list[tuple[str, tuple[int, ...]]], n_shards: int) -> list[Shard]:
    """Split tensors, in order, into `n_shards` shards of roughly equal size (HF file names)."""
    if not 1 <= n_shards <= len(tensors):
        raise ValueError(f"cannot split {len(tensors)} tensors into {n_shards} shards")
    total = sum(_nbytes(s) for _, s in tensors)
    groups: list[list[tuple[str, tuple[int, ...]]]] = [[]]
    done = 0
    for i, (name, shape) in enumerate(tensors):
        unopened = n_shards - len(groups)
        full = done >= total * len(groups) / n_shards
        if groups[-1] and unopened and (full or len(tensors) - i <= unopened):
            groups.append([])
        groups[-1].append((name, shape))
        done += _nbytes(shape)
    return [Shard(f"model-{i + 1:05d}-of-{n_shards:05d}.safetensors", tuple(g)) for i, g in enumerate(groups)]


def shard_header(shard: Shard) -> bytes:
    """The 8-byte length plus JSON header, space-padded to a multiple of 8 bytes."""
    header: dict[str, object] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, shape in shard.tensors:
        end = offset + _nbytes(shape)
        header[name] = {"dtype": "BF16", "shape": list(shape), "data_offsets": [offset, end]}
        offset = end
    body = json.dumps(header, separators=(",", ":")).encode()
    body += b" " * (-len(body) % 8)
    return len(body).to_bytes(8, "little") + body


def write_shard(path: Path, shard: Shard, source: ChunkSource) -> None:
    """Write one shard, checking that each tensor's chunks add up to exactly its size."""
    with open(path, "wb") as f:
        f.write(shard_header(shard))
        for name, shape in shard.tensors:
            written = 0
            for chunk in source(name, shape):
                if chunk.dtype != np.uint16:
                    raise TypeError(f"{name}: chunk dtype {chunk.dtype}, expected uint16 BF16 bits")
                np.ascontiguousarray(chunk).tofile(f)
                written += chunk.size
            if written != math.prod(shape):
                raise ValueError(f"{name}: wrote {written} values, shape {shape} needs {math.prod(shape)}")


def write_index(out_dir: Path, shards: list[Shard]) -> None:
    """`model.safetensors.index.json`: total byte size and tensor -> shard map."""
    index = {
        "metadata": {"total_size": sum(s.nbytes for s in shards)},
        "weight_map": {name: s.file for s in shards for name, _ in s.tensors},
    }
    (out_dir / INDEX_FILE).write_text(json.dumps(index, indent=2) + "\n")


def write_sharded(
    out_dir: Path,
    tensors: list[tuple[str, tuple[int, ...]]],
    n_shards: int,
    source: ChunkSource,
    workers: int | None = None,
) -> list[Shard]:
    """Plan, write every shard and the index into `out_dir`; returns the plan.

    Shards are written concurrently by `workers` threads (default: one per core, at most one per
    shard); `source` must be safe to call from several threads. The bytes do not depend on it.
    """
    shards = plan_shards(tensors, n_shards)
    workers = max(1, min(workers or os.cpu_count() or 1, len(shards)))
    with ThreadPoolExecutor(max_workers=workers) as pool:
        futures = [pool.submit(write_shard, out_dir / s.file, s, source) for s in shards]
        try:
            for done in futures:
                done.result()
        except BaseException:
            pool.shutdown(cancel_futures=True)  # shards not started are dropped; running ones finish
            raise
    write_index(out_dir, shards)
    return shards


def chunked(total: int, chunk: int) -> Iterator[int]:
    """Sizes of consecutive chunks covering `total` elements."""
    for start in range(0, total, chunk):
        yield min(chunk, total - start)
