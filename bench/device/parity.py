"""GPU parity on tiny models: the patched engine with all layers on the GPU against the same engine
on the CPU, and `clover verify` (GGUF vs the numpy reference) with all layers offloaded.

    python bench/device/parity.py --out parity.json [--quants f32,q8_0,q4_k_m]

Per file type: max abs diff of causal logits (a 48-token prompt) and of preview logits (one
block, half masks) GPU vs CPU, greedy-token agreement, and whether a preview on the GPU leaves
the sequence's memory state byte-identical. Needs the patched build (skips otherwise).
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


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def cpu_logits(path: Path, prompt: list[int], block: list[int], out: Path) -> None:
    """Causal and preview logits on the CPU alone (run with no CUDA device visible: in-process, a
    CUDA build offloads the matmuls of batches >= 32 rows to the GPU even with no layer on it)."""
    from clover_local.llama.engine import LlamaEngine

    with LlamaEngine(path, n_ctx=512, n_gpu_layers=0, f32_cache=True, flash_attn=False, log=True) as cpu:
        c = cpu.causal_logits(prompt)
        p = cpu.preview_logits(block) if cpu.has_diffusion else np.zeros((0,))
    np.savez(out, causal=c, preview=p)


def compare(path: Path, mask: int) -> dict:
    from clover_local.llama.engine import LlamaEngine

    rng = np.random.default_rng(7)
    out: dict = {}
    with LlamaEngine(path, n_ctx=512, n_gpu_layers=999, f32_cache=True, flash_attn=False, log=True) as gpu:
        V = gpu.vocab_size
        prompt = [int(t) for t in rng.integers(0, min(V, 151000), size=48)]
        block = [mask if i % 2 else int(t) for i, t in enumerate(rng.integers(0, min(V, 151000), size=32))]
        c_gpu = gpu.causal_logits(prompt)
        before = gpu.state_bytes()
        p_gpu = gpu.preview_logits(block) if gpu.has_diffusion else None
        if p_gpu is not None:
            for _ in range(3):
                gpu.preview_logits(block)
        out["preview_state_unchanged_gpu"] = gpu.state_bytes() == before
    npz = path.with_suffix(".cpu.npz")
    spec = json.dumps({"model": str(path), "prompt": prompt, "block": block, "out": str(npz)})
    subprocess.run(
        [sys.executable, __file__, "--cpu-run", spec],
        check=True,
        capture_output=True,
        env={**os.environ, "CUDA_VISIBLE_DEVICES": ""},
    )
    cpu = np.load(npz)
    c_cpu, p_cpu = cpu["causal"], cpu["preview"] if p_gpu is not None else None
    out["causal_max_abs_diff"] = float(np.abs(c_cpu - c_gpu).max())
    out["causal_token_agreement"] = float((c_cpu.argmax(-1) == c_gpu.argmax(-1)).mean())
    if p_cpu is not None:
        out["preview_max_abs_diff"] = float(np.abs(p_cpu - p_gpu).max())
        out["preview_token_agreement"] = float((p_cpu.argmax(-1) == p_gpu.argmax(-1)).mean())
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path)
    ap.add_argument("--quants", default="f32,q8_0,q4_k_m")
    ap.add_argument("--preset", default="tiny-qwen-vocab")
    ap.add_argument("--cpu-run", help=argparse.SUPPRESS)  # the CPU side of compare(), a JSON spec
    args = ap.parse_args(argv)
    if args.cpu_run:
        spec = json.loads(args.cpu_run)
        cpu_logits(Path(spec["model"]), spec["prompt"], spec["block"], Path(spec["out"]))
        return 0
    if not args.out:
        ap.error("--out is required")
    res: dict = {"preset": args.preset, "files": {}, "verify": {}}
    from clover_local.llama import capi

    if not capi.PATCHED:
        res["skipped"] = "unpatched build"
        args.out.write_text(json.dumps(res, indent=1) + "\n")
        return 0
    with tempfile.TemporaryDirectory(prefix="clover-parity-") as tmp:
        ck = Path(tmp) / "ck"
        subprocess.run(
            [sys.executable, "-m", "clover_local.testing.make_checkpoint", str(ck), "--preset", args.preset],
            check=True,
            capture_output=True,
        )
        cfg = json.loads((ck / "config.json").read_text())
        mask = int(cfg.get("mask_token_id", 0))
        for q in args.quants.split(","):
            g = Path(tmp) / f"tiny-{q}.gguf"
            r = subprocess.run(
                [
                    sys.executable,
                    "-c",
                    "import sys; from clover_convert.cli import main; sys.exit(main())",
                    str(ck),
                    "-o",
                    str(g),
                    "-t",
                    q,
                    "--force",
                ],
                capture_output=True,
                text=True,
            )
            if r.returncode != 0:
                res["files"][q] = {"error": f"convert: {r.stderr.strip()[-300:]}"}
                continue
            try:
                res["files"][q] = compare(g, mask)
            except Exception as e:
                res["files"][q] = {"error": f"{type(e).__name__}: {e}"}
            log(f"{q}: {res['files'][q]}")
            # `clover verify` against the numpy reference, all layers on the GPU
            cmd = [
                sys.executable,
                "-c",
                "import sys; from clover_local.cli import app; sys.argv[0]='clover'; app()",
                "verify",
                str(g),
                "--reference",
                str(ck),
                "--n-gpu-layers",
                "-1",
                "--json",
            ]
            v = subprocess.run(cmd, capture_output=True, text=True)
            try:
                res["verify"][q] = json.loads(v.stdout)
            except json.JSONDecodeError:
                res["verify"][q] = {"rc": v.returncode, "stdout": v.stdout[-1500:], "stderr": v.stderr[-800:]}
            log(f"verify {q}: rc {v.returncode}")
    res["summary"] = {q: {k: v for k, v in d.items() if k != "error"} or d for q, d in res["files"].items()}
    args.out.write_text(json.dumps(res, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
