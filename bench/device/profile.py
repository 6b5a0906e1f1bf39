"""Where a pass's GPU time goes: one pass of a kind under Nsight Compute, kernel by kernel.

    ncu --clock-control none --profile-from-start off --csv --page raw \\
        --metrics gpu__time_duration.sum python bench/device/profile.py MODEL.gguf --pass preview

    python bench/device/profile.py --summarize ncu-preview.csv [...]   # here: time per kernel kind

The model is loaded, a 512-token prefix decoded and the pass run 20 times untimed (so that CUDA
graphs are captured as in a timed run); then the profiler range (cudaProfilerStart/Stop) covers
exactly one more pass. Wall times under the profiler are the profiler's, so none are reported:
compare the kernel time with timing.py's. Passes: `ar` (the engine's 1-token commit, clover
head), `ar-adj` (the same with the `ar` loop's adjustment entries), `raw-ar` (plain llama_decode
of 1 token), `commit` (32 rows), `preview` (32 rows, coreset off), `preview-c8` (coreset forced
to 8 experts), `fused` (32 causal rows + 32-row preview), `verify-2-2` (2 causal rows + a 2-row
preview: 110 of the 132 passes of the speculative loop's a = 1 simulation). `--summarize` groups
the kernels of each CSV by kind and lists the largest kernels.

Nsight Compute replays each kernel alone, so it times the kernels of a pass one by one, serialized.
`--trace N` runs N passes under CUPTI's activity tracing instead (torch.profiler, in the same
process: the device image's python has PyTorch), which records each kernel as it ran inside the
CUDA graph, overlaps included; it prints per pass the sum of kernel times, the GPU span from the
first kernel's start to the last one's end, and the sums by kind; the JSON keeps the largest kernels
by name with their exclusive time, and the last pass kernel by kernel (`last_pass`), which lines a
32-row pass up against the 1-row step (`raw-ar`) node by node.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import re
import sys
from collections import defaultdict
from pathlib import Path

from stalls_table import duration_us, ncu_rows  # bench/device, the script's own folder

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

PASSES = ("ar", "ar-adj", "raw-ar", "commit", "preview", "preview-c8", "fused", "verify-2-2")
BLOCK = 32


def setup(model: str, kind: str, prefix: int):  # noqa: ANN201
    """The engine with a `prefix`-token sequence and a function that runs one pass of `kind`,
    warmed up so that CUDA graphs are captured as in a timed run."""
    import numpy as np
    from llama_cpp import llama_cpp as ll

    from clover_local.backend import LogitAdjustment, Routing, RowAdjustments
    from clover_local.llama.engine import LlamaEngine
    from clover_local.policy import DecodingSettings, RunningAdjustment

    eng = LlamaEngine(model, n_ctx=4096, n_gpu_layers=999, flash_attn=True, log=True, speculative=True)
    rng = np.random.default_rng(0)
    V = eng.vocab_size
    adj = LogitAdjustment.identity(V)
    mask = eng.mask_token_id
    toks = lambda n: [int(t) for t in rng.integers(0, min(V, 248000), size=n)]  # noqa: E731
    block = [mask if i % 2 else t for i, t in enumerate(toks(BLOCK))]
    eng.prefill(toks(prefix), adj)
    eng.bench_tuning(coreset_size=8 if kind == "preview-c8" else 0)
    routing = Routing(kind == "preview-c8", eng.default_routing.top_p)  # the coreset only for preview-c8
    batch = ll.llama_batch_init(1, 0, 1)
    p0 = eng.n_past

    def raw_ar() -> None:
        batch.token[0], batch.pos[0], batch.n_seq_id[0] = toks(1)[0], eng.n_past, 1
        batch.seq_id[0][0], batch.logits[0], batch.n_tokens = 0, True, 1
        ll.llama_decode(eng.ctx, batch)
        ll.llama_get_logits(eng.ctx)

    def verify(rows: int, preview: list[int]) -> None:
        if eng.n_past > p0 and eng._pass_start is not None:
            eng.rollback(p0)
        eng.verify_and_draft(toks(rows), RowAdjustments.constant(adj, rows), preview, routing=routing)

    # the `ar` loop's entries at the start of a response: the mask token's -inf and a stop token
    loop_s = DecodingSettings(mask_token_id=mask, stop_token_ids=(0,))
    loop_adj = RunningAdjustment(loop_s, V, [1]).adjustment()
    one = {
        "ar": lambda: eng.commit(toks(1), adj),
        "ar-adj": lambda: eng.commit(toks(1), loop_adj),
        "raw-ar": raw_ar,
        "commit": lambda: eng.commit(toks(BLOCK), adj),
        "preview": lambda: eng.preview(block, adj, routing),
        "preview-c8": lambda: eng.preview(block, adj, routing),
        "fused": lambda: verify(BLOCK, block),
        "verify-2-2": lambda: verify(2, [mask, mask]),
    }[kind]

    def synced() -> None:
        one()
        ll.llama_synchronize(eng.ctx)

    for _ in range(20):  # warm-up, so that CUDA graphs are captured as in a timed run
        synced()

    def close() -> None:
        ll.llama_batch_free(batch)
        eng.close()

    return synced, close


def run(model: str, kind: str, prefix: int) -> dict:
    one, close = setup(model, kind, prefix)
    cudart = ctypes.CDLL("libcudart.so.13")
    cudart.cudaProfilerStart()
    one()
    cudart.cudaProfilerStop()
    close()
    return {"pass": kind, "profiled": True}


def kind_of(name: str) -> str:
    return next((k for k, rx in KINDS if re.search(rx, name)), "other: " + name[:60])


def trace(model: str, kind: str, prefix: int, reps: int) -> dict:
    """`reps` passes under CUPTI's activity tracing: per pass, kernel time, GPU span, by kind."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    one, close = setup(model, kind, prefix)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            one()
    kernels = sorted(
        (
            (e.name, e.time_range.start, e.time_range.end)
            for e in prof.events()
            if e.device_type == DeviceType.CUDA and e.time_range.elapsed_us() > 0
        ),
        key=lambda k: k[1],
    )
    close()
    if not kernels:
        return {"pass": kind, "error": "no CUDA kernels recorded"}
    return trace_summary(kind, reps, kernels)


