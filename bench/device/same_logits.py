"""Whether a CUDA switch changes a model's logits by a single bit: one causal batch of each size, all
logits, in one process per setting (ggml-cuda reads its switches once per process).

    python bench/device/same_logits.py MODEL.gguf VAR=VALUE [--rows 32,64] [--cpu]

Prints one line per batch size: identical, or the largest difference and how many logits differ.
Exit status 1 if any differs.

With --cpu, the question is instead whether the default is as close to ggml's CPU backend as the
switched setting (e.g. GGML_CUDA_MMQ_NARROW=0, upstream's MMQ): a third process computes the logits
with no CUDA device visible, and each GPU setting's largest difference from them and argmax agreement
are printed. Exit status 1 if the default's largest difference exceeds twice the switched one's. On
the full-width synthetic files this reaches the kernels that the tiny preset's `clover verify`
cannot: its rows of 64 values are no multiple of a K-quant block.

Written for a change that must not move a bit: the dropped experiment of 2026-12-04 that moved
MMQ's stream-k fix-up into the matmul kernel in the fix-up kernel's order of additions
(GGML_CUDA_MMQ_FIXUP_KERNEL=1 was the fix-up kernel; commit a85fde3, docs/performance.md).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np


def logits(model: str, rows: list[int], out: Path) -> None:
    """All logits of a causal batch of each size, from token 100 on, saved to out (npz)."""
    import llama_cpp

    llm = llama_cpp.Llama(
        model, n_gpu_layers=-1, n_ctx=256, n_batch=256, n_ubatch=256, logits_all=True, verbose=False
    )
    arrays = {}
    for n in rows:
        llm.reset()
        llm.eval(list(range(100, 100 + n)))
        arrays[str(n)] = np.array(llm.scores[:n], dtype=np.float32)
    np.savez(out, **arrays)


def compare(first: dict, second: dict, rows: list[int]) -> tuple[list[str], bool]:
    """One line per batch size, and whether any logit differs (arrays keyed by str(rows))."""
    lines, differs = [], False
    for n in rows:
        a, b = first[str(n)], second[str(n)]
        if np.array_equal(a, b):
            lines.append(f"{n} rows: identical ({a.size} logits)")
            continue
        differs = True
        d = np.abs(a - b)
        lines.append(
            f"{n} rows: {int((d > 0).sum())} of {a.size} logits differ, at most {float(d.max()):.3g}"
        )
    return lines, differs


def against_cpu(
    default: dict, switched: dict, cpu: dict, rows: list[int], switch: str
) -> tuple[list[str], bool]:
    """One line per batch size and setting, and whether the default strays from the CPU's logits by more
    than twice as much as the switched setting does (arrays keyed by str(rows))."""
    lines, worse = [], False
    for n in rows:
        want = cpu[str(n)]
        errs = {}
        for name, got in (("default", default[str(n)]), (switch, switched[str(n)])):
            errs[name] = float(np.abs(got - want).max())
            agree = int((got.argmax(-1) == want.argmax(-1)).sum())
            lines.append(f"{n} rows, {name} against the CPU: at most {errs[name]:.3g}, argmax {agree} of {n}")
        worse |= errs["default"] > 2 * errs[switch]
    return lines, worse


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("switch", help="VAR=VALUE set in the second process")
    ap.add_argument("--rows", default="32,64")
    ap.add_argument("--cpu", action="store_true", help="both settings against the CPU backend")
    ap.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    rows = [int(r) for r in args.rows.split(",")]
    if args.child:
        logits(args.model, rows, args.child)
        return 0
    var, _, value = args.switch.partition("=")
    envs = [{}, {var: value}] + ([{"CUDA_VISIBLE_DEVICES": ""}] if args.cpu else [])
    with tempfile.TemporaryDirectory() as tmp:
        files = []
        for env in envs:
            f = Path(tmp) / f"{len(files)}.npz"
            cmd = [sys.executable, __file__, args.model, args.switch, "--rows", args.rows, "--child", str(f)]
            subprocess.run(cmd, env={**os.environ, **env}, check=True)
            files.append(dict(np.load(f)))
    if args.cpu:
        lines, worse = against_cpu(files[0], files[1], files[2], rows, args.switch)
        print("\n".join(lines))
        return 1 if worse else 0
    lines, differs = compare(files[0], files[1], rows)
    print("\n".join(lines))
    return 1 if differs else 0


if __name__ == "__main__":
    sys.exit(main())
