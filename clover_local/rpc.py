"""RPC servers as the user names them, and the one question asked of a server before ggml connects:
does it answer the RPC handshake in time.

ggml's RPC client (`ggml-rpc`) connects with a blocking `connect` and waits for the handshake
without a timeout, so a host that drops packets holds it for minutes, and a server busy with
another client (it serves one at a time) holds it until that client leaves. `probe` asks first,
with a timeout, in ggml-rpc's own wire format (`ggml/src/ggml-rpc/ggml-rpc.cpp` of the pinned
tree: the HELLO command, whose number is fixed across protocol versions), so a server that does
not answer fails in seconds with one line that says why. Pure Python: no llama.cpp needed.

RPC has no authentication and no encryption: whoever reaches a server's port runs graphs on it
and reads and writes its memory.
"""

from __future__ import annotations

import socket
import struct
from collections.abc import Sequence

DEFAULT_PORT = 50052
HELLO_TIMEOUT = 5.0  # seconds for the connection and the handshake
RPC_CMD_HELLO = 14  # ggml-rpc.cpp: "RPC_CMD_HELLO must be always 14"
CONN_CAPS = 24  # RPC_CONN_CAPS_SIZE: transport capabilities (RDMA); zeros ask for plain TCP
HELLO_REPLY = 4 + CONN_CAPS  # major, minor, patch, padding, conn_caps
NO_AUTH_WARNING = (
    "RPC has no authentication and no encryption: anyone who can reach this port can run "
    "computations on the served devices and read what clients stored there; serve trusted networks only"
)


class RpcError(ConnectionError):
    """An RPC server that cannot be used: not reachable, not answering, or lost during a pass."""


def parse_servers(servers: str | Sequence[str] | None) -> tuple[str, ...]:
    """`HOST:PORT` endpoints from llama.cpp's comma-separated `--rpc` list (or a sequence of them),
    checked as ggml-rpc parses them (host before the first colon, a port 1-65535 after it)."""
    if servers is None:
        return ()
    entries = (servers,) if isinstance(servers, str) else tuple(servers)
    out = tuple(e.strip() for entry in entries for e in entry.split(",") if e.strip())
    for e in out:
        host, _, port = e.partition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"--rpc {e!r}: expected HOST:PORT, e.g. 192.168.1.2:{DEFAULT_PORT}")
    if len(set(out)) != len(out):
        raise ValueError(f"--rpc {','.join(out)}: a server is named twice")
    return out


def split(endpoint: str) -> tuple[str, int]:
    host, _, port = endpoint.partition(":")
    return host, int(port)


def probe(endpoint: str, timeout: float | None = None) -> tuple[int, int, int]:
    """The protocol version (major, minor, patch) the RPC server at `endpoint` answers the
    handshake with, within `timeout` seconds (default `HELLO_TIMEOUT`); else `RpcError` saying
    what happened."""
    host, port = split(endpoint)
    timeout = HELLO_TIMEOUT if timeout is None else timeout
    try:
        with socket.create_connection((host, port), timeout=timeout) as s:
            s.sendall(struct.pack("<BQ", RPC_CMD_HELLO, CONN_CAPS) + bytes(CONN_CAPS))
            reply = _recv(s, 8 + HELLO_REPLY)
    except ConnectionRefusedError:
        raise RpcError(f"RPC server {endpoint}: connection refused (no `clover rpc-server` there?)") from None
    except TimeoutError:
        raise RpcError(
            f"RPC server {endpoint}: no answer within {timeout:g} s (host unreachable, a firewall, or "
            "a server busy with another client: each serves one at a time)"
        ) from None
    except OSError as e:
        raise RpcError(f"RPC server {endpoint}: {e.strerror or e}") from None
    if not reply:
        raise RpcError(f"RPC server {endpoint}: closed the connection without answering the handshake")
    if len(reply) < 8 + HELLO_REPLY or struct.unpack("<Q", reply[:8])[0] != HELLO_REPLY:
        raise RpcError(f"RPC server {endpoint}: not a ggml RPC server (unexpected handshake reply)")
    return tuple(reply[8:11])  # type: ignore[return-value]


def _recv(s: socket.socket, n: int) -> bytes:
    """Up to `n` bytes: fewer only when the peer closed the connection."""
    data = b""
    while len(data) < n:
        chunk = s.recv(n - len(data))
        if not chunk:
            break
        data += chunk
    return data
