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
import contextlib
import ctypes
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import replace
from functools import partial
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from llama_cpp import llama_cpp as ll  # noqa: E402

BLOCK = 32
KS = (1, 2, 4, 8, 16)
ACCEPTS = (0, 1, 2, 4, 8)
CORESET_SIZES = (8, 16, 32, 64, 128, 256)


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


@contextlib.contextmanager
def captured_stderr():
    """Capture fd 2 (llama.cpp's C log) into the yielded list's one string, and pass it on."""
    out: list[str] = []
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as f:
        os.dup2(f.fileno(), 2)
        try:
            yield out
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            f.seek(0)
            text = f.read().decode("utf-8", "replace")
            sys.stderr.write(text)
            out.append(text)


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
        placement=None,
    ):
        from clover_local.llama.placement import Params
        from clover_local.placement import Placement

        # llama.cpp's own stderr log, in the run's stderr file (no Python log callback)
        ll.llama_log_set(ll.llama_log_callback(), ctypes.c_void_p(0))
        ll.llama_backend_init()
        placement = replace(placement or Placement(), flash_attn="on" if flash_attn else "off")
        params = Params(placement, ngl, n_ctx, n_ubatch, n_rs_seq=0, n_threads=threads)
        t0 = time.perf_counter()
        self.model = ll.llama_model_load_from_file(path.encode(), params.model)
        if not self.model:
            raise SystemExit(f"error: could not load {path}")
        self.load_s = time.perf_counter() - t0
        cp = params.context
        cp.n_batch = n_batch
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
    res["ar_step_ms"] = res["raw_ar_step_ms"] = st["median"]
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


def byte_floor(path: str) -> dict:
    """Bytes a pass must read from the file's tensors: every weight once except the embedding
    (rows only) and the routed experts, of which a pass reads the experts it uses."""
    from gguf import GGUFReader

    reader = GGUFReader(path)
    arch = bytes(reader.fields["general.architecture"].parts[-1]).decode()
    n_expert = int(reader.fields[f"{arch}.expert_count"].parts[-1][0])
    n_layer = int(reader.fields[f"{arch}.block_count"].parts[-1][0])
    dense = experts = 0
    for t in reader.tensors:
        if t.name.endswith("_exps.weight"):
            experts += int(t.n_bytes)
        elif t.name != "token_embd.weight":
            dense += int(t.n_bytes)
    return {"dense_bytes": dense, "expert_bytes": experts / n_expert / n_layer, "layers": n_layer}


def device_bandwidth() -> tuple[float, str]:
    """Device copy bandwidth (bytes read + written per second), measured with torch when present."""
    try:
        import torch

        if not torch.cuda.is_available():
            raise RuntimeError("no CUDA device for torch")
        a = torch.empty(2 << 30, dtype=torch.uint8, device="cuda")
        b = torch.empty_like(a)
        b.copy_(a)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(10):
            b.copy_(a)
        torch.cuda.synchronize()
        bw = 2 * a.numel() * 10 / (time.perf_counter() - t0)
        del a, b
        torch.cuda.empty_cache()
        return bw, "measured: torch device-to-device copy of 2 GiB, read + written bytes"
    except Exception as e:  # no torch or no GPU: the figure for the H200
        return 4.27e12, f"assumed 4.27 TB/s (H200 copy bandwidth from the issue): {e}"


