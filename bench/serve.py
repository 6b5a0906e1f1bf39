"""`clover serve` benchmark: a follow-up turn's prompt time, and what HTTP adds to a request.

Starts `clover serve MODEL` on a free port of 127.0.0.1 (MODEL: a GGUF, or a generated preset
converted to F32 here) and measures, in the same run:

- turns: a conversation with a long history (`--history-tokens`), then its follow-up turn (the
  history, the first answer and a new question). The follow-up's `prompt_ms` is compared with the
  same request sent cold, after an unrelated conversation: with prefix reuse (issue 13) the
  follow-up processes only its new tokens, without it the two cost the same.
- overhead: a non-streamed request's wall time at the client against the time `Clover` spent on
  it (`clover.total_ms`, measured inside the server): what queueing, JSON and HTTP on loopback add.

Prints one JSON object (machine, date, numbers) for docs/performance.md.

    python bench/serve.py --preset small --history-tokens 4000
"""

from __future__ import annotations

import argparse
import datetime
import http.client
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from clover_convert.pipeline import Options, convert, prepare

from clover_local.testing.make_checkpoint import write_checkpoint


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def post(port: int, body: dict[str, Any]) -> tuple[dict[str, Any], float]:
    """A non-streamed chat request: its reply and wall seconds."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    start = time.perf_counter()
    conn.request("POST", "/v1/chat/completions", json.dumps(body), {"Content-Type": "application/json"})
    resp = conn.getresponse()
    reply = json.loads(resp.read())
    seconds = time.perf_counter() - start
    conn.close()
    if resp.status != 200:
        raise RuntimeError(f"HTTP {resp.status}: {reply}")
    return reply, seconds


def history(tokens: int) -> list[dict[str, str]]:
    """Turns of filler text, about `tokens` tokens in all (in the generated models' vocabulary)."""
    turns, count = [], 0
    while count < tokens:
        turns.append({"role": "user", "content": f"Tell me fact {len(turns)} about clover. " * 8})
        turns.append({"role": "assistant", "content": f"Clover fact {len(turns)}: it has three leaves. " * 8})
        count += 370  # tokens of one exchange in the generated models' vocabulary
    return turns


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", type=Path, help="a GGUF (default: the preset, generated and converted)")
    ap.add_argument("--preset", default="small")
    ap.add_argument("--history-tokens", type=int, default=4000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=32)
    args = ap.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        model = args.model
        if model is None:
            ckpt = write_checkpoint(Path(tmp) / "ckpt", args.preset)
            prep = prepare(Options(str(ckpt), outfile=Path(tmp) / "model.gguf", outtype="f32", threads=1))
            model = convert(prep, threads=1).shards[0]
        port = free_port()
        clover_bin = Path(sys.executable).with_name("clover")
        cmd = [clover_bin, "serve", str(model), "--port", str(port), "--n-ctx", "0"]
        server = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            result = measure(port, model, args)
        finally:
            server.terminate()
            server.wait()
    print(json.dumps(result, indent=2))


def measure(port: int, model: Path, args: argparse.Namespace) -> dict[str, Any]:
    deadline = time.monotonic() + 120
    while True:
        try:
            post(port, {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1})
            break
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.3)
    limits = {"max_tokens": args.max_tokens, "thinking": False}
    turns = {"cold": [], "follow_up": []}
    prompt_tokens = 0
    for i in range(args.repeats):
        first = [*history(args.history_tokens), {"role": "user", "content": f"And fact number {i}?"}]
        reply, _ = post(port, {"messages": first, **limits})
        follow = [*first, reply["choices"][0]["message"], {"role": "user", "content": "Why?"}]
        warm, _ = post(port, {"messages": follow, **limits})
        post(port, {"messages": [{"role": "user", "content": f"Unrelated {i}."}], **limits})
        cold, _ = post(port, {"messages": follow, **limits})
        turns["follow_up"].append(warm["clover"]["prompt_ms"])
        turns["cold"].append(cold["clover"]["prompt_ms"])
        prompt_tokens = warm["usage"]["prompt_tokens"]

    question = {"messages": [{"role": "user", "content": "What is a clover?"}], **limits}
    walls, inside = [], []
    for _ in range(args.repeats):
        reply, seconds = post(port, question)
        walls.append(seconds * 1e3)
        inside.append(reply["clover"]["total_ms"])
    follow_ms, cold_ms = statistics.median(turns["follow_up"]), statistics.median(turns["cold"])
    return {
        "what": "clover serve: follow-up turn prompt time, and HTTP overhead",
        "machine": f"{platform.machine()} {platform.processor() or ''} cores={os.cpu_count()}",
        "date": datetime.date.today().isoformat(),
        "model": str(model) if args.model else f"generated {args.preset} preset, F32",
        "follow_up_prompt_tokens": prompt_tokens,
        "follow_up_prompt_ms": follow_ms,
        "cold_prompt_ms": cold_ms,
        "follow_up_over_cold": follow_ms / cold_ms,
        "request_wall_ms": statistics.median(walls),
        "request_in_clover_ms": statistics.median(inside),
        "server_overhead_ms": statistics.median(w - i for w, i in zip(walls, inside, strict=True)),
    }


if __name__ == "__main__":
    main()
