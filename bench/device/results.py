"""Results of the H200 runs: merge a run's timing files into one JSON, save it under
`bench/results/`, and write the H200 table of `docs/performance.md`.

    python bench/device/results.py merge timing-*.json [--clover-bench ...] [--loops ...] [--parity P]
        --out result.json
    python bench/device/results.py combine A.json B.json --out C.json   # several calls as one run
    python bench/device/results.py save RESULT.json            # -> bench/results/<UTC date>-<label>.json
    python bench/device/results.py table bench/results/X.json [--update docs/performance.md]

Per-layer costs are least-squares fits `ms = per_layer * layers + fixed` over the layer counts of
the run; `at_40_layers` extrapolates them to the real model (docs/model.md §1: 40 layers).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "bench" / "results"
DOC = ROOT / "docs" / "performance.md"
BEGIN, END = "<!-- h200-table:begin -->", "<!-- h200-table:end -->"
FULL_LAYERS = 40
DEFAULT_MOE_CHUNK = 0  # the engine dispatches the routed experts at once (no llama_clover_bench_tuning)
METRICS = (
    "ar_step_ms",
    "causal32_ms",
    "causal32_all_logits_ms",
    "engine_ar_step_ms",
    "preview_ms",
    "preview_coreset_ms",
    "commit_ms_per_block",
    "fused_pass_ms",
    # the diffusion loop's fused pass (commit_and_preview: no snapshots; from 2026-12-06)
    "fused_commit_preview_ms",
    *(f"preview_coreset_{n}_ms" for n in (8, 16, 32, 64, 128, 256)),
    # the loops' time per token (1000 / tok/s of the ar loop and the labelled speculative runs)
    "ar_loop_ms_per_token",
    *(f"spec_a{a}_ms_per_token" for a in (0, 1, 2)),
    # upstream's AR step timed in the clover file's process, alternating with the engine's (timing.py's
    # ar mode): the same drift as the loops, where separately timed processes differ by up to 10 %
    "upstream_ar_step_interleaved_ms",
)
# <arch>-<layers>-<quant>[-<variant>]; a variant (e.g. nographs: CUDA graphs off) is fitted on its own
TAG = re.compile(r"^(?P<arch>clover|qwen35moe)-(?P<layers>\d+)-(?P<quant>[a-z0-9_]+(?:-[a-z0-9]+)?)$")


def _load(path: str) -> dict | None:
    p = Path(path)
    if not p.is_file():
        return None
    try:
        return json.loads(p.read_text())
    except json.JSONDecodeError:
        return None


def fit(points: list[tuple[int, float]]) -> dict | None:
    """ms = a * layers + b over (layers, ms) points with at least two layer counts."""
    pts = sorted(points)
    if len({x for x, _ in pts}) < 2:
        return None
    n = len(pts)
    mx = sum(x for x, _ in pts) / n
    my = sum(y for _, y in pts) / n
    a = sum((x - mx) * (y - my) for x, y in pts) / sum((x - mx) ** 2 for x, _ in pts)
    b = my - a * mx
    return {
        "per_layer_ms": a,
        "fixed_ms": b,
        "at_40_layers_ms": a * FULL_LAYERS + b,
        "points": [[x, y] for x, y in pts],
    }


def run_entry(t: dict) -> dict:
    tag = t.get("label") or ""
    m = TAG.match(tag)
    e = {
        "tag": tag,
        "arch": t["model"].get("arch"),
        "layers": t["model"].get("layers"),
        "quant": m.group("quant") if m else None,
        "file_bytes": t["model"].get("file_bytes"),
        "load_s": t.get("load_s"),
    }
    for k in (
        *METRICS,
        "ar_tok_s",
        "pp_ms",
        "pp_tok_s",
        "preview_ms_by_coreset",
        "e2e_tok_s_by_k",
        "spec_tok_s_by_accept",
        "ar_loop_tok_s",
        "ar_mode",
        "engine_ar_step_speculative_ms",
        "one_row_step_speculative",
        "raw_ar_step_ms",
        "moe_chunk",
        "preview_floor_ms_by_coreset",
        "byte_floor",
        "simulation_label",
        "e2e_runs",
        "spec_runs",
        "readback_bytes_per_pass",
        "memory_check",
        "skipped",
        "settings",
        "llama_cpp_version",
    ):
        if k in t:
            e[k] = t[k]
    e["by_moe_chunk"] = {
        c: {k: v for k, v in m.items() if k.endswith(("_ms", "_ms_per_block", "_by_coreset"))}
        for c, m in (t.get("by_moe_chunk") or {}).items()
    }
    use_default_chunk(e)
    e["detail"] = {
        k: t[k]
        for k in (
            "ar_step",
            "causal32",
            "causal32_all_logits",
            "engine_ar_step",
            "commit",
            "preview",
            "fused_pass",
            "pp_detail",
        )
        if k in t
    }
    return e


def use_default_chunk(e: dict) -> None:
    """The engine's passes at its default expert dispatch (0: one dispatch), so every layer count
    is fitted at one setting; the others stay in by_moe_chunk."""
    default = (e.get("by_moe_chunk") or {}).get(str(DEFAULT_MOE_CHUNK))
    if default:
        e.update({k: v for k, v in default.items() if k != "ar_step_ms"})
        # the ar mode's own engine (no speculative snapshots) when the run measured it (timing.py's
        # ar_mode), else the speculative context's AR step
        e.setdefault("engine_ar_step_ms", default["ar_step_ms"])
        e["moe_chunk"] = DEFAULT_MOE_CHUNK
    for n, ms in (e.get("preview_ms_by_coreset") or {}).items():
        e[f"preview_coreset_{n}_ms"] = ms


def per_token(r: dict) -> dict:
    """The loops' ms per token of a run entry, to fit over the layer counts like the passes."""
    out = {}
    if (r.get("ar_mode") or {}).get("upstream_ar_step_ms"):
        out["upstream_ar_step_interleaved_ms"] = r["ar_mode"]["upstream_ar_step_ms"]
    if r.get("ar_loop_tok_s"):
        out["ar_loop_ms_per_token"] = 1000 / r["ar_loop_tok_s"]
    for a, tok_s in (r.get("spec_tok_s_by_accept") or {}).items():
        if tok_s:
            out[f"spec_a{a}_ms_per_token"] = 1000 / tok_s
    return out