def engine_passes(eng, args, rng, adj, mask: int, chunk: int) -> dict:
    """One set of pass timings with the routed experts dispatched in chunks of `chunk` rows."""
    from clover_local.backend import Routing, RowAdjustments

    V = eng.vocab_size
    toks = lambda n: [int(t) for t in rng.integers(0, min(V, 248000), size=n)]  # noqa: E731
    block = lambda: [mask if (mask >= 0 and i % 2) else t for i, t in enumerate(toks(BLOCK))]  # noqa: E731
    out: dict = {}
    st = timed(lambda: eng.commit(toks(1), adj), args.reps, args.warmup)
    out["ar_step_ms"], out["ar_step"] = st["median"], st
    log(f"  engine AR step (clover head): {st['median']:.3f} ms")
    st = timed(lambda: eng.commit(toks(BLOCK), adj), args.reps, args.warmup)
    out["commit_ms_per_block"], out["commit"] = st["median"], st
    log(f"  engine commit (32 rows, clover head): {st['median']:.3f} ms")
    if not eng.has_diffusion:
        return out

    eng.bench_tuning(coreset_size=0, moe_chunk=chunk)
    top_p = eng.default_routing.top_p
    for routing in (Routing(False, top_p), Routing(True, top_p)):
        on = routing.coreset
        st = timed(lambda r=routing: eng.preview(block(), adj, r), args.reps, args.warmup)
        out["preview_coreset_ms" if on else "preview_ms"] = st["median"]
        out["preview_coreset" if on else "preview"] = st
        mode = f"on, top_p {top_p:.2f}" if on else "off"
        log(f"  preview (coreset {mode}): {st['median']:.3f} ms")

    sizes = {}
    for n in args.coreset_sizes:
        eng.bench_tuning(coreset_size=n, moe_chunk=chunk)
        sizes[str(n)] = timed(
            lambda: eng.preview(block(), adj, Routing(True, top_p)), args.reps, args.warmup
        )["median"]
        log(f"  preview, coreset forced to {n} experts: {sizes[str(n)]:.3f} ms")
    eng.bench_tuning(coreset_size=0, moe_chunk=chunk)
    out["preview_ms_by_coreset"] = sizes

    # speculative verifications (causal rows with snapshots + a preview over them), rolled back after
    # each run, without the coreset, as these runs have always measured them (it was left off on the engine)
    p0, no_coreset = eng.n_past, Routing(False, top_p)

    def undo() -> None:
        if eng.n_past > p0:
            eng.rollback(p0)

    def verification(key: str, causal: int, preview: Callable[[], list[int]], what: str) -> None:
        rows = RowAdjustments.constant(adj, causal)
        st = timed(
            lambda: eng.verify_and_draft(toks(causal), rows, preview(), routing=no_coreset),
            args.reps,
            args.warmup,
            before=undo,
        )
        undo()
        out[f"{key}_ms"], out[key] = st["median"], st
        log(f"  {what}: {st['median']:.3f} ms")

    verification("fused_pass", BLOCK, block, "fused pass (32 causal rows + 32-row preview)")
    # the speculative loop's common verification (110 of the 132 passes of its a = 1 simulation),
    # whose cost sets what that loop can reach against the AR step
    verification("verify_2_2", 2, lambda: [mask, mask], "verification of 2 causal rows + 2-row preview")

    # the diffusion loop's own fused pass (commit_and_preview: final rows, so no snapshots, and only the
    # last causal row through the head), which fused_pass_ms (the speculative verification) overstates;
    # it cannot be rolled back, so each run commits its rows after the last one's, as the commit above
    need = (args.reps + args.warmup + 1) * BLOCK  # the runs' committed rows, then one preview's
    if eng.n_past + need > args.n_ctx:
        log(f"  fused commit + preview: skipped ({eng.n_past} + {need} tokens exceed n_ctx {args.n_ctx})")
        return out
    st = timed(
        lambda: eng.commit_and_preview(toks(BLOCK), adj, block(), routing=no_coreset),
        args.reps,
        args.warmup,
    )
    out["fused_commit_preview_ms"], out["fused_commit_preview"] = st["median"], st
    log(f"  fused commit + preview (the diffusion loop's pass, no snapshots): {st['median']:.3f} ms")
    return out


def interleaved(fns: dict, rounds: int, per_round: int, warmup: int) -> dict:
    """ms per call of each fn, measured in `rounds` alternating rounds of `per_round` calls (after
    `warmup` untimed calls of each), so that clock and thermal drift hit every fn alike."""
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    samples: dict = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            for _ in range(per_round):
                t0 = time.perf_counter()
                fn()
                samples[name].append((time.perf_counter() - t0) * 1e3)
    return {name: stats(v) for name, v in samples.items()}


