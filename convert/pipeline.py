"""One conversion, start to end: resolve the input, validate and plan, then stream the GGUF.

`prepare` does every check that can fail on bad input (config, tensors, shapes, tokenizer,
imatrix, output path) and writes nothing; `convert` then only streams. The CLI, the tests and
the benchmark all call these two functions.
"""

from __future__ import annotations

import os
import re
import stat
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from gguf import GGUFWriter

from clover_local.model.checkpoint import Checkpoint, CheckpointError
from clover_local.model.config import ConfigError

from . import hub, quantize, writer
from .encode import Encoder
from .errors import ConvertError
from .imatrix import Imatrix
from .metadata import General, add_diffusion_keys, add_general, add_model_keys
from .mix import OUTTYPES, OutType
from .plan import Plan, PlannedTensor, build_plan
from .vocab import add_vocab, load_vocab


@dataclass(frozen=True)
class Options:
    model: str  # checkpoint directory or Hugging Face repo id
    outfile: Path | None = None
    outtype: str = "bf16"
    imatrix: Path | None = None
    ar_only: bool = False
    split_max_size: int = 0  # bytes per shard, 0 = one file
    threads: int = field(default_factory=lambda: os.cpu_count() or 1)
    force: bool = False
    name: str | None = None


@dataclass
class Prepared:
    """A validated conversion: the plan and a writer holding all metadata, nothing on disk yet."""

    ckpt: Checkpoint
    out: OutType
    plan: Plan
    writer: GGUFWriter
    path: Path
    shards: list[Path]


@dataclass(frozen=True)
class Result:
    shards: list[Path]
    plan: Plan
    seconds: float


def prepare(opts: Options) -> Prepared:
    """Check everything and plan the output; raises ConvertError with a one-line message."""
    out = OUTTYPES.get(opts.outtype.lower())
    if out is None:
        raise ConvertError(f"unknown --outtype {opts.outtype} (one of {', '.join(OUTTYPES)})")
    source = hub.resolve(opts.model)
    try:
        ckpt = Checkpoint(source.path)
        imatrix = _imatrix(opts.imatrix, out)
        plan = build_plan(ckpt, out, ar_only=opts.ar_only, imatrix=imatrix)
        vocab = load_vocab(source.path, ckpt.model, ckpt.config.raw)
    except (ConfigError, CheckpointError) as e:
        raise ConvertError(str(e)) from None
    path = _output_path(opts, source.path, out)
    w = writer.new_writer(path, plan, opts.split_max_size)
    general = General(
        name=opts.name or source.path.name, license=_license(source.path), source_url=source.url
    )
    add_general(w, general, out, ckpt.config)
    add_model_keys(w, ckpt.config)
    if plan.diffusion:
        add_diffusion_keys(w, ckpt.config)
    add_vocab(w, vocab)
    shards = writer.shard_paths(w, path)
    _check_output(shards, opts.force, _inputs(ckpt, opts.imatrix))
    return Prepared(ckpt, out, plan, w, path, shards)


def convert(
    prep: Prepared, threads: int, report: Callable[[PlannedTensor, int], None] | None = None
) -> Result:
    """Stream the planned GGUF to disk (tmp files, renamed when complete)."""
    ggml = quantize.load() if prep.out.quantized else _optional_ggml()
    start = time.perf_counter()
    with ThreadPoolExecutor(max_workers=threads) as pool:
        shards = writer.write(prep.writer, prep.path, prep.plan, Encoder(pool, threads, ggml), report)
    return Result(shards, prep.plan, time.perf_counter() - start)


def parse_size(text: str) -> int:
    """`50G`, `500M`, `1.5T`, `4096` (bytes) -> bytes (decimal units, as llama-gguf-split)."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]?)B?\s*", text, re.IGNORECASE)
    if not m:
        raise ConvertError(f"cannot read size {text!r} (use e.g. 500M or 50G)")
    scale = {"": 1, "K": 10**3, "M": 10**6, "G": 10**9, "T": 10**12}[m.group(2).upper()]
    return int(float(m.group(1)) * scale)


def _optional_ggml() -> quantize.Ggml | None:
    """ggml widens BF16 faster than numpy; float outputs work without it."""
    try:
        return quantize.load()
    except ConvertError:
        return None


def _imatrix(path: Path | None, out: OutType) -> Imatrix | None:
    if path is None:
        return None
    if not out.quantized:
        raise ConvertError(f"--imatrix applies to quantized outtypes, not {out.name}")
    if not path.is_file():
        raise ConvertError(f"--imatrix {path}: no such file")
    return Imatrix.load(path)


def _output_path(opts: Options, model_dir: Path, out: OutType) -> Path:
    path = Path(opts.outfile) if opts.outfile else Path.cwd() / f"{model_dir.name}-{out.name.upper()}.gguf"
    parent = path.parent
    if not parent.is_dir():
        raise ConvertError(f"cannot write {path}: {parent} is not a directory")
    if not os.access(parent, os.W_OK):
        raise ConvertError(f"cannot write {path}: {parent} is not writable")
    return path


def _check_output(shards: list[Path], force: bool, inputs: set[tuple[int, int]]) -> None:
    """Never replace an input (a shard, config.json, the index...) or anything not a regular file."""
    for p in shards:
        try:
            st = p.stat()
        except FileNotFoundError:
            continue
        except OSError as e:
            raise ConvertError(f"cannot write {p}: {e.strerror}") from None
        if (st.st_dev, st.st_ino) in inputs:
            raise ConvertError(f"{p} is an input of this conversion; choose another output path")
        if not stat.S_ISREG(st.st_mode) or p.is_symlink():
            raise ConvertError(f"{p} exists and is not a regular file; choose another output path")
        if not force:
            raise ConvertError(f"{p} exists (pass --force to overwrite)")


def _inputs(ckpt: Checkpoint, imatrix: Path | None) -> set[tuple[int, int]]:
    """(device, inode) of every file the conversion reads: the checkpoint folder's files, the
    shards wherever their links point, the imatrix."""
    files = [*ckpt.path.iterdir(), *{e.path for e in ckpt.entries.values()}]
    files += [imatrix] if imatrix is not None else []
    ids = set()
    for f in files:
        try:
            st = f.stat()
        except OSError:
            continue
        ids.add((st.st_dev, st.st_ino))
    return ids


def _license(model_dir: Path) -> str | None:
    """`license:` of the model card's YAML front matter, if any."""
    readme = model_dir / "README.md"
    if not readme.is_file():
        return None
    text = readme.read_text(encoding="utf-8", errors="replace")
    front = re.match(r"---\n(.*?)\n---", text, re.DOTALL)
    lic = re.search(r"^license:\s*(\S+)", front.group(1), re.MULTILINE) if front else None
    return lic.group(1).strip("'\"") if lic else None