def fits_of(runs: list[dict]) -> dict:
    """The linear fits over the layer counts, per (arch, quant) and metric."""
    fits: dict = {}
    for r in runs:
        key = f"{r['arch']}/{r['quant']}"
        values = {**r, **per_token(r)}
        for mname in METRICS:
            if isinstance(values.get(mname), (int, float)) and r.get("layers"):
                fits.setdefault(key, {}).setdefault(mname, []).append((r["layers"], values[mname]))
    return {k: {m: fit(p) for m, p in v.items()} for k, v in fits.items()}


def summarize(res: dict) -> None:
    """Fits and headline fields from res["runs"] (in place)."""
    runs = res["runs"]
    res["fits"] = fits_of(runs)
    # headline fields: the largest clover-moe run of the first quant, else the baseline's
    # (never a placement variant: those go under cpu_moe)
    quants = [r["quant"] for r in runs if r["quant"] and "-cpumoe" not in r["quant"]]
    quant = "q4_k_m" if "q4_k_m" in quants else (quants[0] if quants else None)
    res["quant"] = quant

    def largest(arch: str) -> dict | None:
        c = [r for r in runs if r["arch"] == arch and r["quant"] == quant]
        return max(c, key=lambda r: r["layers"] or 0) if c else None

    head = largest("clover-moe") or largest("qwen35moe") or {}
    res["headline_from"] = head.get("tag")
    res["layers"] = head.get("layers")
    for k in (
        "ar_step_ms",
        "causal32_ms",
        "preview_ms",
        "preview_ms_by_coreset",
        "fused_pass_ms",
        "fused_commit_preview_ms",
        "verify_2_2_ms",
        "commit_ms_per_block",
        "ar_tok_s",
        "e2e_tok_s_by_k",
        "spec_tok_s_by_accept",
        "ar_loop_tok_s",
        "moe_chunk",
        "pp_tok_s",
    ):
        res[k] = head.get(k)
    res["cpu_moe"] = cpu_moe(runs)
    base = largest("qwen35moe")
    if base:
        res["baseline_qwen35moe"] = {
            k: base.get(k)
            for k in (
                "tag",
                "layers",
                "ar_step_ms",
                "causal32_ms",
                "causal32_all_logits_ms",
                "ar_tok_s",
                "pp_tok_s",
            )
        }


