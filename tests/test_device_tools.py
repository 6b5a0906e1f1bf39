"""bench/device's stalls_table.py and same_logits.py (Nsight Compute CSVs read back, logits compared) and
bench/pass_in_loop.py, run."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parent.parent


def _load(name: str, as_name: str | None = None):
    spec = importlib.util.spec_from_file_location(as_name or name, ROOT / f"bench/device/{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


stalls_table = _load("stalls_table")
same_logits = _load("same_logits")
# profile.py imports stalls_table from its own folder (it runs as `python bench/device/profile.py`);
# here that import finds the module loaded above, without bench/device on sys.path, where profile.py
# would shadow the standard library's `profile` (cProfile, and through it transformers, import it)
sys.modules.setdefault("stalls_table", stalls_table)
profile = _load("profile", "device_profile")

STALL = "smsp__average_warps_issue_stalled_{}_per_issue_active.ratio"
HEADER = [
    "ID",
    "Kernel Name",
    "gpu__time_duration.sum",
    "gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed",
    "dram__bytes.sum.per_second",
    "launch__registers_per_thread",
] + [STALL.format(r) for r in ("barrier", "long_scoreboard", "wait", "selected")]
UNITS = ["", "", "ns", "%", "Gbyte/s", "register/thread", "", "", "", ""]


def _csv(rows: list[list[str]], units: list[str] = UNITS) -> str:
    # ncu --csv --page raw: its own lines first, then the header, the units and one row per launch
    lines = ["==PROF== Connected to process 1 (test-backend-ops)"]
    lines += [",".join(f'"{c}"' for c in row) for row in [HEADER, units, *rows]]
    return "\n".join(lines) + "\n"


def test_stalls_table_medians_units_and_largest_stalls(tmp_path: Path, capsys) -> None:
    mmq = "void mul_mat_q<14, 32, 0, 30>(const char *, int)"
    (tmp_path / "ncu-dense.csv").write_text(
        _csv(
            [
                ["0", "quantize_q8_1(const float *)", "2,800", "2", "95", "20", "0.1", "4.7", "1.8", "1.0"],
                ["1", mmq, "19,000", "15", "700", "168", "0.2", "1.0", "0.8", "1.0"],
                ["2", mmq, "21,000", "17", "760", "168", "0.3", "1.2", "0.6", "1.0"],
                ["3", mmq, "40,000", "9", "300", "168", "0.1", "1.1", "0.9", "1.0"],
            ]
        )
    )
    table = {
        case: stalls_table.summarize(stalls_table.read(p))
        for case, p in [("dense", tmp_path / "ncu-dense.csv")]
    }
    quant, mm = table["dense"]
    assert quant["kernel"] == "quantize_q8_1" and quant["launches"] == 1 and quant["us"] == pytest.approx(2.8)
    assert mm["kernel"] == "void mul_mat_q<14, 32, 0, 30>" and mm["launches"] == 3
    assert mm["us"] == pytest.approx(21.0) and mm["dram_gbs"] == pytest.approx(700) and mm["regs"] == 168
    assert list(mm["stalls"]) == ["long_scoreboard", "selected", "wait"]
    assert mm["stalls"]["long_scoreboard"] == pytest.approx(1.1)
    sys_argv = sys.argv  # the CLI prints the same rows as a markdown table
    try:
        sys.argv = ["stalls_table.py", str(tmp_path), "--json", str(tmp_path / "s.json")]
        stalls_table.main()
    finally:
        sys.argv = sys_argv
    out = capsys.readouterr().out
    assert "| dense | void mul_mat_q<14, 32, 0, 30> | 21.0 | 700 (15) |" in out
    assert (tmp_path / "s.json").read_text().count('"launches"') == 2


def test_profile_summarize_reads_the_same_csvs_by_kernel_kind(tmp_path: Path) -> None:
    # the CSV reader stalls_table.py uses: durations go by the units row (ncu prints ns or us)
    mmq = "void mul_mat_q<14, 32, 0, 30>(const char *, int)"
    rows = [
        ["0", "quantize_q8_1(const float *)", "2,800", "2", "95", "20", "0", "0", "0", "0"],
        ["1", mmq, "19,000", "15", "700", "168", "0", "0", "0", "0"],
    ]
    (tmp_path / "ncu-preview.csv").write_text(_csv(rows))
    (tmp_path / "ncu-commit.csv").write_text(_csv(rows, units=[*UNITS[:2], "us", *UNITS[3:]]))
    res = profile.summarize([tmp_path / "ncu-preview.csv", tmp_path / "ncu-commit.csv"])
    assert res["preview"]["kernels"] == 2 and res["preview"]["kernel_sum_ms"] == pytest.approx(0.0218)
    assert res["preview"]["by_kind_us"]["matmul: mmq"] == {"n": 1, "us": 19.0}
    assert res["commit"]["kernel_sum_ms"] == pytest.approx(21.8)


def test_trace_summary_counts_an_early_launched_kernel_from_the_end_of_the_one_it_waits_for() -> None:
    # two passes of three kernels (us): B launched with programmatic dependent launch starts inside A
    # and waits for it; its duration counts that wait, its exclusive time does not
    one = [("A", 0.0, 10.0), ("B", 5.0, 12.0), ("mul_mat_q<14>", 15.0, 20.0)]
    kernels = one + [(n, s + 100.0, e + 100.0) for n, s, e in one]
    res = profile.trace_summary("preview", 2, kernels)
    assert res["kernels_per_pass"] == 3
    assert res["gpu_span_ms"] == [0.02, 0.02] and res["kernel_sum_ms"] == [0.022, 0.022]
    top = res["top_kernels_us"]
    assert top["B"] == {"n": 1, "us": 7.0, "exclusive_us": 2.0}
    assert top["A"]["exclusive_us"] == 10.0 and top["mul_mat_q<14>"]["exclusive_us"] == 5.0
    assert list(top) == ["A", "mul_mat_q<14>", "B"]  # by exclusive time
    assert sum(v["exclusive_us"] for v in top.values()) == 17.0  # the busy time: the span less its gap
    assert res["by_kind_us"]["matmul: mmq"] == {"n": 1, "us": 5.0}
    last = [["A", 0.0, 10.0, 10.0], ["B", 5.0, 7.0, 2.0], ["mul_mat_q<14>", 15.0, 5.0, 5.0]]
    assert res["last_pass"] == last  # the second pass kernel by kernel, from its first kernel's start


def test_stalls_table_reads_a_case_without_kernels_as_empty(tmp_path: Path) -> None:
    p = tmp_path / "ncu-none.csv"
    p.write_text("==WARNING== No kernels were profiled.\n")
    assert stalls_table.read(p) == []


def test_stalls_table_source_page_by_reason_opcode_and_execution_count(tmp_path: Path, capsys) -> None:
    # ncu --page source --csv --print-source sass: the kernel's name, a header, one row per SASS instruction
    header = ["Address", "Source", "Warp Stall Sampling (All Samples)", "Instructions Executed"]
    header += ["stall_barrier", "stall_long_sb", "stall_wait", "stall_barrier (Not Issued)"]
    rows = [
        ["0x10", "LDC R1, c[0x0][0x28]", "2", "100", "0", "0", "2", "0"],  # once per warp
        ["0x20", "@P4   LDG.E.U16 R9, desc[UR14][R4.64+0x10]", "35", "800", "0", "35", "0", "0"],  # per step
        ["0x30", "@!P4  LDG.E R9, desc[UR14][R4.64+0x10]", "10", "800", "0", "10", "0", "0"],
        ["0x40", "HMMA.16816.F32 R32, R36, R62, R32", "18", "800", "0", "0", "18", "0"],
        ["0x50", "BAR.SYNC.DEFER_BLOCKING 0x0", "35", "200", "35", "0", "0", "35"],  # per work item
    ]
    kernel = "void mul_mat_q_narrow<(ggml_type)14, (int)32, (bool)0>(const char *, const void *, int)"
    text = f'"Kernel Name","{kernel}",\n' + "\n".join(",".join(f'"{c}"' for c in r) for r in [header, *rows])
    (tmp_path / "src-dense.csv").write_text(text + "\n")
    page = stalls_table.source_page(tmp_path / "src-dense.csv")
    assert page["kernel"] == "void mul_mat_q_narrow<14, 32, 0>"
    assert page["warp_instructions"] == 2700 and page["samples"] == 100
    assert page["stalls_pct"] == {"long_sb": 45.0, "barrier": 35.0, "wait": 20.0}  # "Not Issued" left out
    assert list(page["opcodes_pct"]) == ["LDG", "HMMA", "BAR", "LDC"]  # predicates stripped, by instructions
    assert page["opcodes_pct"]["LDG"] == pytest.approx([1600 / 27, 45.0])
    step, item, warp = page["by_executions"]
    assert (step["executed"], step["instructions"], step["samples_pct"]) == (800, 3, 63.0)
    assert step["inst_pct"] == pytest.approx(2400 / 27)
    assert item["executed"] == 200 and warp["executed"] == 100
    (tmp_path / "src-none.csv").write_text('"Kernel Name","k",\n')  # ncu found no kernel: no table row
    assert stalls_table.source_page(tmp_path / "src-none.csv") == {}
    sys_argv = sys.argv
    try:
        sys.argv = ["stalls_table.py", str(tmp_path)]
        stalls_table.main()
    finally:
        sys.argv = sys_argv
    out = capsys.readouterr().out
    assert "| dense | void mul_mat_q_narrow<14, 32, 0> | 0.0 | long_sb 45, barrier 35, wait 20 |" in out


def test_same_logits_compare_names_identical_and_differing_batches() -> None:
    a = {"32": np.arange(6, dtype=np.float32).reshape(2, 3), "64": np.ones((4, 3), np.float32)}
    b = {"32": a["32"].copy(), "64": a["64"].copy()}
    b["64"][1, 2] += 0.5
    lines, differs = same_logits.compare(a, b, [32, 64])
    assert differs
    assert lines == ["32 rows: identical (6 logits)", "64 rows: 1 of 12 logits differ, at most 0.5"]
    assert same_logits.compare(a, a, [32, 64])[1] is False


def test_same_logits_against_the_cpu_flags_a_default_twice_as_far_as_the_switch() -> None:
    cpu = {"32": np.array([[0.0, 1.0, 2.0], [3.0, 0.0, 1.0]], np.float32)}
    switched = {"32": cpu["32"] + np.float32(0.1)}
    close = {"32": cpu["32"] - np.float32(0.15)}
    lines, worse = same_logits.against_cpu(close, switched, cpu, [32], "GGML_CUDA_MMQ_NARROW=0")
    assert not worse
    assert lines == [
        "32 rows, default against the CPU: at most 0.15, argmax 2 of 32",
        "32 rows, GGML_CUDA_MMQ_NARROW=0 against the CPU: at most 0.1, argmax 2 of 32",
    ]
    far = {"32": cpu["32"].copy()}
    far["32"][1, 1] += 4.0  # 0.1 * 2 < 4: and row 1's argmax moves
    lines, worse = same_logits.against_cpu(far, switched, cpu, [32], "S=1")
    assert worse and lines[0] == "32 rows, default against the CPU: at most 4, argmax 1 of 32"


@pytest.mark.llama
def test_same_logits_on_the_cpu_is_identical_for_a_cuda_switch(llama_gguf: Path) -> None:
    # a CUDA switch cannot change a CPU run: two real processes, every row's logits, bit-identical
    cmd = [
        sys.executable,
        str(ROOT / "bench/device/same_logits.py"),
        str(llama_gguf),
        "GGML_CUDA_MMQ_NARROW=0",
        "--rows",
        "8,17",
    ]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    vocab = 512  # the tiny preset's
    assert res.stdout.splitlines() == [f"{n} rows: identical ({n * vocab} logits)" for n in (8, 17)]


@pytest.mark.llama
def test_same_logits_against_the_cpu_runs_three_real_processes(llama_gguf: Path) -> None:
    # without a GPU all three processes run the CPU backend: both settings at 0 from it, every argmax kept
    cmd = [sys.executable, str(ROOT / "bench/device/same_logits.py"), str(llama_gguf)]
    cmd += ["GGML_CUDA_MMQ_NARROW=0", "--rows", "8", "--cpu"]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stdout.splitlines() == [
        "8 rows, default against the CPU: at most 0, argmax 8 of 8",
        "8 rows, GGML_CUDA_MMQ_NARROW=0 against the CPU: at most 0, argmax 8 of 8",
    ]


def _run_sh(tmp_path: Path, source: bytes) -> str:
    """run.sh with no stages on a carry whose source is `source`, in one WORK across calls."""
    # one carry a source, made once: a tarball made again would differ by its file's mtime
    carry, work, out = tmp_path / f"carry-{source.hex()}", tmp_path / "work", tmp_path / "out"
    if not carry.exists():
        carry.mkdir()
        (carry / "f").write_bytes(source)
        subprocess.run(["tar", "czf", carry / "llama-src.tar.gz", "-C", carry, "f"], check=True)
    work.mkdir(exist_ok=True)
    out.mkdir(exist_ok=True)
    env = {"PATH": "/usr/bin:/bin", "STAGES": "none", "CARRY": str(carry), "WORK": str(work)}
    env |= {"OUT": str(out), "PY": sys.executable}
    res = subprocess.run(
        ["bash", "bench/device/run.sh"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert res.returncode == 0, res.stderr
    return (out / "run.log").read_text()


def test_run_sh_keeps_an_earlier_calls_timings_only_for_the_same_source(tmp_path: Path) -> None:
    # a warm machine's second call keeps the first's timing files only when it carries the same
    # source: an experiment's carry after the series' must not report the series' runs as its own
    _run_sh(tmp_path, b"series")
    timing = tmp_path / "work" / "timing-clover-40-q4_k_m.json"
    timing.write_text("{}")
    assert "set aside" not in _run_sh(tmp_path, b"series")
    assert timing.exists()
    log = _run_sh(tmp_path, b"series + experiment")
    assert "set aside" in log
    assert not timing.exists()
    assert len(list((tmp_path / "work").glob("results-*/timing-clover-40-q4_k_m.json"))) == 1


@pytest.mark.llama
def test_pass_in_loop_times_the_verification_three_ways(llama_gguf: Path, tmp_path: Path) -> None:
    # a real process on the CPU: each way times its 2 + 2 calls (the loop's too: a = 1 keeps every
    # one-token draft), and the CPU backend logs no CUDA graph events
    out = tmp_path / "p.json"
    cmd = [sys.executable, str(ROOT / "bench/pass_in_loop.py"), str(llama_gguf), "--gpu-layers", "0"]
    cmd += ["--reps", "1", "--calls", "4", "--json", str(out)]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    got = json.loads(out.read_text())
    assert list(got) == ["alone", "advancing", "loop"]
    assert [got[w]["calls"] for w in ("alone", "advancing")] == [4, 4]
    assert got["loop"]["calls"] >= 4
    assert all(r["median_ms"] > 0 and r["events"] == {} for r in got.values())


def test_slot_misses_counts_the_passes_a_loop_rebuilds_per_slot_count(
    llama_gguf: Path, tmp_path: Path
) -> None:
    # a real process on the CPU: the speculative loop's ~11 pass shapes cycle through 4 slots, so
    # every run rebuilds some of them; 12 slots hold them all, so its last run rebuilds none
    out = tmp_path / "m.json"
    cmd = [sys.executable, str(ROOT / "bench/slot_misses.py"), str(llama_gguf), "--slots", "4", "12"]
    cmd += ["--loops", "a1", "--runs", "2", "--json", str(out)]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    got = json.loads(out.read_text())
    assert got["4"]["a1"]["calls"] == got["12"]["a1"]["calls"] > 100
    assert got["4"]["a1"]["misses"] > 0 and got["12"]["a1"]["misses"] == 0
