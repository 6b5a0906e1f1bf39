"""Summary of a `bench/device/kernels.sh` run: the op checks against the CPU, the per-op timings
legacy / default / wide, and the engine's passes legacy / default, as one JSON and a short table.

    python bench/device/kernels_table.py OUT_DIR --out OUT_DIR/kernels.json [--build-s S]

Per-op times come from test-backend-ops `perf` (us per run, its own repetition count); the byte
floor of an op is the bytes of weights it must read (for MUL_MAT_ID the experts its rows can be
expected to touch) at the H200's 4.8 TB/s.
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

HBM_BYTES_PER_S = 4.8e12
# bytes per weight of the types the cases use (ggml block size / block bytes)
BYTES_PER_WEIGHT = {"q4_0": 18 / 32, "q4_K": 144 / 256, "q5_K": 176 / 256, "q6_K": 210 / 256, "q8_0": 34 / 32}
ANSI = re.compile(r"\x1b\[[0-9;]*m")
CASE = re.compile(r"^\s+(MUL_MAT\w*)\((.*)\):\s*(.*)$")
PERF = re.compile(r"(\d+) runs -\s+([\d.]+) us/run")
PASS_KEYS = (
    "ar_step_ms",
    "causal32_ms",
    "engine_ar_step_ms",
    "commit_ms_per_block",
    "preview_ms",
    "preview_coreset_ms",
    "fused_pass_ms",
)


def parse_vars(text: str) -> dict[str, str]:
    """`a=1,b=[1,2],c=x` -> {'a': '1', 'b': '[1,2]', 'c': 'x'} (commas inside brackets kept)."""
    out, depth, key, cur = {}, 0, "", ""
    for ch in text + ",":
        if ch in "[(":
            depth += 1
        elif ch in "])":
            depth -= 1
        if ch == "=" and depth == 0 and not key:
            key, cur = cur, ""
        elif ch == "," and depth == 0:
            out[key] = cur
            key, cur = "", ""
        else:
            cur += ch
    return out


def byte_floor_us(op: str, v: dict[str, str]) -> float | None:
    """Microseconds to read the weights the op must touch once at HBM bandwidth."""
    bpw = BYTES_PER_WEIGHT.get(v.get("type_a", ""))
    if bpw is None:
        return None
    m, n, k = int(v["m"]), int(v["n"]), int(v["k"])
    if op == "MUL_MAT_SMALL":
        return m * k * bpw / HBM_BYTES_PER_S * 1e6
    pool, used = int(v.get("n_active", v["n_mats"])), int(v["n_used"])
    touched = pool * (1 - (1 - used / pool) ** n)  # expected experts hit by n rows of `used` distinct picks
    return touched * m * k * bpw / HBM_BYTES_PER_S * 1e6


def read_log(path: Path) -> dict[str, dict]:
    """Cases of one test-backend-ops log: name -> {'ok': bool} (test) or {'us': float} (perf)."""
    cases: dict[str, dict] = {}
    if not path.is_file():
        return cases
    for line in ANSI.sub("", path.read_text(errors="replace")).splitlines():
        m = CASE.match(line)
        if not m:
            continue
        op, params, rest = m.groups()
        name = f"{op}({params})"
        if p := PERF.search(rest):
            cases[name] = {"op": op, "vars": parse_vars(params), "us": float(p.group(2))}
        elif rest.endswith("OK") or rest.endswith("FAIL"):
            cases[name] = {"op": op, "vars": parse_vars(params), "ok": rest.endswith("OK")}
    return cases


def short(op: str, v: dict[str, str]) -> str:
    if op == "MUL_MAT_SMALL":
        return f"mm {v['type_a']} {v['m']}x{v['k']} n={v['n']}"
    pool = v.get("n_active", v["n_mats"])
    return f"mmid {v['type_a']} {v['m']}x{v['k']} e={pool}/{v['n_mats']} n={v['n']}"


def cell(v: float | None, fmt: str = "8.1f") -> str:
    return format(v, fmt) if isinstance(v, (int, float)) else f"{'-':>8s}"


def print_table(result: dict) -> None:
    """The short table printed last on the device: checks, per-op times, pass times."""
    print(f"\n== checks against the CPU (test-backend-ops), build {result['build_s']:.0f} s")
    for name, c in result["checks"].items():
        failed = f"  FAILED: {c['failed_cases'][:5]}" if c["failed"] else ""
        print(f"{name:22s} {c['cases'] - c['failed']}/{c['cases']} ok{failed}")
    print("\n== ops, us per run (floor: weights read once at 4.8 TB/s); x = legacy / default")
    print(f"{'case':44s} {'floor':>8s} {'legacy':>8s} {'default':>8s} {'wide':>8s} {'x':>5s}")
    for r in result["ops"]:
        dflt = r.get("default_us")
        x = f"{r['legacy_us'] / dflt:5.2f}" if dflt else f"{'-':>5s}"
        times = " ".join(cell(v) for v in (r["floor_us"], r["legacy_us"], dflt, r.get("wide_us")))
        print(f"{r['short']:44s} {times} {x}")
    passes = result["passes"]
    if not passes:
        return
    modes = ("legacy", "default")
    print("\n== engine passes (timing.py, ms, median)")
    print(f"{'pass':26s} {'legacy':>8s} {'default':>8s} {'x':>5s}")
    by = [passes.get(m, {}).get("preview_ms_by_coreset") or {} for m in modes]
    keys = (*PASS_KEYS, "pp512_ms", *(f"{k}_chunk8" for k in PASS_KEYS[3:]))
    rows = [(k, [passes.get(m, {}).get(k) for m in modes]) for k in keys]
    rows += [(f"preview coreset {n}", [b.get(n) for b in by]) for n in by[0]]
    for name, (old, new) in rows:
        x = (
            f"{old / new:5.2f}"
            if isinstance(old, (int, float)) and isinstance(new, (int, float)) and new
            else ""
        )
        print(f"{name:26s} {cell(old, '8.3f')} {cell(new, '8.3f')} {x}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out_dir", type=Path)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--build-s", default="0")
    args = ap.parse_args(argv)
    d = args.out_dir

    checks = {}
    for name in ("eval-default", "eval-wide", "eval-upstream-mmid"):
        cases = read_log(d / f"tbo-{name}.log")
        if cases:
            failed = [c for c, r in cases.items() if not r["ok"]]
            checks[name] = {"cases": len(cases), "failed": len(failed), "failed_cases": failed[:50]}

    perf = {mode: read_log(d / f"tbo-perf-{mode}.log") for mode in ("legacy", "default", "wide")}
    rows = []
    for name, r in perf["legacy"].items():
        floor = byte_floor_us(r["op"], r["vars"])
        row = {"case": name, "short": short(r["op"], r["vars"]), "floor_us": floor, "legacy_us": r["us"]}
        for mode in ("default", "wide"):
            if name in perf[mode]:
                row[f"{mode}_us"] = perf[mode][name]["us"]
        rows.append(row)

    passes = {}
    for mode in ("legacy", "default"):
        f = d / f"passes-{mode}.json"
        if f.is_file():
            res = json.loads(f.read_text())
            passes[mode] = {k: res.get(k) for k in PASS_KEYS}
            passes[mode]["pp512_ms"] = (res.get("pp_ms") or {}).get("512")
            passes[mode]["preview_ms_by_coreset"] = res.get("preview_ms_by_coreset")
            # the routed experts in chunks of 8 rows (patch 0008: the matrix-vector expert kernels)
            chunk8 = (res.get("by_moe_chunk") or {}).get("8") or {}
            for k in ("commit_ms_per_block", "preview_ms", "preview_coreset_ms", "fused_pass_ms"):
                passes[mode][f"{k}_chunk8"] = chunk8.get(k)

    notes = d / "notes.jsonl"
    result = {
        "build_s": float(args.build_s or 0),
        "machine": (d / "machine.txt").read_text().strip() if (d / "machine.txt").is_file() else "",
        "checks": checks,
        "ops": rows,
        "passes": passes,
        "notes": [json.loads(x) for x in notes.read_text().splitlines()] if notes.is_file() else [],
    }
    args.out.write_text(json.dumps(result, indent=1) + "\n")

    print_table(result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