def cpu_moe(runs: list[dict]) -> dict | None:
    """The run with the routed experts in system RAM (tag variant `cpumoe`, issue 20): the
    engine's passes and simulations against upstream's AR step with the same placement; the
    passes without op offload (variant `cpumoenooffload`) beside them."""

    def variant(arch: str, name: str) -> dict | None:
        return next((r for r in runs if r["arch"] == arch and (r["quant"] or "").endswith(f"-{name}")), None)

    clover, base = variant("clover-moe", "cpumoe"), variant("qwen35moe", "cpumoe")
    if clover is None:
        return None

    def passes(r: dict) -> dict:
        return {
            "ar_step_ms": r.get("engine_ar_step_ms"),
            "preview_ms": {
                "coreset_off": r.get("preview_ms"),
                "coreset_top_p": r.get("preview_coreset_ms"),
                **{f"forced_{n}": ms for n, ms in (r.get("preview_ms_by_coreset") or {}).items()},
            },
            "commit_ms_per_block": r.get("commit_ms_per_block"),
            "fused_pass_ms": r.get("fused_pass_ms"),
            "causal32_ms": r.get("causal32_ms"),
        }

    out = {
        "tag": clover["tag"],
        "layers": clover["layers"],
        "placement": (clover.get("settings") or {}).get("placement"),
        **passes(clover),
        "raw_ar_step_ms": clover.get("raw_ar_step_ms"),
        "ar_loop_tok_s": clover.get("ar_loop_tok_s"),
        "e2e_tok_s_by_k": clover.get("e2e_tok_s_by_k"),
        "spec_tok_s_by_accept": clover.get("spec_tok_s_by_accept"),
        "simulation_label": clover.get("simulation_label"),
        "baseline_ar_step_ms": base.get("ar_step_ms") if base else None,
        "baseline_causal32_ms": base.get("causal32_ms") if base else None,
        "memory_check": clover.get("memory_check"),
    }
    no_offload = variant("clover-moe", "cpumoenooffload")
    if no_offload:
        out["no_op_offload"] = passes(no_offload)
    return out


def merge(args) -> dict:
    timings = [t for t in (_load(p) for p in args.timings) if t]
    runs = [run_entry(t) for t in timings]
    meta = _load(args.meta) if args.meta else None
    machine = (
        Path(args.machine).read_text().strip().splitlines()
        if args.machine and Path(args.machine).is_file()
        else []
    )
    notes = []
    if args.notes and Path(args.notes).is_file():
        notes = [json.loads(line) for line in Path(args.notes).read_text().splitlines() if line.strip()]
    res: dict = {
        "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "label": args.label,
        "gpu": machine[0].split(",")[0].strip() if machine else None,
        "machine": machine,
        "build": {
            "cmake_args": args.cmake_args,
            "build_s": float(args.build_s) if args.build_s else None,
            "llama_cpp_version": runs[0].get("llama_cpp_version") if runs else None,
            "system_info": timings[0].get("system_info") if timings else None,
        },
        "commit": (meta or {}).get("commit"),
        "dirty_files": (meta or {}).get("dirty_files"),
        "patches": (meta or {}).get("patches"),
        "llama_cpp_python": (meta or {}).get("llama_cpp_python"),
        "upstream_llama_cpp": "0c1e570 (vendored by llama-cpp-python 0.3.36)",
        "method": "bench/device/timing.py: median of REPS timed runs after warm-up, host wall clock around "
        "llama_decode + llama_synchronize; random token ids; 512-token cached prefix; "
        "flash attention on, all layers on the GPU, CUDA graphs as the build enables them",
        "runs": runs,
        "notes": notes,
    }
    summarize(res)
    res["clover_bench"] = {}
    for p in args.clover_bench or []:
        d = _load(p)
        if d:
            res["clover_bench"][Path(p).stem.removeprefix("clover-bench-")] = d
    res["parity"] = _load(args.parity) if args.parity else None
    res["profile"] = _load(args.profile) if args.profile else None
    # bench/step_in_loop.py: the loops and upstream's step round-robin in one process, by file
    res["loops_one_process"] = {
        Path(p).stem.removeprefix("loops-"): d for p in args.loops or [] if (d := _load(p))
    }
    return res


