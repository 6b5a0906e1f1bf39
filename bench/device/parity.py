"""Device parity: `clover verify` on the device's CPU (extra buffer types on and off) and on its
GPU, and the engine's logits GPU against CPU and CPU repacked against CPU plain, on generated
checkpoints.

    python bench/device/parity.py --out parity.json [--presets tiny,small] [--quants f32,q8_0,q4_k_m]

A run cut short resumes where it stopped when started again with the same --out, presets and
file types (the reference's results are kept next to --out: `--out`'s stem + `-reference-PRESET.npz`).

Per preset and file type: max abs diff and argmax agreement of causal logits (a 48-token prompt:
one full 32-row chunk and a partial one) and of preview logits (one block, half masks), GPU vs
CPU and CPU with extra buffer types (AMX / CPU_REPACK weight layouts) vs without; whether a preview
on the GPU leaves the sequence's memory state byte-identical; `clover verify` reports. The result
holds `cpu_verify[type].passed` (every preset passes with and without extra buffer types) and
`gpu_verify[type].passed` (every preset, all layers offloaded), and the CPU's ggml features
(`AMX_INT8`, `REPACK`). CPU runs happen in processes that see no CUDA device: in-process, a CUDA
build offloads the matmuls of batches >= 32 rows to the GPU even with no layer on it. Without GPU
offload in the build (a CPU machine) the GPU parts are skipped. `full-width` means its first
`--layers` layers (default 4); its float64 reference needs ~35 GB of memory and minutes, so each
preset's reference runs once (`clover verify --reference-cache`) for all its file types and backends.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

CPU_ENV = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
PASSES = ("causal", "preview", "commit")


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def cpu_logits(path: Path, prompt: list[int], block: list[int], out: Path) -> None:
    """Causal and preview logits on the CPU alone, with extra buffer types on and off."""
    from clover_local.llama.engine import LlamaEngine

    found = {}
    for tag, extra in (("repack", True), ("plain", False)):
        with LlamaEngine(
            path,
            n_ctx=512,
            n_gpu_layers=0,
            f32_cache=True,
            flash_attn=False,
            log=True,
            extra_buffer_types=extra,
        ) as cpu:
            found[f"causal_{tag}"] = cpu.causal_logits(prompt)
            found[f"preview_{tag}"] = cpu.preview_logits(block) if cpu.has_diffusion else np.zeros((0,))
    np.savez(out, **found)


def diff(a: np.ndarray, b: np.ndarray) -> tuple[float, float]:
    """Max abs difference and argmax agreement of two [rows, vocab] logit arrays."""
    return float(np.abs(a - b).max()), float((a.argmax(-1) == b.argmax(-1)).mean())


def compare(path: Path, mask: int, gpu: bool) -> dict:
    """GPU vs CPU and CPU repacked vs CPU plain logits of one file."""
    from clover_local.llama.engine import LlamaEngine

    rng = np.random.default_rng(7)
    out: dict = {}
    with LlamaEngine(
        path, n_ctx=512, n_gpu_layers=999 if gpu else 0, f32_cache=True, flash_attn=False, log=True
    ) as e:
        V = e.vocab_size
        prompt = [int(t) for t in rng.integers(0, min(V, 151000), size=48)]
        block = [mask if i % 2 else int(t) for i, t in enumerate(rng.integers(0, min(V, 151000), size=32))]
        if gpu:
            c_gpu = e.causal_logits(prompt)
            before = e.state_bytes()
            p_gpu = e.preview_logits(block) if e.has_diffusion else None
            if p_gpu is not None:
                for _ in range(3):
                    e.preview_logits(block)
            out["preview_state_unchanged_gpu"] = e.state_bytes() == before
    npz = path.with_suffix(".cpu.npz")
    spec = json.dumps({"model": str(path), "prompt": prompt, "block": block, "out": str(npz)})
    subprocess.run(
        [sys.executable, __file__, "--cpu-run", spec], check=True, capture_output=True, env=CPU_ENV
    )
    cpu = dict(np.load(npz))
    has_preview = cpu["preview_plain"].size > 0
    out["cpu_repack_causal_max_abs_diff"], out["cpu_repack_causal_token_agreement"] = diff(
        cpu["causal_repack"], cpu["causal_plain"]
    )
    if has_preview:
        out["cpu_repack_preview_max_abs_diff"], out["cpu_repack_preview_token_agreement"] = diff(
            cpu["preview_repack"], cpu["preview_plain"]
        )
    if gpu:
        out["causal_max_abs_diff"], out["causal_token_agreement"] = diff(cpu["causal_repack"], c_gpu)
        if has_preview:
            out["preview_max_abs_diff"], out["preview_token_agreement"] = diff(cpu["preview_repack"], p_gpu)
    return out


def verify_cmd(path: Path, ckpt: Path, cache: Path, *extra: str) -> list[str]:
    return [
        sys.executable,
        "-c",
        "import sys; from clover_local.cli import app; sys.argv[0]='clover'; app()",
        "verify",
        str(path),
        "--reference",
        str(ckpt),
        "--reference-cache",
        str(cache),
        "--json",
        *extra,
    ]


def summary(report: dict) -> dict:
    """A verify report without its token lists: verdict, failures and the per-pass metrics."""
    keep = (
        "passed",
        "failures",
        "backend",
        "file_type",
        "token_agreement",
        "speculative_identical",
        "speculative_divergence",
    )
    return {**{k: report.get(k) for k in keep}, **{p: report.get(p) for p in PASSES}}


def run_verifies(path: Path, ckpt: Path, cache: Path, gpu: bool, threads: int) -> dict[str, dict]:
    """`clover verify` on the CPU with and without extra buffer types, and on the GPU, at the same
    time; the first alone while `cache` holds no reference run (it computes the float64 reference,
    ~35 GB and minutes at full width, which the others and the next file types then read)."""
    runs = {
        "cpu": (verify_cmd(path, ckpt, cache, "-t", str(threads)), CPU_ENV),
        "cpu_no_repack": (verify_cmd(path, ckpt, cache, "-t", str(threads), "--no-repack"), CPU_ENV),
    }
    if gpu:
        runs["gpu"] = (verify_cmd(path, ckpt, cache, "--n-gpu-layers", "-1"), dict(os.environ))
    found = {}
    items = list(runs.items())
    rounds = [items] if cache.is_file() else [items[:1], items[1:]]
    for part in rounds:
        procs = {
            k: subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
            for k, (cmd, env) in part
        }
        for k, p in procs.items():
            stdout, stderr = p.communicate()
            try:
                found[k] = summary(json.loads(stdout))
            except json.JSONDecodeError:
                found[k] = {
                    "passed": False,
                    "rc": p.returncode,
                    "stdout": stdout[-1500:],
                    "stderr": stderr[-800:],
                }
    return found


def convert(ckpt: Path, out: Path, q: str) -> str | None:
    """Convert; None on success, else the converter's last error line."""
    r = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from clover_convert.cli import main; sys.exit(main())",
            str(ckpt),
            "-o",
            str(out),
            "--outtype",
            q,
            "--force",
        ],
        capture_output=True,
        text=True,
    )
    return None if r.returncode == 0 else f"convert: {r.stderr.strip()[-300:]}"


