"""Importance matrices in llama.cpp's GGUF imatrix format (`llama-imatrix` output).

Per tensor the file holds `NAME.in_sum2` (sums of squared activations, one row per expert) and
`NAME.counts` (tokens seen per expert); the importance of a column is sum / count, or 1 where an
expert saw no token, exactly as `tools/quantize/quantize.cpp` normalises it. Tensor names are the
GGUF ones, so an imatrix computed with any clover-moe or qwen35moe file applies.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from gguf import GGUFReader

from clover_local.model.gguf_header import HeaderError, read_header

from .errors import ConvertError

_SUMS, _COUNTS = ".in_sum2", ".counts"


class Imatrix:
    """Per-tensor importance rows, read once from an imatrix GGUF."""

    def __init__(self, entries: dict[str, tuple[np.ndarray, np.ndarray]], path: Path):
        self.entries = entries
        self.path = path

    @classmethod
    def load(cls, path: Path) -> Imatrix:
        try:
            read_header(path)  # gguf-py trusts every count and length of the file
            reader = GGUFReader(path)
        except Exception as e:  # HeaderError from the walk, anything gguf-py raises after it
            raise ConvertError(
                f"{path}: not a GGUF imatrix ({e if isinstance(e, HeaderError) else type(e).__name__}); "
                "convert a legacy .dat file with `llama-imatrix --in-file FILE.dat -o FILE.gguf`"
            ) from None
        arrays = {t.name: np.asarray(t.data, dtype=np.float32).reshape(-1) for t in reader.tensors}
        entries: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        for name, sums in arrays.items():
            if name.endswith(_SUMS):
                base = name[: -len(_SUMS)]
                if base + _COUNTS not in arrays:
                    raise ConvertError(f"{path}: imatrix entry {base} has sums but no counts")
                entries[base] = (sums, arrays[base + _COUNTS])
        if not entries:
            raise ConvertError(f"{path}: imatrix has no {_SUMS} entries")
        return cls(entries, path)

    def weights(self, tensor: str, ne0: int, n_mat: int) -> np.ndarray | None:
        """[n_mat, ne0] column importances of `tensor` (one row per expert), or None if absent."""
        entry = self.entries.get(tensor)
        if entry is None:
            return None
        sums, counts = entry
        if sums.size != ne0 * n_mat or counts.size != n_mat:
            raise ConvertError(
                f"{self.path}: imatrix entry {tensor} has {sums.size} values for {counts.size} matrices, "
                f"the model needs {ne0 * n_mat} for {n_mat}"
            )
        rows = sums.reshape(n_mat, ne0)
        seen = counts.reshape(n_mat, 1) > 0
        return np.ascontiguousarray(
            np.where(seen, rows / np.maximum(counts.reshape(n_mat, 1), 1), 1.0), dtype=np.float32
        )
