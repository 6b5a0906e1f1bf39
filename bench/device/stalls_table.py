"""Summarize `stalls.sh`'s Nsight Compute CSVs: one line per kernel kind and case.

    python bench/device/stalls_table.py DIR [--json OUT]

Per kernel (median over its launches): time, DRAM bandwidth (reads and writes) and its share of
the peak, L2 hit rate, warps active per SM, issue activity, registers, grid and block, and the three
largest warp stall reasons in cycles per issued instruction. A kernel well under the DRAM peak with
a busy issue slot is bound by its instructions; one with idle issue slots and long-scoreboard stalls
waits on memory with too few loads in flight.

Then, for each source page in DIR (`src-<case>.csv`, stalls.sh with SOURCE=...), where a kernel's
instructions go: the warp instructions it executed, the shares of its warp-stall samples by reason
and by opcode, and by how often an instruction ran. Instructions that ran equally often mostly
form one loop body, so those classes split the kernel into its per-warp, per-work-item and per-step
code without line information.
"""

from __future__ import annotations

import argparse
import csv
import json
import re
import statistics
from pathlib import Path

STALL = re.compile(r"smsp__average_warps_issue_stalled_(\w+?)_per_issue_active\.ratio")
OPCODE = re.compile(r"(?:@!?U?P\w+\s+)?([A-Z0-9_]+)")
FIELDS = {
    "us": "gpu__time_duration.sum",
    "dram_pct": "gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed",
    "dram_gbs": "dram__bytes.sum.per_second",
    "l2_hit": "lts__t_sector_hit_rate.pct",
    "warps_active_pct": "sm__warps_active.avg.pct_of_peak_sustained_active",
    "issue_pct": "smsp__issue_active.avg.pct_of_peak_sustained_active",
    "regs": "launch__registers_per_thread",
    "grid": "launch__grid_size",
    "block": "launch__block_size",
    "smem": "launch__shared_mem_per_block_dynamic",
}


def _num(text: str) -> float:
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return float("nan")


def ncu_rows(path: Path) -> tuple[list[dict], dict]:
    """The launches of an `ncu --csv --page raw` log (one dict per kernel, by metric name) and the
    units of its metrics; ncu's own lines before the table are skipped. `profile.py --summarize`
    reads its CSVs through this too."""
    lines = [ln for ln in path.read_text(errors="replace").splitlines() if ln.startswith('"')]
    if len(lines) < 3:
        return [], {}
    header, units, *rows = csv.reader(lines)
    return [dict(zip(header, row, strict=True)) for row in rows], dict(zip(header, units, strict=True))


def duration_us(row: dict, units: dict) -> float:
    """A launch's `gpu__time_duration.sum` in us, whichever time unit ncu printed."""
    name = "gpu__time_duration.sum"
    return _num(row.get(name, "")) * {"ns": 1e-3, "us": 1.0, "ms": 1e3}.get(units.get(name, ""), float("nan"))


def read(path: Path) -> list[dict]:
    """The kernels of one case, in launch order, with the FIELDS and the stall ratios."""
    rows, units = ncu_rows(path)
    out = []
    for rec in rows:
        k = {"kernel": re.sub(r"\(.*", "", rec.get("Kernel Name", "?"))}
        for key, name in FIELDS.items():
            value = _num(rec.get(name, ""))
            if key == "us":
                value = duration_us(rec, units)
            if key == "dram_gbs":
                value *= {
                    "byte/s": 1e-9,
                    "Kbyte/s": 1e-6,
                    "Mbyte/s": 1e-3,
                    "Gbyte/s": 1.0,
                    "Tbyte/s": 1e3,
                }.get(units.get(name, ""), float("nan"))
            k[key] = value
        k["stalls"] = {m.group(1): _num(v) for h, v in rec.items() if (m := STALL.fullmatch(h))}
        out.append(k)
    return out


def summarize(kernels: list[dict]) -> list[dict]:
    """Median per kernel name, in order of first launch."""
    names = list(dict.fromkeys(k["kernel"] for k in kernels))
    out = []
    for name in names:
        ks = [k for k in kernels if k["kernel"] == name]
        s = {"kernel": name, "launches": len(ks)}
        for key in FIELDS:
            s[key] = statistics.median(k[key] for k in ks)
        stalls = {r: statistics.median(k["stalls"].get(r, 0.0) for k in ks) for r in ks[0]["stalls"]}
        s["stalls"] = dict(sorted(stalls.items(), key=lambda kv: -kv[1])[:3])
        out.append(s)
    return out


