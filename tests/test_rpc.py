"""Clover over ggml's RPC backend: the tiny model split over two `clover rpc-server` processes on
127.0.0.1 against the same model run locally, a server lost in the middle of a request, servers
that do not answer, and the wire constants against the pinned tree."""

from __future__ import annotations

import json
import re
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest
from clover_patches import source

from clover_local import rpc
from clover_local.llama import unavailable
from clover_local.memory import allocated, plan
from clover_local.placement import CPU, Placement, PlacementError
from clover_local.testing import rpc_proxy

CLOVER = str(Path(sys.executable).with_name("clover"))
SKIP = unavailable()
needs_llama = pytest.mark.skipif(SKIP is not None, reason=SKIP or "")
PROMPT = "Once upon a time"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RpcServer:
    """A `clover rpc-server` process on a free port of 127.0.0.1 (one CPU thread)."""

    def __init__(self, tmp: Path):
        self.port = free_port()
        self.endpoint = f"127.0.0.1:{self.port}"
        self.log = tmp / f"rpc-server-{self.port}.log"
        with open(self.log, "w") as log:
            self.proc = subprocess.Popen(
                [CLOVER, "rpc-server", "--port", str(self.port), "--threads", "1"],
                stdout=subprocess.DEVNULL,  # ggml's own lines (one per client connection)
                stderr=log,
            )
        deadline = time.monotonic() + 60
        while "serving CPU on" not in self.log.read_text():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"clover rpc-server did not start: {self.log.read_text()}")
            time.sleep(0.05)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@contextmanager
def rpc_servers(tmp: Path, n: int = 2) -> Iterator[list[RpcServer]]:
    servers = [RpcServer(tmp) for _ in range(n)]
    try:
        yield servers
    finally:
        for s in servers:
            s.stop()


@pytest.fixture(scope="module")
def servers(tmp_path_factory) -> Iterator[list[RpcServer]]:
    """Two servers shared by the module's tests that leave them running."""
    if SKIP is not None:
        pytest.skip(SKIP)
    with rpc_servers(tmp_path_factory.mktemp("rpc")) as both:
        yield both
    for s in both:
        assert s.proc.returncode == 130, s.log.read_text()  # Ctrl-C: "stopped"


def endpoints(servers: list[RpcServer]) -> str:
    return ",".join(s.endpoint for s in servers)