def cpu_features() -> str:
    """The CPU backend's ggml feature line (AMX_INT8, AVX512, REPACK, ...), from a CPU-only process."""
    code = (
        "from llama_cpp import llama_cpp as ll; ll.llama_backend_init(); "
        "print(ll.llama_print_system_info().decode())"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=CPU_ENV)
    return r.stdout.strip() or r.stderr.strip()[-300:]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path)
    ap.add_argument("--quants", default="f32,q8_0,q4_k_m")
    ap.add_argument("--presets", default="tiny,small", help="make_checkpoint presets (full-width: --layers)")
    ap.add_argument("--layers", type=int, default=4, help="layers of the full-width preset")
    ap.add_argument(
        "--checkpoint",
        action="append",
        default=[],
        metavar="PRESET=DIR",
        help="a generated checkpoint to take",
    )
    ap.add_argument("--threads", type=int, default=max(1, (os.cpu_count() or 2) // 3), help="per CPU verify")
    ap.add_argument("--extra-bufts", type=Path, help="extra_bufts_check.sh's JSON, kept in the result")
    ap.add_argument("--cpu-run", help=argparse.SUPPRESS)  # the CPU side of compare(), a JSON spec
    args = ap.parse_args(argv)
    if args.cpu_run:
        spec = json.loads(args.cpu_run)
        cpu_logits(Path(spec["model"]), spec["prompt"], spec["block"], Path(spec["out"]))
        return 0
    if not args.out:
        ap.error("--out is required")
    from llama_cpp import llama_cpp as ll

    from clover_local.llama import capi

    presets, quants = args.presets.split(","), args.quants.split(",")
    given = dict(c.split("=", 1) for c in args.checkpoint)
    res: dict = {"presets": presets, "quants": quants, "files": {}, "cpu_verify": {}, "gpu_verify": {}}
    if not capi.PATCHED:
        res["skipped"] = "unpatched build"
        write(args.out, res)
        return 0
    gpu = bool(ll.llama_supports_gpu_offload())
    res["gpu"], res["cpu_features"] = gpu, cpu_features()
    log(f"CPU: {res['cpu_features']}")
    cpu_v: dict = {q: {} for q in quants}
    gpu_v: dict = {q: {} for q in quants}
    if args.out.is_file():  # an earlier run cut short by its time limit: keep the files it finished
        done = json.loads(args.out.read_text())
        if done.get("presets") == presets and done.get("quants") == quants:
            res["files"] = done["files"]
            for q in quants:
                cpu_v[q] = done["cpu_verify"][q]["presets"]
                gpu_v[q] = done.get("gpu_verify", {}).get(q, {}).get("presets", {})
            log(f"resuming {args.out}: " + ", ".join(f"{p} {q}" for q in quants for p in cpu_v[q]))
    has_bufts = args.extra_bufts is not None and args.extra_bufts.is_file()
    extra_bufts = json.loads(args.extra_bufts.read_text()) if has_bufts else None
    with tempfile.TemporaryDirectory(prefix="clover-parity-") as tmp:
        for preset in presets:
            full = preset == "full-width"
            ck = Path(given[preset]) if preset in given else Path(tmp) / f"ck-{preset}"
            if preset not in given:
                layers = ["--layers", str(args.layers)] if full else []
                cmd = [
                    sys.executable,
                    "-m",
                    "clover_local.testing.make_checkpoint",
                    str(ck),
                    "--preset",
                    preset,
                ]
                subprocess.run([*cmd, *layers], check=True, capture_output=True)
            mask = int(json.loads((ck / "config.json").read_text()).get("mask_token_id", 0))
            res["files"].setdefault(preset, {})
            for q in quants:
                if preset in cpu_v[q]:
                    continue  # finished by the run resumed
                g = Path(tmp) / f"{preset}-{q}.gguf"
                error = convert(ck, g, q)
                if error:
                    res["files"][preset][q] = {"error": error}
                    cpu_v[q][preset] = gpu_v[q][preset] = {"passed": False, "error": error}
                    continue
                try:
                    res["files"][preset][q] = compare(g, mask, gpu)
                except Exception as e:
                    res["files"][preset][q] = {"error": f"{type(e).__name__}: {e}"}
                log(f"{preset} {q}: {res['files'][preset][q]}")
                # next to --out: a resumed run reuses the reference's results of the same checkpoint
                cache = args.out.with_name(f"{args.out.stem}-reference-{preset}.npz")
                v = run_verifies(g, ck, cache, gpu, args.threads)
                cpu_v[q][preset] = {"repack": v["cpu"], "no_repack": v["cpu_no_repack"]}
                if gpu:
                    gpu_v[q][preset] = v["gpu"]
                log(f"verify {preset} {q}: " + ", ".join(f"{k} {d.get('passed')}" for k, d in v.items()))
                g.unlink()
                g.with_suffix(".cpu.npz").unlink(missing_ok=True)
                # written after every file: a run cut short by its time limit keeps what it finished
                write(args.out, verdicts(res, cpu_v, gpu_v, gpu, extra_bufts))
    res["complete"] = True
    final = verdicts(res, cpu_v, gpu_v, gpu, extra_bufts)
    write(args.out, final)
    log(f"summary: {final['summary']}")
    return 0


def verdicts(res: dict, cpu_v: dict, gpu_v: dict, gpu: bool, extra_bufts: dict | None) -> dict:
    """The result so far: per file type, passed where every preset run so far passed."""
    out = {**res, "cpu_verify": {}, "gpu_verify": {}}
    for q in res["quants"]:
        out["cpu_verify"][q] = {
            "passed": all(d.get("passed") is True for runs in cpu_v[q].values() for d in _runs(runs)),
            "presets": cpu_v[q],
        }
        if gpu:
            out["gpu_verify"][q] = {
                "passed": all(d.get("passed") is True for d in gpu_v[q].values()),
                "presets": gpu_v[q],
            }
    if extra_bufts is not None:
        out["extra_bufts"] = extra_bufts
    out["summary"] = {
        "cpu_verify": {q: d["passed"] for q, d in out["cpu_verify"].items()},
        "gpu_verify": {q: d["passed"] for q, d in out["gpu_verify"].items()},
        "amx": "AMX_INT8 = 1" in res["cpu_features"],
        **{
            f"extra_bufts_{k}": len(extra_bufts[k])
            for k in ("pinned_wrong", "patched_wrong")
            if k in (extra_bufts or {})
        },
        "cpu_repack_max_abs_diff": max(
            (f.get("cpu_repack_causal_max_abs_diff", 0.0) for p in res["files"].values() for f in p.values()),
            default=None,
        ),
    }
    return out


def write(path: Path, result: dict) -> None:
    """The result JSON, replaced whole (a temporary name, then a rename)."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(result, indent=1) + "\n")
    tmp.replace(path)


def _runs(entry: dict) -> list[dict]:
    """The verify reports of one preset's CPU entry (an error entry stands for itself)."""
    return [entry["repack"], entry["no_repack"]] if "repack" in entry else [entry]


if __name__ == "__main__":
    sys.exit(main())
