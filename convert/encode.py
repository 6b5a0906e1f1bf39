"""Turning streamed source rows into GGUF tensor bytes: widen, round or quantize, on every core.

A tensor arrives as `Piece`s (row blocks of at most a few tens of MB, in output order). Pieces are
grouped into batches, each batch is cut into row blocks that worker threads encode into one
output buffer (numpy and ctypes both release the GIL), and the mapped source pages are dropped
once encoded, so memory stays at a few batches whatever the model size.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
from gguf import GGMLQuantizationType

from clover_local.model.checkpoint import bf16_bits, release_pages

from .mix import nbytes
from .quantize import Ggml

Q = GGMLQuantizationType
BATCH_BYTES = 64 << 20  # float32 bytes encoded per batch


@dataclass(frozen=True)
class Piece:
    """Consecutive rows of an output tensor.

    `data` is [rows, n]: float32, float16, or uint16 holding BF16 bit patterns (as
    `Checkpoint.raw` returns BF16). `imatrix` is the importance of the n columns for these rows;
    `source` is the mapped checkpoint view to release once the rows are encoded.
    """

    data: np.ndarray
    imatrix: np.ndarray | None = None
    source: np.ndarray | None = None


class Encoder:
    """Encodes pieces into one ggml type with a shared thread pool."""

    def __init__(self, pool: ThreadPoolExecutor, threads: int, ggml: Ggml | None):
        self.pool = pool
        self.threads = threads
        self.ggml = ggml

    def encode(self, qtype: GGMLQuantizationType, pieces: Iterable[Piece]) -> Iterator[np.ndarray]:
        """Yield the tensor's bytes as uint8 buffers, in order."""
        if qtype not in (Q.F32, Q.F16, Q.BF16) and self.ggml is not None:
            self.ggml.init(qtype)
        batch: list[Piece] = []
        size = 0
        for piece in pieces:
            if qtype == Q.BF16 and piece.data.dtype == np.uint16:
                yield from self._flush(qtype, batch)
                batch, size = [], 0
                yield np.ascontiguousarray(piece.data).view(np.uint8).reshape(-1)  # BF16 kept bit for bit
                _release(piece)
                continue
            batch.append(piece)
            size += piece.data.size * 4
            if size >= BATCH_BYTES:
                yield from self._flush(qtype, batch)
                batch, size = [], 0
        yield from self._flush(qtype, batch)

    def _flush(self, qtype: GGMLQuantizationType, batch: list[Piece]) -> Iterator[np.ndarray]:
        if not batch:
            return
        jobs: list[tuple[Piece, int, int, int]] = []  # piece, first row, stop row, output offset
        total_rows = sum(p.data.shape[0] for p in batch)
        step = max(1, -(-total_rows // (2 * self.threads)))
        offset = 0
        for p in batch:
            rows, n = p.data.shape
            for r in range(0, rows, step):
                stop = min(rows, r + step)
                jobs.append((p, r, stop, offset))
                offset += nbytes(qtype, (stop - r, n))
        out = np.empty(offset, dtype=np.uint8)
        list(self.pool.map(lambda job: self._encode_rows(qtype, out, *job), jobs))
        for p in batch:
            _release(p)
        yield out

    def _encode_rows(
        self, qtype: GGMLQuantizationType, out: np.ndarray, p: Piece, r0: int, r1: int, at: int
    ) -> None:
        src = p.data[r0:r1]
        dst = out[at : at + nbytes(qtype, src.shape)]
        if qtype == Q.BF16:
            dst.view(np.uint16)[:] = bf16_bits(self._f32(src)).reshape(-1)
        elif qtype == Q.F16:
            dst.view(np.float16)[:] = self._f32(src).reshape(-1)
        elif qtype == Q.F32:
            dst.view(np.float32)[:] = self._f32(src).reshape(-1)
        else:
            assert self.ggml is not None, "quantized types need ggml"
            written = self.ggml.quantize_rows(qtype, self._f32(src), dst, p.imatrix)
            if written != dst.nbytes:  # ggml and gguf-py disagree on the type's size: never write it
                raise RuntimeError(f"ggml wrote {written} bytes of {qtype.name}, expected {dst.nbytes}")

    def _f32(self, src: np.ndarray) -> np.ndarray:
        """A C-contiguous float32 copy (or view) of a row block."""
        if src.dtype == np.uint16:
            out = np.empty(src.shape, dtype=np.float32)
            if self.ggml is not None:
                self.ggml.bf16_to_f32(np.ascontiguousarray(src), out)
            else:
                np.left_shift(src, 16, out=out.view(np.uint32), dtype=np.uint32)
            return out
        return np.ascontiguousarray(src, dtype=np.float32)


def _release(p: Piece) -> None:
    if p.source is not None:
        release_pages(p.source)