def source_page(path: Path) -> dict:
    """An `ncu --page source --csv --print-source sass` page: the kernel's warp instructions executed
    and warp-stall samples, by stall reason, by opcode and by execution count (the classes holding the
    most instructions first)."""
    rows = list(csv.reader(path.read_text(errors="replace").splitlines()))
    if len(rows) < 3:
        return {}
    # "void k<(ggml_type)12, (int)32, (bool)1>(const char *, ...)" -> "void k<12, 32, 1>"
    name = rows[0][1] if len(rows[0]) > 1 else "?"
    kernel = re.sub(r"\((?:ggml_type|int|bool)\)", "", name).split(">(")[0] + (">" if ">(" in name else "")
    body = [dict(zip(rows[1], r, strict=True)) for r in rows[2:] if len(r) == len(rows[1])]
    inst = [_num(r.get("Instructions Executed", "")) for r in body]
    samples = [_num(r.get("Warp Stall Sampling (All Samples)", "")) for r in body]
    total_i, total_s = sum(inst) or 1.0, sum(samples) or 1.0
    reasons = [h for h in rows[1] if h.startswith("stall_") and "Not Issued" not in h]
    stalls = {h.removeprefix("stall_"): sum(_num(r[h]) for r in body) / total_s * 100 for h in reasons}
    ops: dict[str, list[float]] = {}
    classes: dict[float, list[float]] = {}
    for r, i, sm in zip(body, inst, samples, strict=True):
        m = OPCODE.match(r.get("Source", "").strip())
        op = ops.setdefault(m.group(1) if m else "?", [0.0, 0.0])
        op[0] += i / total_i * 100
        op[1] += sm / total_s * 100
        c = classes.setdefault(i, [0, 0.0, 0.0])
        c[0] += 1
        c[1] += i / total_i * 100
        c[2] += sm / total_s * 100
    return {
        "kernel": kernel,
        "warp_instructions": sum(inst),
        "samples": sum(samples),
        "stalls_pct": dict(sorted(stalls.items(), key=lambda kv: -kv[1])[:6]),
        "opcodes_pct": {k: v for k, v in sorted(ops.items(), key=lambda kv: -kv[1][0])[:10]},
        "by_executions": [
            {"executed": e, "instructions": int(c[0]), "inst_pct": c[1], "samples_pct": c[2]}
            for e, c in sorted(classes.items(), key=lambda kv: -kv[1][1])[:5]
            if e > 0
        ],
    }


def print_source_pages(pages: dict[str, dict]) -> None:
    columns = ["case", "kernel", "warp instructions (M)", "stall samples %"]
    columns += ["opcodes: % instructions (% samples)"]
    columns += ["instructions run N times: count x N = % instructions (% samples)"]
    print("| " + " | ".join(columns) + " |")
    print("|" + "---|" * len(columns))
    for case, pg in pages.items():
        stalls = ", ".join(f"{r} {v:.0f}" for r, v in list(pg["stalls_pct"].items())[:4])
        ops = ", ".join(f"{o} {v[0]:.0f} ({v[1]:.0f})" for o, v in list(pg["opcodes_pct"].items())[:6])
        classes = ", ".join(
            f"{c['instructions']} x {c['executed']:.0f} = {c['inst_pct']:.0f} ({c['samples_pct']:.0f})"
            for c in pg["by_executions"][:3]
        )
        cells = [case, pg["kernel"][:40], f"{pg['warp_instructions'] / 1e6:.1f}", stalls, ops, classes]
        print("| " + " | ".join(cells) + " |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dir", type=Path)
    ap.add_argument("--json", type=Path, help="write the summary here too")
    args = ap.parse_args()
    table = {}
    columns = ["case", "kernel", "us", "DRAM GB/s (% peak)", "L2 hit %", "warps active %", "issue %", "regs"]
    columns += ["grid x block", "stalls (cycles / issue)"]
    print("| " + " | ".join(columns) + " |")
    print("|" + "---|" * len(columns))
    for path in sorted(args.dir.glob("ncu-*.csv")):
        case = path.stem.removeprefix("ncu-")
        table[case] = summarize(read(path))
        for s in table[case]:
            stalls = ", ".join(f"{r} {v:.1f}" for r, v in s["stalls"].items())
            print(
                f"| {case} | {s['kernel'][:40]} | {s['us']:.1f} | {s['dram_gbs']:.0f} ({s['dram_pct']:.0f}) "
                f"| {s['l2_hit']:.0f} | {s['warps_active_pct']:.0f} | {s['issue_pct']:.0f} | {s['regs']:.0f} "
                f"| {s['grid']:.0f} x {s['block']:.0f} | {stalls} |"
            )
    pages = {p.stem.removeprefix("src-"): source_page(p) for p in sorted(args.dir.glob("src-*.csv"))}
    pages = {case: page for case, page in pages.items() if page}
    if pages:
        print()
        print_source_pages(pages)
    if args.json:
        args.json.write_text(json.dumps({**table, **({"source": pages} if pages else {})}, indent=1) + "\n")


if __name__ == "__main__":
    main()
