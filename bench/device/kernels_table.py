"""Summary of a `bench/device/kernels.sh` run: the op checks against the CPU, the per-op timings and
the engine's passes in each mode (legacy, nosmall, default, smalldense, tiles, wide: kernels.sh's header says
what each switches; nonarrow and narrowall patch 0105's narrow kernel), as one JSON and a short table.

    python bench/device/kernels_table.py OUT_DIR --out OUT_DIR/kernels.json [--build-s S]

Per-op times come from test-backend-ops `perf` (us per run, its own repetition count); the byte
floor of an op is the bytes of weights it must read (for MUL_MAT_ID the experts its rows can be
expected to touch) at the H200's 4.8 TB/s.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
from pathlib import Path

HBM_BYTES_PER_S = 4.8e12
# bytes per weight of the types the cases use (ggml block size / block bytes)
BYTES_PER_WEIGHT = {
    "f32": 4,
    "q4_0": 18 / 32,
    "q4_K": 144 / 256,
    "q5_K": 176 / 256,
    "q6_K": 210 / 256,
    "q8_0": 34 / 32,
}
# the modes in the order the table shows them (then any other mode kernels.sh ran, by name: MODE_<tag>);
# a row's ratio columns are these modes against default
MODES = ("legacy", "nosmall", "nonarrow", "default", "narrowall", "smalldense", "tiles", "wide")
RATIOS = "x = legacy / default, s = nosmall / default, n = nonarrow / default"
RATIO_MODES = ("legacy", "nosmall", "nonarrow")
ANSI = re.compile(r"\x1b\[[0-9;]*m")
CASE = re.compile(r"^\s+([A-Z][A-Z0-9_]*)\((.*)\):\s*(.*)$")
PERF = re.compile(r"(\d+) runs -\s+([\d.]+) us/run")
# test-backend-ops' closing summary: a log without it ended early (an abort leaves the cases before it passed)
SUMMARY = re.compile(r"^\d+/\d+ backends passed", re.M)
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


GLU_OPS = ("MUL_MAT_ID_SMALL_GLU", "MUL_MAT_SMALL_GLU")


def glu_vars(v: dict[str, str]) -> dict[str, str]:
    """A gate + up + GLU case (`test_mul_mat_vec_fusion`: m tokens, n rows) in the matmuls' names."""
    return {**v, "type_a": v["type"], "m": v["n"], "n": v["m"]}


def byte_floor_us(op: str, v: dict[str, str]) -> float | None:
    """Microseconds to read the weights the op must touch once at HBM bandwidth."""
    matrices = 2 if op in GLU_OPS else 1  # a GLU case reads the gate and the up projection
    v = glu_vars(v) if matrices == 2 else v
    bpw = BYTES_PER_WEIGHT.get(v.get("type_a", ""))
    if bpw is None:
        return None
    m, n, k = int(v["m"]), int(v["n"]), int(v["k"])
    if op in ("MUL_MAT_SMALL", "MUL_MAT_SMALL_GLU"):
        return matrices * m * k * bpw / HBM_BYTES_PER_S * 1e6
    pool, used = int(v.get("n_active", v["n_mats"])), int(v["n_used"])
    touched = pool * (1 - (1 - used / pool) ** n)  # expected experts hit by n rows of `used` distinct picks
    return matrices * touched * m * k * bpw / HBM_BYTES_PER_S * 1e6


def log_text(path: Path) -> str:
    """A test-backend-ops log without its colours ("" where there is none)."""
    return ANSI.sub("", path.read_text(errors="replace")) if path.is_file() else ""