def combine(args) -> dict:
    """Several calls' results as one run: runs, notes, clover bench and parity pooled."""
    parts = [json.loads(Path(p).read_text()) for p in args.results]
    res = dict(parts[0])
    res["runs"] = [r for d in parts for r in d["runs"]]
    for r in res["runs"]:
        use_default_chunk(r)
    res["notes"] = [n for d in parts for n in d.get("notes", [])]
    res["clover_bench"] = {k: v for d in parts for k, v in (d.get("clover_bench") or {}).items()}
    res["parity"] = next((d["parity"] for d in reversed(parts) if d.get("parity")), None)
    res["profile"] = next((d["profile"] for d in reversed(parts) if d.get("profile")), None)
    res["loops_one_process"] = {k: v for d in parts for k, v in (d.get("loops_one_process") or {}).items()}
    res["combined_from"] = [
        {"date_utc": d.get("date_utc"), "label": d.get("label"), "build": d.get("build")} for d in parts
    ]
    res["label"] = args.label or res.get("label")
    summarize(res)
    return res


def save(args) -> Path:
    d = json.loads(Path(args.result).read_text())
    day = d.get("date_utc") or time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    stamp = day[:16].replace(":", "").replace("T", "-")
    dest = RESULTS / f"{stamp}-{args.name or d.get('label') or 'h200'}.json"
    RESULTS.mkdir(parents=True, exist_ok=True)
    dest.write_text(json.dumps(d, indent=1) + "\n")
    print(dest)
    return dest


def _f(x, nd=2) -> str:
    return "—" if x is None else f"{x:.{nd}f}"


