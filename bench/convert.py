"""Converter benchmark: clover-convert vs upstream llama.cpp on the same full-width weights.

Generates a `full-width` checkpoint (real Clover widths, `--layers` layers; 2 layers is 5.3 GB)
and its Qwen3.5-MoE twin, warms the page cache with both, then measures per output type:

- ours: `clover-convert CKPT --outtype TYPE` (one streaming pass, quantizing on the fly);
- upstream: the pinned tree's `convert_hf_to_gguf.py --outtype bf16` on the twin, then for
  quantized types `llama_model_quantize` (the code behind `llama-quantize`) on that BF16 file.

Reports wall time, throughput in GB/s of checkpoint input, and peak RSS of each process (from
`wait4`, so the numbers are per process, not per benchmark). Runs unattended; prints a Markdown
table for docs/performance.md and a JSON line.

    python bench/convert.py --work /tmp/clover-bench --layers 2 --types bf16,q8_0,q4_k_m
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from clover_convert.upstream import as_qwen35moe, convert_command

from clover_local.testing.make_checkpoint import write_checkpoint

QUANTIZE = """
import ctypes, os, sys
import llama_cpp
inp, out, kind = sys.argv[1:]
params = llama_cpp.llama_model_quantize_default_params()
params.ftype = getattr(llama_cpp, "LLAMA_FTYPE_MOSTLY_" + kind.upper())
params.nthread = os.cpu_count()
sys.exit(llama_cpp.llama_model_quantize(inp.encode(), out.encode(), ctypes.byref(params)))
"""


@dataclass(frozen=True)
class Run:
    seconds: float
    peak_rss_mb: float


@dataclass(frozen=True)
class Row:
    tool: str
    outtype: str
    input_gb: float
    output_gb: float
    seconds: float
    gb_per_s: float
    peak_rss_mb: float


def measured(cmd: list[str]) -> Run:
    """Run a command to completion; its wall time and its own peak RSS (Linux `wait4`)."""
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    assert proc.stderr is not None
    err = proc.stderr.read()
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    seconds = time.perf_counter() - start
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd[:4])}... exited {proc.returncode}:\n{err.decode()[-3000:]}")
    return Run(seconds, usage.ru_maxrss / 1024)


def dir_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.glob("*.safetensors"))


def warm(path: Path) -> None:
    """Read every shard once so both tools start from the page cache."""
    for shard in path.glob("*.safetensors"):
        with open(shard, "rb") as f:
            while f.read(1 << 26):
                pass


def bench(work: Path, layers: int, types: list[str], upstream: bool) -> list[Row]:
    ckpt = work / f"clover-full-width-L{layers}"
    if not ckpt.is_dir():
        write_checkpoint(ckpt, "full-width", layers=layers)
    twin = work / f"qwen35moe-twin-L{layers}"
    if upstream and not twin.is_dir():
        as_qwen35moe(ckpt, twin)
    rows: list[Row] = []
    size = dir_bytes(ckpt)
    for kind in types:
        out = work / f"ours-{kind}.gguf"
        warm(ckpt)
        run = measured(
            [
                sys.executable,
                "-m",
                "clover_convert.cli",
                str(ckpt),
                "-o",
                str(out),
                "--outtype",
                kind,
                "--force",
            ]
        )
        rows.append(_row("clover-convert", kind, size, out, run))
        out.unlink()
    if upstream:
        size = dir_bytes(twin)
        bf16 = work / "upstream-bf16.gguf"
        warm(twin)
        conv = measured(convert_command(twin, bf16, "bf16"))
        rows.append(_row("upstream convert_hf_to_gguf", "bf16", size, bf16, conv))
        for kind in (k for k in types if k != "bf16"):
            out = work / f"upstream-{kind}.gguf"
            quant = measured([sys.executable, "-c", QUANTIZE, str(bf16), str(out), kind])
            both = Run(conv.seconds + quant.seconds, max(conv.peak_rss_mb, quant.peak_rss_mb))
            rows.append(_row("upstream convert + llama_model_quantize", kind, size, out, both))
            out.unlink()
        bf16.unlink()
    return rows


def _row(tool: str, kind: str, size: int, out: Path, run: Run) -> Row:
    return Row(
        tool,
        kind,
        round(size / 1e9, 2),
        round(out.stat().st_size / 1e9, 2),
        round(run.seconds, 1),
        round(size / 1e9 / run.seconds, 3),
        round(run.peak_rss_mb),
    )


def markdown(rows: list[Row]) -> str:
    lines = [
        "| tool | outtype | input GB | output GB | seconds | GB/s of input | peak RSS MB |",
        "|---|---|---|---|---|---|---|",
    ]
    lines += [
        f"| {r.tool} | {r.outtype} | {r.input_gb} | {r.output_gb} | {r.seconds} | {r.gb_per_s} "
        f"| {r.peak_rss_mb} |"
        for r in rows
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--work", type=Path, default=Path("/tmp/clover-bench"), help="scratch directory")
    ap.add_argument("--layers", type=int, default=2, help="layers of the full-width checkpoint")
    ap.add_argument("--types", default="bf16,q8_0,q4_k_m", help="comma-separated outtypes")
    ap.add_argument("--no-upstream", action="store_true", help="measure clover-convert only")
    ap.add_argument("--clean", action="store_true", help="delete the generated checkpoints afterwards")
    args = ap.parse_args(argv)
    args.work.mkdir(parents=True, exist_ok=True)
    rows = bench(args.work, args.layers, args.types.split(","), not args.no_upstream)
    machine = f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, {platform.system()}"
    print(f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; {machine}; layers={args.layers}")
    print(markdown(rows))
    print(json.dumps([asdict(r) for r in rows]))
    if args.clean:
        for d in args.work.glob("*-L*"):
            shutil.rmtree(d)
    return 0


if __name__ == "__main__":
    sys.exit(main())