def read_log(text: str) -> dict[str, dict]:
    """Cases of one test-backend-ops log's text: name -> {'ok': bool} (test) or {'us': float} (perf)."""
    cases: dict[str, dict] = {}
    for line in text.splitlines():
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
    if not op.startswith("MUL_MAT"):  # GATED_DELTA_NET, the fusion cases: all their parameters
        return f"{op.lower()} " + " ".join(f"{k}={x}" for k, x in v.items())
    if op == "MUL_MAT_SMALL":
        return f"mm {v['type_a']} {v['m']}x{v['k']} n={v['n']}"
    if op in GLU_OPS:
        g = glu_vars(v)
        experts = f" e={g['n_mats']}/{g['n_mats']}" if op == "MUL_MAT_ID_SMALL_GLU" else ""
        return f"glu {g['type_a']} 2x{g['m']}x{g['k']}{experts} n={g['n']}"
    pool = v.get("n_active", v["n_mats"])
    return f"mmid {v['type_a']} {v['m']}x{v['k']} e={pool}/{v['n_mats']} n={v['n']}"


def cell(v: float | None, fmt: str = "8.1f") -> str:
    return format(v, fmt) if isinstance(v, (int, float)) else f"{'-':>8s}"


def present(rows: list[dict], suffix: str, modes: tuple[str, ...]) -> list[str]:
    """The modes some row has a value for, in the given order."""
    return [m for m in modes if any(r.get(f"{m}{suffix}") is not None for r in rows)]


def run_modes(d: Path) -> tuple[str, ...]:
    """MODES, then the other modes of the logs in d (tbo-perf-MODE.log, passes-MODE[-N].json)."""
    found = {p.name[len("tbo-perf-") : -len(".log")] for p in d.glob("tbo-perf-*.log")}
    found |= {re.sub(r"-\d+$", "", p.name[len("passes-") : -len(".json")]) for p in d.glob("passes-*.json")}
    return MODES + tuple(sorted(found - set(MODES)))


def ratio(old: object, new: object) -> str:
    ok = isinstance(old, (int, float)) and isinstance(new, (int, float)) and new
    return f"{old / new:5.2f}" if ok else f"{'':5s}"


def print_table(result: dict) -> None:
    """The short table printed last on the device: checks, per-op times, pass times."""
    print(f"\n== checks against the CPU (test-backend-ops), build {result['build_s']:.0f} s")
    for name, c in result["checks"].items():
        failed = f"  FAILED: {c['failed_cases'][:5]}" if c["failed"] else ""
        ended = "" if c["finished"] else "  ENDED EARLY: no summary line (an abort? see the log)"
        print(f"{name:22s} {c['cases'] - c['failed']}/{c['cases']} ok{failed}{ended}")
    ops = result["ops"]
    modes = present(ops, "_us", tuple(result["modes"]))
    print(f"\n== ops, us per run (floor: weights read once at 4.8 TB/s); {RATIOS}")
    heads = " ".join(f"{m:>8s}" for m in modes)
    print(f"{'case':44s} {'floor':>8s} {heads} {'x':>5s} {'s':>5s} {'n':>5s}")
    for r in ops:
        times = " ".join(cell(v) for v in (r["floor_us"], *(r.get(f"{m}_us") for m in modes)))
        ratios = " ".join(ratio(r.get(f"{m}_us"), r.get("default_us")) for m in RATIO_MODES)
        print(f"{r['short']:44s} {times} {ratios}")
    passes = result["passes"]
    if not passes:
        return
    modes = [m for m in result["modes"] if m in passes]
    print(f"\n== engine passes (timing.py, ms, median of a mode's runs); {RATIOS}")
    print(f"{'pass':26s} " + " ".join(f"{m:>8s}" for m in modes) + f" {'x':>5s} {'s':>5s} {'n':>5s}")
    by = {m: passes[m].get("preview_ms_by_coreset") or {} for m in modes}
    keys = (*PASS_KEYS, "pp512_ms", *(f"{k}_chunk8" for k in PASS_KEYS[3:]))
    rows = [(k, {m: passes[m].get(k) for m in modes}) for k in keys]
    rows += [(f"preview coreset {n}", {m: by[m].get(n) for m in modes}) for n in by[modes[0]]]
    for name, v in rows:
        times = " ".join(cell(v[m], "8.3f") for m in modes)
        ratios = " ".join(ratio(v.get(m), v.get("default")) for m in RATIO_MODES)
        print(f"{name:26s} {times} {ratios}")


