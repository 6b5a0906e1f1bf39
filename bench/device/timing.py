"""Time one GGUF on llama.cpp: AR step, causal 32-row pass, prompt processing; with the patched
engine also preview (coreset on/off, forced sizes), commit, fused pass and the labelled k-accept
simulation. Writes one JSON object (`--out`), printing a line per measurement.

    python bench/device/timing.py MODEL.gguf --out t.json [--ngl 999] [--flash-attn on] [--pp 512,8192]

Every figure is the median of `--reps` timed runs after `--warmup` untimed ones, in ms, each run
ending with `llama_synchronize` (host wall clock, perf_counter). Works with any llama.cpp build:
`qwen35moe` files go through the plain C API (upstream baseline); `clover-moe` files add the engine
measurements when the installed library has the Clover C API (`clover_local.llama.capi.PATCHED`).
A piece the build lacks is recorded under `skipped` with the reason, never an error.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import math
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from llama_cpp import llama_cpp as ll  # noqa: E402

BLOCK = 32
KS = (1, 2, 4, 8, 16)
CORESET_SIZES = (8, 16, 32, 64, 128, 256)


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def stats(samples: list[float]) -> dict:
    s = sorted(samples)
    q = lambda f: s[min(len(s) - 1, int(round(f * (len(s) - 1))))]  # noqa: E731
    return {"median": statistics.median(s), "p10": q(0.1), "p90": q(0.9), "min": s[0], "n": len(s)}


def timed(fn, reps: int, warmup: int, ctx=None, before=None) -> dict:
    """ms per call of fn(); `before()` runs untimed before each call."""
    out = []
    for i in range(warmup + reps):
        if before:
            before()
        t0 = time.perf_counter()
        fn()
        if ctx is not None:
            ll.llama_synchronize(ctx)
        dt = (time.perf_counter() - t0) * 1e3
        if i >= warmup:
            out.append(dt)
    return stats(out)


class Raw:
    """A model and a context through the plain C API (any architecture upstream knows)."""

    def __init__(
        self,
        path: str,
        ngl: int,
        flash_attn: bool,
        n_ctx: int,
        n_batch: int,
        n_ubatch: int,
        threads: int | None,
    ):
        # llama.cpp's own stderr log, no Python log callback: with a CUDA build on the H200 image a
        # Python callback segfaults inside model loading (see docs/performance.md, H200)
        ll.llama_log_set(ll.llama_log_callback(), ctypes.c_void_p(0))
        ll.llama_backend_init()
        mp = ll.llama_model_default_params()
        mp.n_gpu_layers = ngl
        t0 = time.perf_counter()
        self.model = ll.llama_model_load_from_file(path.encode(), mp)
        if not self.model:
            raise SystemExit(f"error: could not load {path}")
        self.load_s = time.perf_counter() - t0
        cp = ll.llama_context_default_params()
        cp.n_ctx, cp.n_batch, cp.n_ubatch, cp.n_seq_max = n_ctx, n_batch, n_ubatch, 1
        if threads:
            cp.n_threads = cp.n_threads_batch = threads
        cp.flash_attn_type = (
            ll.LLAMA_FLASH_ATTN_TYPE_ENABLED if flash_attn else ll.LLAMA_FLASH_ATTN_TYPE_DISABLED
        )
        self.ctx = ll.llama_init_from_model(self.model, cp)
        if not self.ctx:
            raise SystemExit("error: could not create a context")
        self.n_batch = n_batch
        self.vocab = ll.llama_vocab_n_tokens(ll.llama_model_get_vocab(self.model))
        self.batch = ll.llama_batch_init(n_batch, 0, 1)
        self.pos = 0

    def meta(self, key: str) -> str | None:
        buf = ctypes.create_string_buffer(512)
        n = ll.llama_model_meta_val_str(self.model, key.encode(), buf, len(buf))
        return buf.value.decode() if n >= 0 else None

    def clear(self) -> None:
        ll.llama_memory_clear(ll.llama_get_memory(self.ctx), True)
        self.pos = 0

    def decode(self, tokens, logits: str = "last") -> None:
        """Append tokens (in n_batch chunks); logits: 'last', 'all' or 'none'."""
        b = self.batch
        n = len(tokens)
        for start in range(0, n, self.n_batch):
            chunk = tokens[start : start + self.n_batch]
            for i, t in enumerate(chunk):
                b.token[i] = int(t)
                b.pos[i] = self.pos + i
                b.n_seq_id[i] = 1
                b.seq_id[i][0] = 0
                b.logits[i] = logits == "all" or (logits == "last" and start + i == n - 1)
            b.n_tokens = len(chunk)
            rc = ll.llama_decode(self.ctx, b)
            if rc != 0:
                raise RuntimeError(f"llama_decode returned {rc}")
            self.pos += len(chunk)
        if logits != "none":
            ll.llama_get_logits(self.ctx)  # the host copy of the outputs, as a caller reads them

    def close(self) -> None:
        ll.llama_batch_free(self.batch)
        ll.llama_free(self.ctx)
        ll.llama_model_free(self.model)


def model_summary(r: Raw, path: str) -> dict:
    """Architecture, layers, file type and size, from llama.cpp's own view of the loaded file."""
    buf = ctypes.create_string_buffer(256)
    ll.llama_model_desc(r.model, buf, len(buf))
    arch = r.meta("general.architecture")
    info: dict = {
        "file": os.path.basename(path),
        "file_bytes": os.path.getsize(path),
        "arch": arch,
        "desc": buf.value.decode(errors="replace"),
        "model_bytes": ll.llama_model_size(r.model),
        "n_params": ll.llama_model_n_params(r.model),
        "file_type": r.meta("general.file_type"),
    }
    for key, name in (("block_count", "layers"), ("expert_count", "experts"), ("expert_used_count", "top_k")):
        v = r.meta(f"{arch}.{key}")
        info[name] = int(v) if v is not None and v.lstrip("-").isdigit() else v
    return info


