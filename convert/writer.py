"""Streaming GGUF writer: header and tensor infos from the plan, then tensor data as it is produced.

gguf-py's `GGUFWriter` lays out the header, key/values, tensor infos and split shards (standard
`-00001-of-0000N.gguf` names and `split.*` keys); its data path wants whole tensors in memory,
so data is written here, piece by piece, at the offsets the infos promise. Every shard is written
as `NAME.tmp` and renamed only when all are complete; any failure removes them.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGUFWriter

from clover_local.model import gguf_names as gn

from .encode import Encoder
from .errors import ConvertError
from .plan import Plan, PlannedTensor

Report = Callable[[PlannedTensor, int], None]  # (tensor, bytes just written)


class _TmpShardWriter(GGUFWriter):
    """A GGUFWriter whose files are the final shard names plus `.tmp`."""

    def format_shard_names(self, path: Path) -> list[Path]:
        return [tmp_path(p) for p in super().format_shard_names(path)]


def tmp_path(path: Path) -> Path:
    return path.with_name(path.name + ".tmp")


def free_bytes(directory: Path) -> int:
    """Free space where the output goes (the probe tests replace)."""
    return shutil.disk_usage(directory).free


def new_writer(path: Path, plan: Plan, split_max_size: int) -> GGUFWriter:
    """A writer holding every tensor info of the plan, shards assigned, nothing opened yet."""
    w = _TmpShardWriter(path, gn.ARCH, split_max_size=split_max_size)
    for t in plan.tensors:
        w.add_tensor_info(t.name, t.shape, np.dtype(np.float32), t.nbytes, raw_dtype=t.qtype)
    return w


def shard_paths(w: GGUFWriter, path: Path) -> list[Path]:
    return GGUFWriter.format_shard_names(w, path)


def estimated_size(w: GGUFWriter, plan: Plan) -> int:
    """Output bytes: tensor data and alignment padding plus an estimate of the key/values."""
    align = w.data_alignment
    data = sum(GGUFWriter.ggml_pad(t.nbytes, align) for t in plan.tensors)
    infos = sum(len(t.name) + 64 for t in plan.tensors)
    kv = sum(len(k) + 16 + _value_size(v.value) for kvs in w.kv_data for k, v in kvs.items())
    return data + infos + kv + align * len(w.tensors)


def write(
    w: GGUFWriter, path: Path, plan: Plan, encoder: Encoder, report: Report | None = None
) -> list[Path]:
    """Write all shards of `plan` (metadata already added to `w`) and return their paths."""
    final = shard_paths(w, path)
    tmps = [tmp_path(p) for p in final]
    need, free = estimated_size(w, plan), free_bytes(path.parent)
    if free < need:
        raise ConvertError(
            f"not enough disk space in {path.parent}: the output needs about {_gb(need)}, {_gb(free)} free"
        )
    by_name = {t.name: t for t in plan.tensors}
    try:
        try:
            w.write_header_to_file()
        except OSError as e:
            raise ConvertError(f"cannot write {tmps[0]}: {e.strerror}") from None
        w.write_kv_data_to_file()
        w.write_ti_data_to_file()
        assert w.fout is not None
        for fout, infos in zip(w.fout, w.tensors, strict=True):
            w.write_padding(fout, fout.tell())
            for name in infos:
                _write_tensor(w, fout, by_name[name], encoder, report)
        w.close()
        for tmp, dst in zip(tmps, final, strict=True):
            os.replace(tmp, dst)
    except BaseException:
        w.close()
        for tmp in tmps:
            tmp.unlink(missing_ok=True)
        raise
    return final


def _write_tensor(
    w: GGUFWriter, fout: Any, t: PlannedTensor, encoder: Encoder, report: Report | None
) -> None:
    written = 0
    for buf in encoder.encode(t.qtype, t.pieces()):
        fout.write(memoryview(buf))
        written += buf.nbytes
        if report is not None:
            report(t, buf.nbytes)
    if written != t.nbytes:  # a transform or type rule disagrees with the plan: never write a bad file
        raise RuntimeError(f"{t.name}: wrote {written} bytes, the plan says {t.nbytes}")
    w.write_padding(fout, written)


def _value_size(v: Any) -> int:
    if isinstance(v, str):
        return 8 + len(v.encode())
    if isinstance(v, list | tuple) and v and isinstance(v[0], str):  # token lists: one C-level join
        return 12 + 8 * len(v) + len("".join(v).encode())
    if isinstance(v, list | tuple):
        return 12 + 8 * len(v)
    return 8


def _gb(n: int) -> str:
    return f"{n / 1e9:.2f} GB" if n >= 1e8 else f"{n / 1e6:.1f} MB"