def median(values: list) -> float | None:
    """The median of the numbers among values (a mode's runs may lack a key)."""
    nums = [v for v in values if isinstance(v, (int, float))]
    return statistics.median(nums) if nums else None


def pass_times(res: dict) -> dict:
    """The pass keys of one timing.py result."""
    out = {k: res.get(k) for k in PASS_KEYS}
    out["pp512_ms"] = (res.get("pp_ms") or {}).get("512")
    out["preview_ms_by_coreset"] = res.get("preview_ms_by_coreset") or {}
    # the routed experts in chunks of 8 rows (patch 0008: the matrix-vector expert kernels)
    chunk8 = (res.get("by_moe_chunk") or {}).get("8") or {}
    for k in ("commit_ms_per_block", "preview_ms", "preview_coreset_ms", "fused_pass_ms"):
        out[f"{k}_chunk8"] = chunk8.get(k)
    return out


def mode_passes(runs: list[dict]) -> dict:
    """One mode's runs (passes-MODE.json, passes-MODE-2.json, ...) as the median of each key."""
    keys = [k for k in runs[0] if k != "preview_ms_by_coreset"]
    out: dict = {k: median([r.get(k) for r in runs]) for k in keys}
    sizes = runs[0]["preview_ms_by_coreset"]
    by = [r["preview_ms_by_coreset"] for r in runs]
    out["preview_ms_by_coreset"] = {n: median([b.get(n) for b in by]) for n in sizes}
    out["runs"] = len(runs)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out_dir", type=Path)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--build-s", default="0")
    args = ap.parse_args(argv)
    d = args.out_dir

    checks = {}
    for log in sorted(d.glob("tbo-eval-*.log")):
        name = log.stem.removeprefix("tbo-")
        if name.endswith("-sanitizer"):
            continue
        text = log_text(log)
        cases = read_log(text)
        finished = bool(SUMMARY.search(text))
        if cases or not finished:  # an eval that matched no case is no check; one that died before any is
            failed = [c for c, r in cases.items() if not r["ok"]]
            checks[name] = {
                "cases": len(cases),
                "failed": len(failed),
                "failed_cases": failed[:50],
                "finished": finished,
            }

    modes = run_modes(d)
    perf = {mode: read_log(log_text(d / f"tbo-perf-{mode}.log")) for mode in modes}
    names = list(dict.fromkeys(n for mode in modes for n in perf[mode]))
    rows = []
    for name in names:
        r = next(perf[m][name] for m in modes if name in perf[m])
        floor = byte_floor_us(r["op"], r["vars"])
        row = {"case": name, "short": short(r["op"], r["vars"]), "floor_us": floor}
        for mode in modes:
            if name in perf[mode]:
                row[f"{mode}_us"] = perf[mode][name]["us"]
        rows.append(row)

    passes = {}
    for mode in modes:
        files = [d / f"passes-{mode}.json", *sorted(d.glob(f"passes-{mode}-*.json"))]
        runs = [pass_times(json.loads(f.read_text())) for f in files if f.is_file()]
        if runs:
            passes[mode] = mode_passes(runs)

    notes = d / "notes.jsonl"
    result = {
        "build_s": float(args.build_s or 0),
        "machine": (d / "machine.txt").read_text().strip() if (d / "machine.txt").is_file() else "",
        "checks": checks,
        "modes": list(modes),
        "ops": rows,
        "passes": passes,
        "notes": [json.loads(x) for x in notes.read_text().splitlines()] if notes.is_file() else [],
    }
    args.out.write_text(json.dumps(result, indent=1) + "\n")

    print_table(result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