def run_raw(r: Raw, args, rng, res: dict) -> None:
    V = r.vocab
    toks = lambda n: rng.integers(0, min(V, 248000), size=n)  # noqa: E731

    # prompt processing (fresh sequence each run)
    pp = {}
    for n in args.pp:
        prompt = toks(n)
        reps = args.reps_pp if n <= 1024 else max(1, args.reps_pp // 2)
        st = timed(lambda p=prompt: r.decode(p, "last"), reps, 1, r.ctx, before=r.clear)
        pp[str(n)] = {"ms": st["median"], "tok_s": n / st["median"] * 1e3, "runs": st}
        log(f"pp{n}: {st['median']:.2f} ms ({n / st['median'] * 1e3:.0f} tok/s)")
    res["pp_ms"] = {k: v["ms"] for k, v in pp.items()}
    res["pp_tok_s"] = {k: v["tok_s"] for k, v in pp.items()}
    res["pp_detail"] = pp

    # decode from a 512-token prefix: AR step, then causal 32-row passes (the context grows a little)
    r.clear()
    r.decode(toks(args.prefix), "last")
    st = timed(lambda: r.decode(toks(1), "last"), args.reps, args.warmup, r.ctx)
    res["ar_step_ms"] = st["median"]
    res["ar_step"] = st
    res["ar_tok_s"] = 1e3 / st["median"]
    log(
        f"AR step: {st['median']:.3f} ms (p10 {st['p10']:.3f}, p90 {st['p90']:.3f}) "
        f"-> {res['ar_tok_s']:.1f} tok/s"
    )
    st = timed(lambda: r.decode(toks(BLOCK), "last"), args.reps, args.warmup, r.ctx)
    res["causal32_ms"] = st["median"]
    res["causal32"] = st
    log(
        f"causal 32-row pass (last-row logits): {st['median']:.3f} ms "
        f"= {st['median'] / res['ar_step_ms']:.2f} AR steps"
    )
    st = timed(lambda: r.decode(toks(BLOCK), "all"), max(3, args.reps // 2), 2, r.ctx)
    res["causal32_all_logits_ms"] = st["median"]
    res["causal32_all_logits"] = st
    log(f"causal 32-row pass (all 32 rows' logits read back): {st['median']:.3f} ms")
    res["readback_bytes_per_pass"] = {
        "ar_step_logits": 4 * V,
        "causal32_last_row_logits": 4 * V,
        "causal32_all_logits": 4 * V * BLOCK,
    }
    res["context_after_decode_tests"] = r.pos


def run_engine(path: str, args, rng, res: dict) -> None:
    """The patched engine's passes on a clover-moe file (guarded piece by piece)."""
    skipped = res.setdefault("skipped", {})
    try:
        from clover_local.llama import capi
        from clover_local.llama.engine import LlamaEngine
        from clover_local.policy import LogitAdjustment
    except Exception as e:
        skipped["engine"] = f"clover_local.llama.engine does not import: {e}"
        return
    if not capi.PATCHED:
        skipped["engine"] = "the installed llama_cpp has no Clover C API (unpatched build)"
        return
    eng = LlamaEngine(
        path,
        n_ctx=args.n_ctx,
        n_gpu_layers=args.ngl,
        flash_attn=args.flash_attn,
        n_ubatch=args.n_ubatch,
        log=True,  # no Python log callback (it crashes model loading on the H200 image)
    )
    try:
        V = eng.vocab_size
        adj = LogitAdjustment.identity(V)
        toks = lambda n: [int(t) for t in rng.integers(0, min(V, 248000), size=n)]  # noqa: E731
        mask = int(eng._meta("tokenizer.ggml.mask_token_id", "-1"))
        eng.prefill(toks(args.prefix), adj)
        sync = lambda: ll.llama_synchronize(eng.ctx)  # noqa: E731

        st = timed(lambda: eng.commit(toks(1), adj), args.reps, args.warmup)
        res["engine_ar_step_ms"] = st["median"]
        res["engine_ar_step"] = st
        log(f"engine AR step (clover head): {st['median']:.3f} ms")
        st = timed(lambda: eng.commit(toks(BLOCK), adj), args.reps, args.warmup)
        res["commit_ms_per_block"] = st["median"]
        res["commit"] = st
        log(f"engine commit (32 rows, clover head): {st['median']:.3f} ms")
        sync()

        if not eng.has_diffusion:
            skipped["preview"] = "the GGUF has no diffusion tensors (--ar-only)"
            return
        block = lambda: [mask if (mask >= 0 and i % 2) else t for i, t in enumerate(toks(BLOCK))]  # noqa: E731
        before = eng.state_bytes()
        by = {}
        for on in (False, True):
            eng.coreset = on
            st = timed(lambda: eng.preview(block(), adj), args.reps, args.warmup)
            by["on" if on else "off"] = st
            mode = f"on, top_p {eng.coreset_top_p:.2f}" if on else "off"
            log(f"preview (coreset {mode}): {st['median']:.3f} ms")
        res["preview_ms"] = by["off"]["median"]
        res["preview_coreset_ms"] = by["on"]["median"]
        res["preview"] = by
        res["preview_state_unchanged"] = eng.state_bytes() == before
        res["readback_bytes_per_pass"] = {"preview_rows": BLOCK * 8, "commit_rows": 8, "ar_step_rows": 8}

        # forced coreset sizes: only if the C API offers it
        force = getattr(capi, "llama_clover_set_coreset_size", None)
        if force is None:
            skipped["preview_ms_by_coreset"] = "no llama_clover_set_coreset_size in the C API"
        else:
            eng.coreset = True
            sizes = {}
            for n in CORESET_SIZES:
                force(eng.ctx, n)
                sizes[str(n)] = timed(lambda: eng.preview(block(), adj), args.reps, args.warmup)["median"]
                log(f"preview, coreset forced to {n}: {sizes[str(n)]:.3f} ms")
            force(eng.ctx, 0)
            res["preview_ms_by_coreset"] = sizes
        eng.coreset = False

        fused = getattr(capi, "llama_clover_commit_preview", None) or getattr(
            capi, "llama_clover_fused", None
        )
        if fused is None or not hasattr(eng, "commit_preview"):
            skipped["fused_pass_ms"] = "no fused commit+preview entry point in the engine / C API"
        else:
            st = timed(lambda: eng.commit_preview(toks(BLOCK), block(), adj), args.reps, args.warmup)
            res["fused_pass_ms"] = st["median"]
            res["fused_pass"] = st
            log(f"fused commit+preview: {st['median']:.3f} ms")

        # labelled simulation: exactly k tokens accepted per preview -> ceil(32/k) previews + 1 commit
        # per block (or fused: the commit rides on the next block's first preview)
        e2e, e2e_fused = {}, {}
        nblocks = max(3, args.reps // 4)
        for k in KS:
            npv = math.ceil(BLOCK / k)

            def one_block(npv: int = npv) -> None:
                for _ in range(npv):
                    eng.preview(block(), adj)
                eng.commit(toks(BLOCK), adj)

            st = timed(one_block, nblocks, 1)
            e2e[str(k)] = BLOCK / st["median"] * 1e3
            log(
                f"e2e simulation k={k}: {npv} previews + 1 commit per block = {st['median']:.2f} ms "
                f"-> {e2e[str(k)]:.1f} tok/s"
            )
            if "fused_pass_ms" in res:
                e2e_fused[str(k)] = BLOCK / ((npv - 1) * res["preview_ms"] + res["fused_pass_ms"]) * 1e3
        res["e2e_tok_s_by_k"] = e2e
        res["e2e_simulation"] = (
            "labelled simulation: exactly k tokens resolved per preview, coreset off, random weights"
        )
        if e2e_fused:
            res["e2e_fused_tok_s_by_k_derived"] = e2e_fused
        # self-speculative (derived from medians): preview proposes, a causal 32-row pass verifies,
        # a accepted tokens + 1 from the verifier per cycle
        res["spec_tok_s_by_accept"] = {
            str(a): (a + 1) / (res["preview_ms"] + res["commit_ms_per_block"]) * 1e3
            for a in (0, 1, 2, 4, 8, 16, 31)
        }
    finally:
        eng.close()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model")
    ap.add_argument("--out", type=Path)
    ap.add_argument("--ngl", type=int, default=999, help="layers on the GPU (999: all)")
    ap.add_argument("--flash-attn", choices=["on", "off"], default="on")
    ap.add_argument("--pp", default="512,8192", help="prompt lengths for prompt processing ('' for none)")
    ap.add_argument("--prefix", type=int, default=512, help="cached prefix before the decode timings")
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--reps-pp", type=int, default=4)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--n-batch", type=int, default=2048)
    ap.add_argument("--n-ubatch", type=int, default=512)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--no-engine", action="store_true", help="plain C API timings only")
    ap.add_argument("--label", default="")
    ap.add_argument(
        "--check", action="store_true", help="load, decode 8 tokens, print ok, exit (a smoke test)"
    )
    args = ap.parse_args(argv)
    args.pp = [int(x) for x in args.pp.split(",") if x.strip()]
    args.flash_attn = args.flash_attn == "on"
    args.n_ctx = max(args.pp + [0]) + args.prefix + 4096

    import llama_cpp

    res: dict = {
        "label": args.label,
        "settings": {
            "n_gpu_layers": args.ngl,
            "flash_attn": args.flash_attn,
            "n_ctx": args.n_ctx,
            "n_batch": args.n_batch,
            "n_ubatch": args.n_ubatch,
            "reps": args.reps,
            "warmup": args.warmup,
            "prefix": args.prefix,
            "cuda_graphs_disabled_env": os.environ.get("GGML_CUDA_DISABLE_GRAPHS"),
        },
        "llama_cpp_version": llama_cpp.__version__,
        "system_info": ll.llama_print_system_info().decode(errors="replace"),
        "host": platform.node(),
        "started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "skipped": {},
    }
    rng = np.random.default_rng(1234)
    if args.check:
        r = Raw(args.model, args.ngl, args.flash_attn, 1024, 512, 512, None)
        r.decode(rng.integers(0, 1000, size=8), "last")
        ll.llama_synchronize(r.ctx)
        r.close()
        print(f"load check ok: {args.model} ({r.load_s:.1f} s to load)", flush=True)
        return 0
    r = Raw(
        args.model, args.ngl, args.flash_attn, args.n_ctx, args.n_batch, args.n_ubatch, args.threads or None
    )
    res["load_s"] = r.load_s
    res["model"] = model_summary(r, args.model)
    log(
        f"{args.model}: {res['model']['arch']} {res['model']['layers']} layers, {res['model']['desc']}, "
        f"{res['model']['file_bytes'] / 1e9:.2f} GB, loaded in {r.load_s:.1f} s"
    )
    try:
        run_raw(r, args, rng, res)
    finally:
        r.close()
    if args.no_engine:
        res["skipped"]["engine"] = "--no-engine"
    elif res["model"].get("arch") == "clover-moe":
        try:
            run_engine(args.model, args, rng, res)
        except Exception as e:  # record and go on: the plain timings above stand
            res["skipped"]["engine_error"] = f"{type(e).__name__}: {e}"
            log(f"engine timings failed: {e}")
    else:
        res["skipped"]["engine"] = f"arch {res['model'].get('arch')} (engine timings need clover-moe)"
    res["finished_utc"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    text = json.dumps(res, indent=1)
    if args.out:
        args.out.write_text(text + "\n")
    else:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
