"""What a pass costs split over RPC servers: bytes and round trips at the socket, and time vs local.

    python bench/rpc_traffic.py MODEL.gguf [--servers 2] [--threads 2] [--prompt 512] [--json OUT]

Starts `--servers` `clover rpc-server` processes on 127.0.0.1 and loads MODEL with every layer on
them (`-ngl -1`, split by their free memory as llama.cpp splits it). Traffic: each server behind
a counting proxy (`clover_local.testing.rpc_proxy`), every pass kind run twice after a prefill:
the first time its graph is new to the servers (sent whole, `GRAPH_COMPUTE`), the second time
it is the graph they hold (`GRAPH_RECOMPUTE`, 4 bytes), with the tensors each pass moved by name.
Then the real loops (diffusion, ar, speculative) over the proxies: how many of their passes send a
graph. Time: the same passes on direct connections against the model on this CPU alone, medians
of `--repeats`.
"""

from __future__ import annotations

import argparse
import json
import socket
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from clover_local.backend import LogitAdjustment, RowAdjustments  # noqa: E402
from clover_local.bench import median_ms  # noqa: E402
from clover_local.llama.engine import LlamaEngine  # noqa: E402
from clover_local.loops import ar_loop, complete, last_result  # noqa: E402
from clover_local.placement import Placement  # noqa: E402
from clover_local.policy import DecodingSettings  # noqa: E402
from clover_local.speculative import SpeculativeSettings, speculative_loop  # noqa: E402
from clover_local.testing.rpc_proxy import RpcProxy, Traffic  # noqa: E402

BLOCK = 32
CLOVER = str(Path(sys.executable).with_name("clover"))


def start_servers(n: int, threads: int) -> list[tuple[str, subprocess.Popen[bytes]]]:
    out = []
    for _ in range(n):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        proc = subprocess.Popen(
            [CLOVER, "rpc-server", "--port", str(port), "--threads", str(threads)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        while "serving" not in (proc.stderr.readline() or "serving"):
            pass
        out.append((f"127.0.0.1:{port}", proc))
    return out


def passes(eng: LlamaEngine, mask: int) -> dict[str, Callable[[], object]]:
    """The pass kinds of the loops, on a sequence the caller has prefilled."""
    adj = LogitAdjustment.identity(eng.vocab_size)
    block, filler = [mask] * BLOCK, list(range(1, BLOCK + 1))
    rows = RowAdjustments.constant(adj, 8)
    return {
        "AR step (1 row)": lambda: eng.commit(filler[:1], adj),
        "preview (32 rows)": lambda: eng.preview(block, adj),
        "commit (32 rows)": lambda: eng.commit(filler, adj),
        "fused commit 4 + preview 32": lambda: eng.commit_and_preview(filler[:4], adj, block),
        "verify 8 + draft 32": lambda: (
            eng.verify_and_draft(filler[:8], rows, block),
            eng.rollback(eng.n_past),
        ),
    }


def summed(traffic: list[Traffic]) -> dict[str, object]:
    """One pass's traffic over all servers, and per server."""
    return {
        "sent": sum(t.sent for t in traffic),
        "received": sum(t.received for t in traffic),
        "round_trips": sum(t.round_trips for t in traffic),
        "graph_bytes": sum(t.graph_bytes for t in traffic),
        "servers": [t.to_dict() for t in traffic],
    }


def measure_traffic(model: str, endpoints: list[str], prompt: list[int], n_ctx: int) -> dict[str, object]:
    proxies = [RpcProxy(e) for e in endpoints]
    placement = Placement(rpc_servers=[p.endpoint for p in proxies])
    out: dict[str, object] = {}

    def traffic(run: Callable[[], object]) -> dict[str, object]:
        before = [p.snapshot() for p in proxies]
        run()
        return summed([p.since(b) for p, b in zip(proxies, before, strict=True)])

    with LlamaEngine(model, n_ctx=n_ctx, n_gpu_layers=-1, speculative=True, placement=placement) as eng:
        mask = eng.mask_token_id
        adj = LogitAdjustment.identity(eng.vocab_size)
        out["prefill"] = traffic(lambda: eng.prefill(prompt, adj))
        for name, run in passes(eng, mask).items():
            out[name] = {"first": traffic(run), "again": traffic(run)}
        s = DecodingSettings(mask_token_id=mask, max_new_tokens=128, stop_token_ids=())
        loops = {
            "diffusion": lambda: complete(eng, prompt, s),
            "ar": lambda: last_result(ar_loop(eng, prompt, s)),
            "speculative": lambda: last_result(speculative_loop(eng, prompt, s, SpeculativeSettings())),
        }
        out["loops"] = {}
        for name, run in loops.items():
            t = traffic(run)
            counts = [srv["requests"] for srv in t["servers"]]
            t["graphs_sent"] = counts[0].get("GRAPH_COMPUTE", 0)
            t["graphs_reused"] = counts[0].get("GRAPH_RECOMPUTE", 0)
            out["loops"][name] = t
    for p in proxies:
        p.close()
    return out


def measure_time(
    model: str, endpoints: list[str], prompt: list[int], n_ctx: int, threads: int, repeats: int
) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    for where, kw in (
        ("local", {}),
        ("rpc", {"n_gpu_layers": -1, "placement": Placement(rpc_servers=endpoints)}),
    ):
        with LlamaEngine(model, n_ctx=n_ctx, n_threads=threads, speculative=True, **kw) as eng:
            mask = eng.mask_token_id
            eng.prefill(prompt, LogitAdjustment.identity(eng.vocab_size))
            for name, run in passes(eng, mask).items():
                run()  # the graph of this shape built (and sent) once
                out.setdefault(name, {})[where] = median_ms(run, repeats)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model")
    ap.add_argument("--servers", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2, help="CPU threads of each server and of the local run")
    ap.add_argument("--prompt", type=int, default=512, help="prompt length (token ids 1..n)")
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--json", type=Path, help="write the results here")
    args = ap.parse_args(argv)

    prompt = [1 + i % 200 for i in range(args.prompt)]
    n_ctx = args.prompt + 1024
    servers = start_servers(args.servers, args.threads)
    endpoints = [e for e, _ in servers]
    try:
        res = {
            "model": args.model,
            "servers": args.servers,
            "prompt": args.prompt,
            "traffic": measure_traffic(args.model, endpoints, prompt, n_ctx),
            "ms": measure_time(args.model, endpoints, prompt, n_ctx, args.threads, args.repeats),
        }
    finally:
        for _, proc in servers:
            proc.terminate()
            proc.wait()
    if args.json:
        args.json.write_text(json.dumps(res, indent=2))
    print("| pass | sent, first / again | received | round trips, first / again | ms local | ms rpc |")
    print("|---|---|---|---|---|---|")
    for name, t in res["traffic"].items():
        if name in ("prefill", "loops"):
            continue
        ms = res["ms"][name]
        first, again = t["first"], t["again"]
        print(
            f"| {name} | {first['sent']} / {again['sent']} | {again['received']} | "
            f"{first['round_trips']} / {again['round_trips']} | {ms['local']:.2f} | {ms['rpc']:.2f} |"
        )
    for name, t in res["traffic"]["loops"].items():
        print(f"loop {name}: {t['graphs_sent']} graphs sent, {t['graphs_reused']} reused, {t['sent']} B sent")
    return 0


if __name__ == "__main__":
    sys.exit(main())