def table(d: dict, source: str) -> str:
    b = d["build"]
    built = f" ({b['build_s']:.0f} s to build)" if b.get("build_s") else ""
    dirty = " (+uncommitted files)" if d.get("dirty_files") else ""
    lines = [
        f"Run {d.get('date_utc')}, {d.get('gpu')}, commit `{(d.get('commit') or '?')[:10]}`{dirty}, "
        f"llama.cpp {d.get('upstream_llama_cpp')}, build `{b.get('llama_cpp_version')}` "
        f"with `{b.get('cmake_args')}`{built}. Raw numbers: `{source}`.",
        "",
        "| file | layers | AR step ms | AR tok/s | causal 32 ms (/AR) | causal 32, all logits ms "
        "| preview ms off / on | commit ms | fused ms | pp512 tok/s | pp8192 tok/s |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in sorted(d["runs"], key=lambda r: (r["arch"] or "", r["quant"] or "", r["layers"] or 0)):
        g = r.get
        ar, c32, pp = g("ar_step_ms"), g("causal32_ms"), g("pp_tok_s") or {}
        ratio = f" ({c32 / ar:.1f})" if ar and c32 else ""
        cells = [
            f"{r['arch']} {r['quant']}",
            str(r["layers"]),
            _f(ar, 3),
            _f(g("ar_tok_s"), 1),
            _f(c32, 3) + ratio,
            _f(g("causal32_all_logits_ms"), 3),
            f"{_f(g('preview_ms'), 3)} / {_f(g('preview_coreset_ms'), 3)}",
            _f(g("commit_ms_per_block"), 3),
            _f(g("fused_pass_ms"), 3),
            _f(pp.get("512"), 0),
            _f(pp.get("8192"), 0),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    lines += [
        "",
        "Linear fits over the layer counts (ms = per_layer x layers + fixed), extrapolated to 40 layers:",
        "",
        "| file | measure | per layer ms | fixed ms | 40 layers ms |",
        "|---|---|---|---|---|",
    ]
    for key, ms in sorted(d.get("fits", {}).items()):
        for m, f in ms.items():
            if f:
                lines.append(
                    f"| {key} | {m} | {f['per_layer_ms']:.4f} | {f['fixed_ms']:.3f} "
                    f"| {f['at_40_layers_ms']:.2f} |"
                )
    for r in d["runs"]:
        extra = []
        if r.get("preview_ms_by_coreset"):
            extra.append(
                "preview ms by forced coreset size: "
                + ", ".join(f"{k}: {v:.3f}" for k, v in r["preview_ms_by_coreset"].items())
            )
        if r.get("preview_floor_ms_by_coreset"):
            extra.append(
                "byte floor ms of those passes (weights read once at the copy bandwidth's read rate): "
                + ", ".join(f"{k}: {v:.3f}" for k, v in r["preview_floor_ms_by_coreset"].items())
            )
        for c, m in (r.get("by_moe_chunk") or {}).items():
            extra.append(
                f"expert dispatch in chunks of {c or 'all'} rows: "
                + ", ".join(f"{k.removesuffix('_ms')} {v:.3f}" for k, v in m.items() if k.endswith("_ms"))
            )
        if r.get("ar_loop_tok_s"):
            extra.append(f"ar loop (the runtime's AR mode) {r['ar_loop_tok_s']:.1f} tok/s")
        if r.get("e2e_tok_s_by_k"):
            extra.append(
                "end-to-end tok/s, labelled simulation of exactly k tokens resolved per preview "
                "(real decode loop): " + ", ".join(f"k={k}: {v:.1f}" for k, v in r["e2e_tok_s_by_k"].items())
            )
        if r.get("spec_tok_s_by_accept"):
            extra.append(
                "speculative tok/s, labelled simulation of exactly a drafted tokens accepted per "
                "iteration (real loop, adaptive draft): "
                + ", ".join(f"a={a}: {v:.1f}" for a, v in r["spec_tok_s_by_accept"].items())
            )
        if extra:
            lines += ["", f"{r['tag']}: " + "; ".join(extra) + "."]
    lines += goals(d)
    for kind, prof in (d.get("profile") or {}).items():
        top = ", ".join(f"{k} {v['us']:.0f} us ({v['n']})" for k, v in list(prof["by_kind_us"].items())[:6])
        lines += [
            "",
            f"Profile, {kind} pass (smallest clover file): {prof['kernels']} kernels, "
            f"{prof['kernel_sum_ms']:.3f} ms of kernel time; largest: {top}.",
        ]
    if d.get("parity"):
        lines += ["", "GPU parity: `" + json.dumps(d["parity"].get("summary", d["parity"]))[:800] + "`"]
    skipped = sorted({f"{k}: {v}" for r in d["runs"] for k, v in (r.get("skipped") or {}).items()})
    skipped += [f"{n['stage']}: {n['skipped']}" for n in d.get("notes", []) if "skipped" in n]
    if skipped:
        lines += ["", "Not measured in this run: " + "; ".join(skipped) + "."]
    return "\n".join(lines) + "\n"


def goals(d: dict) -> list[str]:
    """The goals of issues 11 and 12 as measured ratios, every one against upstream's own AR step
    (its `qwen35moe` graph on the same weights, same run): at each layer count and at 40 layers."""
    runs = [r for r in d["runs"] if r["quant"] == d.get("quant")]
    out = ["", "Every ratio is against upstream's qwen35moe AR step on the same weights in the same run."]
    for layers in sorted({r["layers"] for r in runs if r["arch"] == "clover-moe"}):
        c = next(r for r in runs if r["arch"] == "clover-moe" and r["layers"] == layers)
        b = next((r for r in runs if r["arch"] == "qwen35moe" and r["layers"] == layers), None)
        up = b.get("ar_step_ms") if b else None
        if not up:
            out += ["", f"Goals at {layers} layers: no upstream baseline in this run."]
            continue
        up_tok = 1e3 / up

        def ratio(x, y, goal):
            return f"{x / y:.2f} (goal {goal})" if x and y else "—"

        by = c.get("preview_ms_by_coreset") or {}
        items = [
            f"engine AR step / upstream AR step {ratio(c.get('engine_ar_step_ms'), up, '<= 1.05')}",
            f"ar loop tok/s / upstream AR tok/s {ratio(c.get('ar_loop_tok_s'), up_tok, '>= 0.85')}",
            f"preview / upstream AR step {ratio(c.get('preview_ms'), up, '<= 2')}",
            f"preview at coreset 32 / upstream AR step {ratio(by.get('32'), up, '<= 1.5')}",
            f"fused / preview {ratio(c.get('fused_pass_ms'), c.get('preview_ms'), '<= 1.3')}",
            "the diffusion loop's fused pass (commit_and_preview) / preview "
            + ratio(c.get("fused_commit_preview_ms"), c.get("preview_ms"), "<= 1.3"),
        ]
        e2e = c.get("e2e_tok_s_by_k") or {}
        for k, goal in (("2", ">= 1.2"), ("4", ">= 2"), ("8", ">= 3.5")):
            items.append(f"e2e k={k} / upstream AR tok/s {ratio(e2e.get(k), up_tok, goal)}")
        spec = c.get("spec_tok_s_by_accept") or {}
        for a, goal in (("0", ">= 0.85"), ("1", ">= 1.5"), ("2", ">= 2")):
            items.append(f"speculative a={a} / upstream AR tok/s {ratio(spec.get(a), up_tok, goal)}")
        ar = c.get("ar_mode") or {}
        if ar.get("upstream_ar_step_ms"):
            items += [
                "interleaved in one process: engine AR step / upstream AR step "
                f"{ar['engine_ar_step_ratio']:.2f}"
                f" ({ar['engine_ar_step_ms']:.3f} / {ar['upstream_ar_step_ms']:.3f} ms; with the loop's"
                f" adjustment entries {ar['engine_ar_step_loop_adjustment_ratio']:.2f})",
                f"ar loop / upstream AR tok/s {ar['ar_loop_ratio']:.2f} (upstream's step timed around it)",
            ]
        one = (d.get("loops_one_process") or {}).get(f"clover-{layers}-{d.get('quant')}", {}).get("kinds", {})
        pairs = [(k, label) for k, label in (("ar loop", "ar loop"), ("a = 0 loop", "speculative a=0"))
                 if (one.get(k) or {}).get("vs_upstream")]  # fmt: skip
        if pairs:
            items.append(
                "in one process, round-robin with upstream's step (bench/step_in_loop.py): "
                + ", ".join(f"{label} {one[k]['vs_upstream']:.3f}x" for k, label in pairs)
            )
        out += ["", f"Goals at {layers} layers ({d.get('quant')}): " + "; ".join(items) + "."]
    fits = fits_of(d["runs"]) if d.get("runs") else d.get("fits", {})  # files saved before a metric existed

    def at40(arch: str, m: str) -> float | None:
        f = fits.get(f"{arch}/{d.get('quant')}", {}).get(m)
        return f["at_40_layers_ms"] if f else None

    up40 = at40("qwen35moe", "ar_step_ms")
    ar40, pv40, fu40, cs32 = (
        at40("clover-moe", "engine_ar_step_ms"),
        at40("clover-moe", "preview_ms"),
        at40("clover-moe", "fused_pass_ms"),
        at40("clover-moe", "preview_coreset_32_ms"),
    )
    if up40 and pv40:
        items = [f"upstream AR step {up40:.2f} ms", f"preview {pv40:.2f} ms = {pv40 / up40:.2f}x (goal <= 2)"]
        if ar40:
            items.append(f"engine AR step {ar40:.2f} ms = {ar40 / up40:.2f}x (goal <= 1.05)")
        if cs32:
            items.append(f"preview at coreset 32 {cs32:.2f} ms = {cs32 / up40:.2f}x (goal <= 1.5)")
        # the diffusion loop's own fused pass where timed (from 2026-12-06), else the verification's
        fc40 = at40("clover-moe", "fused_commit_preview_ms")
        if fc40:
            items.append(f"the diffusion loop's fused pass / preview {fc40 / pv40:.2f} (goal <= 1.3)")
        if fu40:
            items.append(f"fused / preview {fu40 / pv40:.2f} (goal <= 1.3)")
        if fc40 or fu40:
            for k, goal in ((2, 1.2), (4, 2), (8, 3.5)):
                # a block of 32: ceil(32/k) previews, the first riding on the previous block's fused pass
                ms = (-(-32 // k) - 1) * pv40 + (fc40 or fu40)
                items.append(f"derived e2e k={k} {32 / ms * up40:.2f}x upstream AR (goal >= {goal})")
        loops = {"ar loop": "ar_loop", "speculative a=0": "spec_a0", "speculative a=1": "spec_a1"}
        loops["speculative a=2"] = "spec_a2"
        for (name, m), goal in zip(loops.items(), (">= 0.95", ">= 0.95", ">= 1.5", ">= 2"), strict=True):
            ms = at40("clover-moe", f"{m}_ms_per_token")
            if ms:
                items.append(f"{name} (fit of ms per token) {up40 / ms:.2f}x upstream AR (goal {goal})")
        inter40 = at40("clover-moe", "upstream_ar_step_interleaved_ms")
        if inter40:
            ratios = [
                f"{name} {inter40 / ms:.2f}x"
                for name, m in (
                    ("engine AR step", "engine_ar_step_ms"),
                    *((n, f"{m}_ms_per_token") for n, m in loops.items()),
                )
                if (ms := at40("clover-moe", m))
            ]
            items.append(
                f"against the fit of upstream's step interleaved with the engine's ({inter40:.2f} ms): "
                + ", ".join(ratios)
            )
        measured = any(r["layers"] == FULL_LAYERS for r in runs)
        how = "measured (a fit's end point)" if measured else "extrapolated (linear fits)"
        out += ["", f"At 40 layers, {how}; e2e derived from pass costs: " + "; ".join(items) + "."]
    return out


def update_doc(doc: Path, block: str) -> None:
    text = doc.read_text() if doc.is_file() else "# Performance\n"
    body = f"{BEGIN}\n{block}{END}"
    if BEGIN in text and END in text:
        text = text[: text.index(BEGIN)] + body + text[text.index(END) + len(END) :]
    else:
        text = text.rstrip("\n") + "\n\n## H200\n\n" + body + "\n"
    doc.write_text(text)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("merge")
    m.add_argument("timings", nargs="*")
    m.add_argument("--clover-bench", nargs="*", default=[])
    m.add_argument("--loops", nargs="*", default=[], help="bench/step_in_loop.py --json files")
    m.add_argument("--parity")
    m.add_argument("--profile")
    m.add_argument("--meta")
    m.add_argument("--machine")
    m.add_argument("--cmake-args", default="")
    m.add_argument("--build-s", default="")
    m.add_argument("--notes")
    m.add_argument("--label", default="h200")
    m.add_argument("--out", type=Path, required=True)
    c = sub.add_parser("combine")
    c.add_argument("results", nargs="+")
    c.add_argument("--label")
    c.add_argument("--out", type=Path, required=True)
    s = sub.add_parser("save")
    s.add_argument("result")
    s.add_argument("--name")
    t = sub.add_parser("table")
    t.add_argument("result")
    t.add_argument("--update", type=Path, nargs="?", const=DOC)
    args = ap.parse_args(argv)
    if args.cmd == "merge":
        res = merge(args)
        args.out.write_text(json.dumps(res, indent=1) + "\n")
        print(f"wrote {args.out}: {len(res['runs'])} timed files, headline {res['headline_from']}")
        for key, ms in res["fits"].items():
            for mname, f in ms.items():
                if f:
                    print(
                        f"  {key} {mname}: {f['per_layer_ms']:.4f} ms/layer + {f['fixed_ms']:.3f} ms "
                        f"-> {f['at_40_layers_ms']:.2f} ms at 40 layers"
                    )
    elif args.cmd == "combine":
        res = combine(args)
        args.out.write_text(json.dumps(res, indent=1) + "\n")
        print(f"wrote {args.out}: {len(res['runs'])} timed files, headline {res['headline_from']}")
    elif args.cmd == "save":
        save(args)
    else:
        d = json.loads(Path(args.result).read_text())
        src = Path(args.result)
        try:
            src = src.resolve().relative_to(ROOT)
        except ValueError:
            pass
        block = table(d, str(src))
        if args.update:
            update_doc(args.update, block)
            print(f"updated {args.update}")
        else:
            print(block)
    return 0


if __name__ == "__main__":
    sys.exit(main())