def clover(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([CLOVER, *args], capture_output=True, text=True, timeout=300)


# -- without llama.cpp --------------------------------------------------------------------------


def test_servers_are_checked_as_ggml_parses_them():
    assert rpc.parse_servers("10.0.0.2:50052, 10.0.0.3:50053") == ("10.0.0.2:50052", "10.0.0.3:50053")
    assert rpc.parse_servers(["a:1", "b:2,c:3"]) == ("a:1", "b:2", "c:3")
    assert rpc.parse_servers(None) == ()
    for bad in ("10.0.0.2", "10.0.0.2:", ":50052", "h:0", "h:65536", "h:p", "a:1,a:1"):
        with pytest.raises(PlacementError, match="--rpc"):
            Placement(rpc_servers=bad)
    p = Placement(rpc_servers="a:1,b:2")
    assert p.rpc_servers == ("a:1", "b:2") and "--rpc a:1,b:2" in p.options()


def test_wire_constants_are_the_pinned_ggml_rpc():
    from clover_local.llama.rpc import PROTOCOL

    header = source.read_member("vendor/llama.cpp/ggml/include/ggml-rpc.h").decode()
    version = {k: int(v) for k, v in re.findall(r"#define RPC_PROTO_(\w+)_VERSION\s+(\d+)", header)}
    assert PROTOCOL == (version["MAJOR"], version["MINOR"])
    code = source.read_member("vendor/llama.cpp/ggml/src/ggml-rpc/ggml-rpc.cpp").decode()
    enum = re.search(r"enum rpc_cmd \{(.*?)\};", code, re.S).group(1)
    names = re.findall(r"RPC_CMD_(\w+)", enum)
    assert names[: names.index("NONE")] == rpc_proxy.COMMANDS
    assert rpc_proxy.COMMANDS.index("HELLO") == rpc.RPC_CMD_HELLO
    assert (
        f"RPC_CONN_CAPS_SIZE = {rpc.CONN_CAPS};"
        in source.read_member("vendor/llama.cpp/ggml/src/ggml-rpc/transport.h").decode()
    )


def test_an_address_that_does_not_answer_fails_in_seconds(monkeypatch):
    refused = f"127.0.0.1:{free_port()}"
    t0 = time.monotonic()
    with pytest.raises(rpc.RpcError, match=f"^RPC server {refused}: connection refused"):
        rpc.probe(refused)
    assert time.monotonic() - t0 < 1
    with socket.create_server(("127.0.0.1", 0)) as silent:  # accepts into its backlog, never answers
        endpoint = f"127.0.0.1:{silent.getsockname()[1]}"
        monkeypatch.setattr(rpc, "HELLO_TIMEOUT", 0.5)
        t0 = time.monotonic()
        with pytest.raises(rpc.RpcError, match=r"no answer within 0\.5 s .*busy with another client"):
            rpc.probe(endpoint)
        assert time.monotonic() - t0 < 2


def test_a_server_that_is_not_rpc_is_named_so():
    with socket.create_server(("127.0.0.1", 0)) as http:

        def answer() -> None:
            conn, _ = http.accept()
            conn.recv(64)
            conn.sendall(b"HTTP/1.1 400 Bad Request\r\n\r\n")
            conn.close()

        threading.Thread(target=answer, daemon=True).start()
        with pytest.raises(rpc.RpcError, match="not a ggml RPC server"):
            rpc.probe(f"127.0.0.1:{http.getsockname()[1]}")


# -- on llama.cpp: the server command -----------------------------------------------------------


@needs_llama
def test_rpc_server_warns_and_refuses_what_it_cannot_serve(servers):
    log = servers[0].log.read_text()
    assert log.startswith("warning: RPC has no authentication and no encryption")
    assert f"serving CPU on {servers[0].endpoint} (CPU threads: 1), one client at a time" in log
    taken = clover("rpc-server", "--port", str(servers[0].port))
    assert taken.returncode == 1
    assert taken.stderr.strip() == f"error: cannot listen on {servers[0].endpoint}: Address already in use"
    for args, message in (
        (("--host", "localhost"), "error: --host 'localhost': an IPv4 address (0.0.0.0: every interface)"),
        (("--device", "GPU7"), "error: --device GPU7: no such device here; available: CPU"),
    ):
        res = clover("rpc-server", "--port", str(free_port()), *args)
        assert (res.returncode, res.stderr.strip()) == (1, message)


# -- on llama.cpp: a model over two servers -------------------------------------------------------


def engine(path: Path, **kw: object):
    from clover_local.llama.engine import LlamaEngine

    return LlamaEngine(path, n_ctx=256, n_threads=1, flash_attn=False, f32_cache=True, **kw)


@needs_llama
@pytest.mark.llama
# -1: every layer remote; 3: layers 0-1 local, 2-3 and the head on the servers
@pytest.mark.parametrize("n_gpu_layers", [-1, 3])
def test_causal_preview_and_commit_logits_equal_the_local_run(llama_gguf, servers, n_gpu_layers):
    rng = np.random.default_rng(0)
    remote = Placement(rpc_servers=endpoints(servers))
    with (
        engine(llama_gguf) as local,
        engine(llama_gguf, n_gpu_layers=n_gpu_layers, placement=remote) as split,
    ):
        mask = int(local._meta("tokenizer.ggml.mask_token_id", "-1"))
        prompt = rng.integers(0, local.vocab_size, 13).tolist()
        block = rng.integers(0, local.vocab_size, 32).tolist()
        block[1::2] = [mask] * 16
        resolved = [t if t != mask else 7 for t in block]
        for run in (lambda e: e.causal_logits(prompt), lambda e: e.preview_logits(block)):
            np.testing.assert_allclose(run(split), run(local), rtol=0, atol=1e-5)
        np.testing.assert_allclose(
            split.causal_logits(resolved), local.causal_logits(resolved), rtol=0, atol=1e-5
        )


@needs_llama
@pytest.mark.llama
@pytest.mark.parametrize("mode", ["diffusion", "ar", "speculative"])
def test_every_mode_gives_the_local_tokens(llama_gguf, servers, mode):
    from clover_local import Clover

    runs = []
    for kw in ({}, {"rpc_servers": endpoints(servers), "n_gpu_layers": -1}):
        with Clover(llama_gguf, n_ctx=512, n_threads=1, mode=mode, **kw) as llm:
            out = llm.create_completion(PROMPT, max_tokens=48)
            runs.append((out["choices"][0]["text"], out["clover"]["tokens"], out["clover"]["passes"]))
    assert len(runs[0][1]) == 48 and runs[1] == runs[0]


@needs_llama
@pytest.mark.llama
def test_layers_split_over_local_and_remote_devices_as_estimated(llama_gguf, servers):
    """`--rpc` on the command line: llama.cpp's own log of the load puts layers on the CPU and on
    both servers where the memory estimate said, and the tokens are the local run's."""
    ends = endpoints(servers)
    args = ["generate", str(llama_gguf), "-p", PROMPT, "-n", "16", "--raw", "--json", "-c", "512", "-t", "1"]
    local = clover(*args)
    split = clover(*args, "--rpc", ends, "-ngl", "3", "--verbose")
    assert local.returncode == 0 and split.returncode == 0, split.stderr[-2000:]
    assert json.loads(split.stdout)["clover"]["tokens"] == json.loads(local.stdout)["clover"]["tokens"]
    est = plan(llama_gguf, Placement(rpc_servers=ends), 3, 512)
    names = [d.name for d in est.devices]
    assert names == [CPU, *(f"RPC0[{s.endpoint}]" for s in servers)]
    got = allocated(split.stderr, names[1:])
    for d in est.devices:
        assert d.weights > 0 and got[d.name]["weights"] == pytest.approx(d.weights, rel=0.1), (d.name, got)
    free = re.compile(r" of [\d.]+ [GM]iB free")  # what each device has free moves between the runs
    assert free.sub("", est.line()) in free.sub("", split.stderr)  # the line printed before loading


@needs_llama
@pytest.mark.llama
def test_a_pass_reads_back_its_head_rows_not_logits(llama_gguf, servers):
    """Counted at the socket: a 32-row preview on the graph the servers hold moves the boundary
    activations and 8 bytes per head row back from the last server (token + probability), never a
    row of logits, in three round trips."""
    from clover_local.backend import LogitAdjustment

    proxies = [rpc_proxy.RpcProxy(s.endpoint) for s in servers]
    try:
        placement = Placement(rpc_servers=[p.endpoint for p in proxies])
        with engine(llama_gguf, n_gpu_layers=-1, placement=placement) as eng:
            mask = int(eng._meta("tokenizer.ggml.mask_token_id", "-1"))
            adj = LogitAdjustment.identity(eng.vocab_size)
            eng.prefill(list(range(1, 33)), adj)
            eng.preview([mask] * 32, adj)  # its graph, sent whole once
            before = [p.snapshot() for p in proxies]
            eng.preview([mask] * 32, adj)
            first, last = (p.since(b) for p, b in zip(proxies, before, strict=True))
        for t in (first, last):
            assert t.requests["GRAPH_RECOMPUTE"] == 1 and "GRAPH_COMPUTE" not in t.requests
        hidden = 4 * 64 * 32  # F32 rows of the tiny model's width at the boundary between the servers
        assert first.tensors_down == {"l_out-2": hidden} and last.tensors_up["l_out-2"] == hidden
        assert last.tensors_down == {"result_token": 4 * 32, "result_token_prob": 4 * 32}
        assert (first.round_trips, last.round_trips) == (1, 2)
    finally:
        for p in proxies:
            p.close()


# -- on llama.cpp: servers lost or not answering ----------------------------------------------------

LOST = textwrap.dedent(
    """
    import os, signal, sys
    from clover_local import Clover
    from clover_local.rpc import RpcError

    model, servers, victim = sys.argv[1], sys.argv[2], int(sys.argv[3])
    llm = Clover(model, n_ctx=512, n_threads=1, n_gpu_layers=-1, rpc_servers=servers)
    passes = []

    def kill_after_the_first_pass(event):
        passes.append(event)
        if len(passes) == 1:
            os.kill(victim, signal.SIGKILL)

    for attempt in ("mid-request", "next request"):
        try:
            llm.create_completion("Once upon a time", max_tokens=64, on_event=kill_after_the_first_pass)
        except RpcError as e:
            print(f"{attempt}: {e}")
    llm.close()
    with Clover(model, n_ctx=512, n_threads=1) as local:
        print(local.create_completion("Once upon a time", max_tokens=16)["clover"]["tokens"])
    """
)


@needs_llama
@pytest.mark.llama
@pytest.mark.parametrize("victim", [0, 1])  # the server holding the first layers, or the head's
def test_a_server_lost_mid_request_is_one_error_and_the_process_goes_on(llama_gguf, tmp_path, victim):
    from clover_local import Clover

    with rpc_servers(tmp_path) as two:
        res = subprocess.run(
            [sys.executable, "-c", LOST, str(llama_gguf), endpoints(two), str(two[victim].proc.pid)],
            capture_output=True,
            text=True,
            timeout=120,
        )
        survivor = two[1 - victim]
        assert survivor.proc.poll() is None  # the other server goes on serving
    assert res.returncode == 0, res.stderr[-2000:]
    lost = (
        f"RPC server {two[victim].endpoint} was lost (it ended, or the link dropped): the layers it held "
        "are gone; close this model and load it again"
    )
    lines = res.stdout.splitlines()
    assert lines[:2] == [f"mid-request: {lost}", f"next request: {lost}"]
    with Clover(llama_gguf, n_ctx=512, n_threads=1) as local:
        assert lines[2] == str(local.create_completion(PROMPT, max_tokens=16)["clover"]["tokens"])
    assert "Traceback" not in res.stderr and "GGML_ASSERT" not in res.stderr and "abort" not in res.stderr


CUT = textwrap.dedent(
    """
    import sys
    from clover_local import Clover
    from clover_local.rpc import RpcError
    from clover_local.testing.rpc_proxy import RpcProxy

    model, first, second = sys.argv[1:4]

    def run(cut_after):
        proxy = RpcProxy(first, cut_after)
        try:
            servers = [proxy.endpoint, second]
            with Clover(model, n_ctx=512, n_threads=1, n_gpu_layers=-1, rpc_servers=servers) as llm:
                llm.create_completion("Once upon a time", max_tokens=32)
            return "ok", proxy.traffic.sent
        except RpcError:
            return "RpcError", proxy.traffic.sent
        finally:
            proxy.close()

    _, total = run(None)
    for fraction in (0.02, 0.3, 0.6, 0.8, 0.95, 0.99):
        print(fraction, *run(int(fraction * total)))
    with Clover(model, n_ctx=512, n_threads=1) as local:
        print(len(local.create_completion("Once upon a time", max_tokens=32)["clover"]["tokens"]))
    """
)


@needs_llama
@pytest.mark.llama
def test_a_link_cut_anywhere_in_a_load_or_a_request_is_an_rpc_error(llama_gguf, servers):
    """The first server's connection dropped after a share of what a load and a 32-token request
    send it (during the probes, the weights, the graphs, the passes): an `RpcError` every time."""
    res = subprocess.run(
        [sys.executable, "-c", CUT, str(llama_gguf), servers[0].endpoint, servers[1].endpoint],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == 0, res.stderr[-2000:]
    *cuts, local = res.stdout.splitlines()
    assert [c.split()[1] for c in cuts] == ["RpcError"] * 6 and local == "32", res.stdout
    assert "Traceback" not in res.stderr


@needs_llama
@pytest.mark.llama
def test_a_command_given_a_dead_address_fails_in_one_line(llama_gguf):
    dead = f"127.0.0.1:{free_port()}"
    t0 = time.monotonic()
    res = clover("generate", str(llama_gguf), "-p", PROMPT, "-n", "4", "--rpc", dead)
    assert time.monotonic() - t0 < 30  # Python's start-up; the refusal itself is immediate
    assert res.returncode == 1 and res.stdout == ""
    assert (
        res.stderr.strip() == f"error: RPC server {dead}: connection refused (no `clover rpc-server` there?)"
    )


@needs_llama
@pytest.mark.llama
def test_a_server_busy_with_another_client_fails_in_seconds(llama_gguf, servers, monkeypatch):
    from clover_local import Clover

    monkeypatch.setattr(rpc, "HELLO_TIMEOUT", 1.0)
    with engine(llama_gguf, n_gpu_layers=-1, placement=Placement(rpc_servers=servers[0].endpoint)):
        t0 = time.monotonic()
        # another process would wait for the first client to leave; so does this one's probe
        with pytest.raises(rpc.RpcError, match=rf"RPC server {servers[0].endpoint}: no answer within 1 s"):
            Clover(llama_gguf, n_ctx=512, n_gpu_layers=-1, rpc_servers=servers[0].endpoint)
        assert time.monotonic() - t0 < 5


def http(port: int, path: str, body: dict | None = None) -> tuple[int, dict]:
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}{path}",
        data=None if body is None else json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


@needs_llama
@pytest.mark.llama
def test_clover_serve_answers_503_once_a_server_is_lost_and_keeps_serving(llama_gguf, tmp_path):
    pytest.importorskip("fastapi")
    port = free_port()
    with rpc_servers(tmp_path) as two:
        serve = subprocess.Popen(
            [CLOVER, "serve", str(llama_gguf), "--port", str(port), "-c", "512", "-t", "1"]
            + ["--rpc", endpoints(two)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            deadline = time.monotonic() + 60
            while True:
                try:
                    if http(port, "/health")[0] == 200:
                        break
                except OSError:
                    assert serve.poll() is None and time.monotonic() < deadline
                    time.sleep(0.2)
            request = {"prompt": PROMPT, "max_tokens": 8}
            assert http(port, "/v1/completions", request)[0] == 200
            two[1].proc.kill()
            two[1].proc.wait()
            status, body = http(port, "/v1/completions", request)
            assert status == 503 and body["error"]["message"].startswith(
                f"RPC server {two[1].endpoint} was lost"
            )
            assert http(port, "/health")[0] == 200 and serve.poll() is None
        finally:
            serve.send_signal(signal.SIGINT)
            serve.wait(30)
