"""`clover rpc-server`: this machine's devices served to the Clover runs of other machines over
ggml's RPC protocol, by the library's own server loop (`ggml_backend_rpc_start_server`).

The loop runs in a thread of its own (it never returns while it serves), so the main thread can
tell when it listens (it answers `probe`) and stop the process on Ctrl-C. Devices are chosen as
llama.cpp's `rpc-server` chooses them: the named ones, else every GPU, else the CPU.
"""

from __future__ import annotations

import ipaddress
import os
import signal
import threading
import time
from collections.abc import Callable, Sequence

from .rpc import NO_AUTH_WARNING, RpcError, probe

LOOPBACK = "127.0.0.1"


def default_threads() -> int:
    """llama.cpp's rpc-server default: half the hardware threads."""
    return max(1, (os.cpu_count() or 2) // 2)


def choose_devices(names: Sequence[str]) -> list[tuple[str, int]]:
    """(name, handle) of the devices to serve: `names` (ggml device names: CPU, CUDA0, ...), or
    every GPU, or the CPU when there is none."""
    from llama_cpp import llama_cpp as ll

    from .llama import placement as lp

    ll.llama_backend_init()
    local = [lp.ggml_backend_dev_get(i) for i in range(lp.ggml_backend_dev_count())]
    known = {lp.ggml_backend_dev_name(d).decode(): d for d in local}
    if names:
        unknown = [n for n in names if n not in known]
        if unknown:
            have = ", ".join(known)
            raise ValueError(f"--device {','.join(unknown)}: no such device here; available: {have}")
        return [(n, known[n]) for n in names]
    kinds = {n: lp.ggml_backend_dev_type(d) for n, d in known.items()}
    gpus = [(n, known[n]) for n, k in kinds.items() if k in (lp.DEVICE_GPU, lp.DEVICE_IGPU)]
    return gpus or [(n, known[n]) for n, k in kinds.items() if k == lp.DEVICE_CPU]


def check_address(host: str, port: int) -> None:
    """An address ggml's server can take: an IPv4 address (it binds with `inet_addr`), a port."""
    try:
        ipaddress.IPv4Address(host)
    except ValueError:
        raise ValueError(f"--host {host!r}: an IPv4 address (0.0.0.0: every interface)") from None
    if not 0 < port < 65536:
        raise ValueError(f"--port {port}: 1 to 65535")


def warnings(host: str) -> list[str]:
    """What the server says before it listens: RPC's missing authentication, always."""
    out = [NO_AUTH_WARNING]
    if host != LOOPBACK:
        out.append(f"listening on {host}: every machine that can reach this one can use these devices")
    return out


def serve(
    host: str,
    port: int,
    threads: int,
    device_names: Sequence[str],
    say: Callable[[str], None],
    warn: Callable[[str], None],
) -> None:
    """Serve until the process is stopped; `say` gets the line telling it listens, `warn` the
    warnings. Raises `RpcError` when it stops accepting (a port already taken is the caller's to
    check first: ggml's server only says it failed)."""
    from .llama import rpc

    rpc.require()
    check_address(host, port)
    if threads < 1:
        raise ValueError(f"--threads {threads}: 1 or more")
    devices = choose_devices(device_names)
    for line in warnings(host):
        warn(line)
    endpoint = f"{host}:{port}"
    server = threading.Thread(
        target=rpc.serve, args=(endpoint, [d for _, d in devices], threads), name="rpc-server", daemon=True
    )
    server.start()
    asked = LOOPBACK if host == "0.0.0.0" else host
    while server.is_alive():
        try:
            probe(f"{asked}:{port}", timeout=1.0)
            break
        except RpcError:
            time.sleep(0.05)
    # Ctrl-C stops the server: a process started in the background of a non-interactive shell
    # inherits SIGINT ignored, so take it back
    signal.signal(signal.SIGINT, signal.default_int_handler)
    if server.is_alive():
        names = ", ".join(n for n, _ in devices)
        say(f"serving {names} on {endpoint} (CPU threads: {threads}), one client at a time")
    server.join()
    raise RpcError(f"the RPC server on {endpoint} stopped (see the line above)")