def median_runs(fns: dict, reps: int) -> dict:
    """Each loop run (a function returning a dict with `tokens_per_s`) `reps` times, round-robin
    over the settings so that drift hits them alike; per setting the run of median tok/s, with
    every run's tok/s beside it (one run of a = 0 is a few hundred milliseconds, at the mercy of a
    busy moment on the host)."""
    done: dict = {name: [] for name in fns}
    for _ in range(reps):
        for name, fn in fns.items():
            done[name].append(fn())
    out = {}
    for name, rs in done.items():
        rs = sorted(rs, key=lambda r: r["tokens_per_s"])
        out[name] = {**rs[len(rs) // 2], "tokens_per_s_reps": [r["tokens_per_s"] for r in done[name]]}
    return out


def run_ar_mode(path: str, args, rng, res: dict) -> None:
    """The `ar` mode as a user runs it (`LlamaEngine` without speculative snapshots): its AR step
    with no adjustment and with the loop's (the mask token's -inf and the stop tokens), interleaved
    with upstream's plain step on `--baseline` (its qwen35moe twin) in the same process; then the
    `ar` loop's tok/s and its host split."""
    from bench.loop_host import host_split
    from clover_local import loops
    from clover_local.backend import LogitAdjustment
    from clover_local.llama.engine import LlamaEngine
    from clover_local.policy import DecodingSettings, RunningAdjustment

    placement = replace(args.placement, flash_attn="on" if args.flash_attn else "off")
    eng = LlamaEngine(
        path, n_ctx=args.n_ctx, n_gpu_layers=args.ngl, n_ubatch=args.n_ubatch,
        n_threads=args.threads or None, log=True, placement=placement,
    )  # fmt: skip
    base = None
    plain = ll.llama_batch_init(1, 0, 1)
    try:
        V = eng.vocab_size
        toks = lambda n: [int(t) for t in rng.integers(0, min(V, 248000), size=n)]  # noqa: E731
        mask = eng.mask_token_id
        prompt = toks(args.prefix)
        identity = LogitAdjustment.identity(V)
        s = DecodingSettings(
            mask_token_id=mask,
            block_size=BLOCK,
            max_new_tokens=args.sim_tokens,
            context_limit=args.n_ctx,
            stop_token_ids=(0,),
            coreset_enabled=False,
            coreset_top_p=eng.default_routing.top_p,
        )
        loop_adj = RunningAdjustment(s, V, prompt).adjustment()
        eng.prefill(prompt, identity)

        def plain_step() -> None:
            """Upstream's step on the engine's own context and file: llama_decode, logits read
            back, no clover head (what the head and the pass API cost, apart from the file)."""
            plain.token[0], plain.pos[0], plain.n_seq_id[0], plain.logits[0] = toks(1)[0], eng.n_past, 1, 1
            plain.seq_id[0][0], plain.n_tokens = 0, 1
            if ll.llama_decode(eng.ctx, plain) != 0:
                raise RuntimeError("llama_decode failed on the engine's context")
            ll.llama_get_logits(eng.ctx)

        fns = {
            "engine_ar_step_ms": lambda: eng.commit(toks(1), identity),
            "engine_ar_step_loop_adjustment_ms": lambda: eng.commit(toks(1), loop_adj),
            "engine_plain_decode_step_ms": plain_step,
        }
        if args.baseline:
            base = Raw(args.baseline, args.ngl, args.flash_attn, args.n_ctx, args.n_batch, args.n_ubatch,
                       args.threads or None, args.placement)  # fmt: skip
            base.decode(toks(args.prefix), "last")
            fns["upstream_ar_step_ms"] = lambda: base.decode(toks(1), "last")
        st = interleaved(fns, rounds=max(3, args.reps // 10), per_round=10, warmup=args.warmup)
        out: dict = {"rounds": st}
        out.update({name: v["median"] for name, v in st.items()})
        if "upstream_ar_step_ms" in out:
            up = out["upstream_ar_step_ms"]
            out["engine_ar_step_ratio"] = out["engine_ar_step_ms"] / up
            out["engine_ar_step_loop_adjustment_ratio"] = out["engine_ar_step_loop_adjustment_ms"] / up
        out["engine_ar_step_vs_plain_decode"] = out["engine_ar_step_ms"] / out["engine_plain_decode_step_ms"]
        for name, v in out.items():
            if name.endswith(("_ms", "_ratio", "_vs_plain_decode")):
                log(f"ar mode (interleaved): {name} {v:.3f}")

        def ar_run() -> dict:
            eng.reset()
            return {"tokens_per_s": loops.last_result(loops.ar_loop(eng, prompt, s)).tokens_per_second}

        ar_runs = median_runs({"ar": ar_run}, args.sim_reps)["ar"]
        out["ar_loop_tok_s"], out["ar_loop_tok_s_reps"] = (
            ar_runs["tokens_per_s"],
            ar_runs["tokens_per_s_reps"],
        )
        if base is not None:  # upstream's step again, right after the loop
            after = timed(lambda: base.decode(toks(1), "last"), args.reps, args.warmup, base.ctx)["median"]
            out["upstream_ar_step_after_loop_ms"] = after
            out["ar_loop_ratio"] = out["ar_loop_tok_s"] * (up + after) / 2 / 1e3
        eng.reset()
        out["host_split"] = host_split(eng, prompt, s)
        log(
            f"ar mode: loop {out['ar_loop_tok_s']:.1f} tok/s (median of {out['ar_loop_tok_s_reps']}); "
            f"host split {out['host_split']}"
        )
        res["ar_mode"] = out
        res["engine_ar_step_ms"] = out["engine_ar_step_ms"]
        res["ar_loop_tok_s"] = out["ar_loop_tok_s"]
    finally:
        ll.llama_batch_free(plain)
        eng.close()
        if base is not None:
            base.close()


def run_engine(path: str, args, rng, res: dict) -> None:
    """The patched engine's passes on a clover-moe file: every pass at each expert-dispatch
    setting, then the labelled simulations through the real loops at the faster setting."""
    skipped = res.setdefault("skipped", {})
    try:
        from clover_local import simulation
        from clover_local.backend import LogitAdjustment, RowAdjustments
        from clover_local.llama import capi
        from clover_local.llama.engine import LlamaEngine
        from clover_local.policy import DecodingSettings
    except Exception as e:
        skipped["engine"] = f"clover_local.llama.engine does not import: {e}"
        return
    if not capi.PATCHED:
        skipped["engine"] = "the installed llama_cpp has no Clover C API (unpatched build)"
        return
    # the memory estimate before loading, then what llama.cpp reports allocating (its log)
    from clover_local import memory

    placement = replace(args.placement, flash_attn="on" if args.flash_attn else "off")
    try:
        est = memory.plan(path, placement, args.ngl, args.n_ctx, speculative=True, n_ubatch=args.n_ubatch)
        log(est.line())
    except Exception as e:  # the timings go on without the check
        est = None
        skipped["memory_check"] = f"{type(e).__name__}: {e}"
    with captured_stderr() as load_log:
        eng = LlamaEngine(
            path,
            n_ctx=args.n_ctx,
            n_gpu_layers=args.ngl,
            n_ubatch=args.n_ubatch,
            n_threads=args.threads or None,
            log=True,  # llama.cpp's log on stderr
            speculative=True,
            placement=placement,
        )
    if est is not None:
        gpus = [d.name for d in est.devices if d.name != memory.CPU]
        res["memory_check"] = {"estimate": est.to_dict(), "allocated": memory.allocated(load_log[0], gpus)}
    try:
        V = eng.vocab_size
        adj = LogitAdjustment.identity(V)
        mask = eng.mask_token_id
        prompt = [int(t) for t in rng.integers(0, min(V, 248000), size=args.prefix)]
        eng.prefill(prompt, adj)

        # this context's one-row step as a commit (final rows) and as a one-row verification (rollback
        # snapshots written), alternating: what the snapshots cost a step (patch 0011)
        one_row = RowAdjustments.constant(adj, 1)
        token = lambda: [int(rng.integers(0, min(V, 248000)))]  # noqa: E731
        st = interleaved(
            {
                "commit_ms": lambda: eng.commit(token(), adj),
                "verification_ms": lambda: eng.verify_and_draft(token(), one_row, []),
            },
            rounds=max(3, args.reps // 10),
            per_round=10,
            warmup=args.warmup,
        )
        res["one_row_step_speculative"] = {name: v["median"] for name, v in st.items()}
        log(f"speculative context, one-row step (interleaved): {res['one_row_step_speculative']}")

        by_chunk = {}
        for chunk in args.moe_chunks:
            eng.bench_tuning(moe_chunk=chunk)
            log(f"engine passes, routed experts dispatched in chunks of {chunk or 'all'} rows")
            by_chunk[str(chunk)] = engine_passes(eng, args, rng, adj, mask, chunk)
        res["by_moe_chunk"] = by_chunk
        # headline: the engine's default dispatch, one (the other settings stay in by_moe_chunk)
        best = "0" if "0" in by_chunk else next(iter(by_chunk))
        res["moe_chunk"] = int(best)
        res.update(by_chunk[best])
        # the headline AR step stays the plain C API's (run_raw); the engine's of this context (with the
        # speculative mode's recurrent-state snapshots) beside it, the ar mode's own in run_ar_mode
        res["engine_ar_step_speculative_ms"], res["ar_step_ms"] = res["ar_step_ms"], res["raw_ar_step_ms"]
        res["readback_bytes_per_pass"].update(
            {"preview_rows": BLOCK * 8, "commit_rows": 8, "ar_step_rows": 8, "fused_rows": 2 * BLOCK * 8}
        )
        if eng.has_diffusion:
            floor = byte_floor(path)
            bw, how = device_bandwidth()
            res["byte_floor"] = {**floor, "bandwidth_bytes_per_s": bw, "bandwidth": how}
            res["preview_floor_ms_by_coreset"] = {
                str(n): (floor["dense_bytes"] + n * floor["expert_bytes"] * floor["layers"]) / (bw / 2) * 1e3
                for n in args.coreset_sizes
            }

        if args.no_sim:
            skipped["simulation"] = "--no-sim"
            return
        # labelled simulations through the real loops (loops.diffusion_loop, speculative.speculative_loop)
        eng.bench_tuning(moe_chunk=int(best))
        # previews without the coreset, as these runs have always measured them
        s = DecodingSettings(
            mask_token_id=mask,
            block_size=BLOCK,
            max_new_tokens=args.sim_tokens,
            context_limit=args.n_ctx,
            coreset_enabled=False,
            coreset_top_p=eng.default_routing.top_p,
        )
        res["simulation_label"] = simulation.SIMULATION_LABEL
        if eng.has_diffusion:
            # one untimed run of each loop first, as every timed pass here has its warm-up: the first
            # run builds the graph of every new pass shape and loads CUDA kernels on first launch
            simulation.diffusion(eng, prompt, s, KS[0])
            simulation.self_speculative(eng, prompt, s, ACCEPTS[0])
            runs = median_runs(
                {str(k): partial(simulation.diffusion, eng, prompt, s, k) for k in KS}, args.sim_reps
            )
            res["e2e_tok_s_by_k"] = {k: r["tokens_per_s"] for k, r in runs.items()}
            res["e2e_runs"] = runs
            for k, r in runs.items():
                log(f"simulation k={k}: {r['passes']} passes, {r['tokens_per_s']:.1f} tok/s")
            runs = median_runs(
                {str(a): partial(simulation.self_speculative, eng, prompt, s, a) for a in ACCEPTS},
                args.sim_reps,
            )
            res["spec_tok_s_by_accept"] = {a: r["tokens_per_s"] for a, r in runs.items()}
            res["spec_runs"] = runs
            for a, r in runs.items():
                log(
                    f"simulation a={a}: {r['passes']} iterations, draft {r['mean_draft_length']:.2f}, "
                    f"{r['tokens_per_s']:.1f} tok/s"
                )
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
    ap.add_argument("--moe-chunks", default="0", help="engine routed-expert chunk settings to time, e.g. 0,8")
    ap.add_argument("--sim-tokens", type=int, default=256, help="tokens per simulated generation")
    ap.add_argument(
        "--sim-reps",
        type=int,
        default=3,
        help="runs of each loop (ar and the labelled simulations): the median",
    )
    ap.add_argument(
        "--coreset-sizes", default=",".join(map(str, CORESET_SIZES)), help="forced coreset sizes to time"
    )
    ap.add_argument(
        "--cpu-moe", action="store_true", help="routed experts in system RAM (llama.cpp's --cpu-moe)"
    )
    ap.add_argument(
        "--no-op-offload",
        action="store_true",
        help="llama.cpp's --no-op-offload: batches use host weights on the CPU (no copy to the GPU)",
    )
    ap.add_argument("--no-sim", action="store_true", help="no loop simulations (pass timings only)")
    ap.add_argument(
        "--baseline",
        help="upstream's qwen35moe twin of MODEL: its AR step timed interleaved with the ar mode's",
    )
    ap.add_argument("--label", default="")
    ap.add_argument(
        "--check", action="store_true", help="load, decode 8 tokens, print ok, exit (a smoke test)"
    )
    args = ap.parse_args(argv)
    args.pp = [int(x) for x in args.pp.split(",") if x.strip()]
    args.moe_chunks = [int(x) for x in args.moe_chunks.split(",") if x.strip()]
    args.coreset_sizes = [int(x) for x in args.coreset_sizes.split(",") if x.strip()]
    from clover_local.placement import Placement

    args.placement = Placement(cpu_moe=args.cpu_moe, op_offload=not args.no_op_offload)
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
            "threads": args.threads or "llama.cpp default",
            "placement": args.placement.options(),
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
        args.model,
        args.ngl,
        args.flash_attn,
        args.n_ctx,
        args.n_batch,
        args.n_ubatch,
        args.threads or None,
        args.placement,
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
        for part in (run_engine, run_ar_mode):
            try:
                part(args.model, args, rng, res)
            except Exception as e:  # record and go on: the plain timings above stand
                res["skipped"][f"{part.__name__}_error"] = f"{type(e).__name__}: {e}"
                log(f"{part.__name__} failed: {e}")
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