def trace_summary(kind: str, reps: int, kernels: list[tuple[str, float, float]]) -> dict:
    """`reps` passes' kernels as (name, start, end) in us, in order of start: per pass, kernel time
    (durations added), GPU span, by kind; the largest kernels by name with their exclusive time too,
    what each adds to the GPU's busy time: a kernel launched early (programmatic dependent launch)
    and waiting for the one before it counts from that one's end; and the last pass kernel by kernel
    in order of start (name, start from the pass's first kernel, duration, exclusive time; us), which
    lines a 32-row pass up against the 1-row step node by node."""
    spans, sums = [], []
    by: dict[str, float] = defaultdict(float)
    counts: dict[str, int] = defaultdict(int)
    by_name: dict[str, float] = defaultdict(float)
    excl_by_name: dict[str, float] = defaultdict(float)
    name_counts: dict[str, int] = defaultdict(int)
    # the passes run the same graph, so the same kernels: split by count (splitting at the largest
    # gaps between kernels went wrong on 2026-12-04: a gap inside a pass outgrew one between passes)
    n = len(kernels) // reps
    cuts = [i * n for i in range(1, reps)]
    sequence: list[list] = []
    for lo, hi in zip([0, *cuts], [*cuts, len(kernels)], strict=True):
        ks = kernels[lo:hi]
        spans.append(max(end for _, _, end in ks) - ks[0][1])
        sums.append(sum(end - start for _, start, end in ks))
        busy_until = ks[0][1]
        sequence = []
        for name, start, end in ks:
            short, label = name[:100], kind_of(name)
            excl = max(0.0, end - max(start, busy_until))
            sequence.append([name[:80], round(start - ks[0][1], 1), round(end - start, 1), round(excl, 1)])
            excl_by_name[short] += excl / reps
            busy_until = max(busy_until, end)
            by[label] += (end - start) / reps
            counts[label] += 1
            by_name[short] += (end - start) / reps
            name_counts[short] += 1
    return {
        "pass": kind,
        "reps": reps,
        "kernels_per_pass": len(kernels) / reps,
        "kernel_sum_ms": [round(x / 1e3, 3) for x in sums],
        "gpu_span_ms": [round(x / 1e3, 3) for x in spans],
        "by_kind_us": {
            k: {"n": counts[k] // reps, "us": round(by[k], 1)} for k in sorted(by, key=lambda k: -by[k])
        },
        "top_kernels_us": {
            k: {
                "n": name_counts[k] // reps,
                "us": round(by_name[k], 1),
                "exclusive_us": round(excl_by_name[k], 1),
            }
            for k in sorted(by_name, key=lambda k: -excl_by_name[k])[:TOP_KERNELS]
        },
        "last_pass": sequence,
    }


KINDS = [  # (kind, regex on the kernel name), first match wins
    ("moe: mmq with expert ids", r"mul_mat_q.*true|mmq_ids|ids_helper"),
    ("moe: mmvq with expert ids", r"mul_mat_vec_q.*true"),
    ("matmul: mmq", r"mul_mat_q"),
    ("matmul: mmvq / mmvf", r"mul_mat_vec"),
    ("matmul: cuBLAS / mmf", r"gemm|cutlass|sm90|mmf|Kernel2"),
    ("flash attention", r"flash_attn|fattn"),
    ("gated delta net / ssm", r"gated_delta|ssm_conv|ssm_scan|delta"),
    ("softmax / argmax / top-k / sort", r"soft_max|argmax|argsort|top_k|topk|cumsum"),
    ("norms", r"norm"),
    ("rope", r"rope"),
    ("copies / concat / get_rows / set_rows", r"cpy|copy|concat|get_rows|set_rows|dup|cont"),
    ("quantize activations", r"quantize"),
    (
        "elementwise / unary / glu",
        r"k_bin_bcast|unary|glu|silu|sigmoid|scale|add|mul|sub|exp|log|step|fill|arange|sum",
    ),
]


TOP_KERNELS = 40  # kernels by name in a summary: enough to see a pass's small kernels too


def summarize(paths: list[Path]) -> dict:
    out = {}
    for p in paths:
        kind = re.sub(r"^ncu-|\.csv$", "", p.name)
        rows, units = ncu_rows(p)
        by: dict[str, list[float]] = defaultdict(list)
        names: dict[str, list[float]] = defaultdict(list)
        for r in rows:
            name = r.get("Kernel Name", "")
            us = duration_us(r, units)
            by[kind_of(name)].append(us)
            names[name[:100]].append(us)
        total_us = sum(sum(v) for v in by.values())
        out[kind] = {
            "kernels": sum(len(v) for v in by.values()),
            "kernel_sum_ms": total_us / 1e3,
            "by_kind_us": {
                k: {"n": len(v), "us": round(sum(v), 1)}
                for k, v in sorted(by.items(), key=lambda kv: -sum(kv[1]))
            },
            "top_kernels_us": {
                k: {"n": len(v), "us": round(sum(v), 1)}
                for k, v in sorted(names.items(), key=lambda kv: -sum(kv[1]))[:TOP_KERNELS]
            },
        }
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model", nargs="?")
    ap.add_argument("--pass", dest="kind", choices=PASSES, default="preview")
    ap.add_argument("--prefix", type=int, default=512)
    ap.add_argument("--summarize", type=Path, nargs="*")
    ap.add_argument("--out", type=Path)
    ap.add_argument("--trace", type=int, default=0, help="N passes under CUPTI tracing (torch.profiler)")
    args = ap.parse_args(argv)
    if args.summarize:
        res = summarize(args.summarize)
        text = json.dumps(res, indent=1)
        if args.out:
            args.out.write_text(text + "\n")
        print(text)
        return 0
    if not args.model:
        ap.error("MODEL is required (or --summarize)")
    if args.trace:
        print(json.dumps(trace(args.model, args.kind, args.prefix, args.trace), indent=1), flush=True)
        return 0
    print(json.dumps(run(args.model, args.kind, args.prefix)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
