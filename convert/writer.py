"""Streaming GGUF writer: header and tensor infos from the plan, then tensor data as it is produced.

gguf-py's `GGUFWriter` lays out the header, key/values, tensor infos and split shards (standard
`-00001-of-0000N.gguf` names and `split.*` keys); its data path wants whole tensors in memory,
so data is written here, piece by piece, at the offsets the infos promise. Every shard is written
under a fresh temporary name beside it (`.NAME.XXXXXXXX.tmp`, created exclusively, so a user's
own `NAME.tmp` is never touched) and renamed only when all are complete; any failure, Ctrl-C,
SIGTERM or SIGHUP (see `interrupt_on_termination`) removes them.
"""

from __future__ import annotations

import errno
import os
import secrets
import shutil
import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
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
    """A GGUFWriter that writes its shards to the temporary files `write` created."""

    tmp_names: list[Path]

    def format_shard_names(self, path: Path) -> list[Path]:
        return self.tmp_names


class Terminated(KeyboardInterrupt):
    """SIGTERM or SIGHUP, raised like Ctrl-C's KeyboardInterrupt so that the same cleanup runs."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


@contextmanager
def interrupt_on_termination() -> Iterator[None]:
    """Turn SIGTERM and SIGHUP into `Terminated` while converting (main thread only)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: object) -> None:
        raise Terminated(signum)

    old = {s: signal.signal(s, handler) for s in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)


def _new_tmp(path: Path, made: list[Path]) -> None:
    """Add a new empty file beside `path` to `made`, created exclusively (mode from the umask).

    The name is listed before the file exists, so an interrupt at any point leaves nothing behind.
    """
    for _ in range(100):
        made.append(path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp"))
        try:
            os.close(os.open(made[-1], os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
            return
        except FileExistsError:  # someone else's file: never ours to remove
            made.pop()
    raise FileExistsError(errno.EEXIST, "no free temporary name", str(path))


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
    need, free = estimated_size(w, plan), free_bytes(path.parent)
    if free < need:
        raise ConvertError(
            f"not enough disk space in {path.parent}: the output needs about {_gb(need)}, {_gb(free)} free"
        )
    by_name = {t.name: t for t in plan.tensors}
    tmps: list[Path] = []
    try:
        try:
            for p in final:
                _new_tmp(p, tmps)
        except OSError as e:
            raise ConvertError(f"cannot write {path}: {e.strerror}") from None
        w.tmp_names = tmps
        try:
            _write_all(w, plan, by_name, encoder, report)
        except OSError as e:  # e.g. the disk filled up: name the output, not a temporary file
            raise ConvertError(f"cannot write {path}: {e.strerror}") from None
        _rename_all(tmps, final)
    except BaseException:
        w.close()
        for tmp in tmps:
            tmp.unlink(missing_ok=True)
        raise
    return final


def _rename_all(tmps: list[Path], final: list[Path]) -> None:
    """Rename every shard into place with interrupts held back: all of them appear, or none."""
    held = {signal.SIGINT, signal.SIGTERM, signal.SIGHUP}
    in_main = threading.current_thread() is threading.main_thread()
    old = signal.pthread_sigmask(signal.SIG_BLOCK, held) if in_main else None
    try:
        for tmp, dst in zip(tmps, final, strict=True):
            os.replace(tmp, dst)
    finally:
        if old is not None:
            signal.pthread_sigmask(signal.SIG_SETMASK, old)


def _write_all(
    w: GGUFWriter, plan: Plan, by_name: dict[str, PlannedTensor], encoder: Encoder, report: Report | None
) -> None:
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    assert w.fout is not None
    for fout, infos in zip(w.fout, w.tensors, strict=True):
        w.write_padding(fout, fout.tell())
        for name in infos:
            _write_tensor(w, fout, by_name[name], encoder, report)
    w.close()


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
