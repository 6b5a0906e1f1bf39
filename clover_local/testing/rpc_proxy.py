"""A TCP proxy in front of an RPC server that counts what crosses the socket, per ggml-rpc command.

`RpcProxy(server_endpoint)` listens on 127.0.0.1 (a free port: `.endpoint`) and forwards one
client connection at a time to the server, parsing both directions in ggml-rpc's wire format
(`ggml/src/ggml-rpc/ggml-rpc.cpp` of the pinned tree): a request is `cmd (1 byte) | size (8) |
payload`, a reply `size (8) | payload`. Every reply is a round trip: the client's connection thread
sends one request and waits for its reply before the next. Requests that carry a tensor
(`SET_TENSOR`, `GET_TENSOR`) are attributed to the tensor's name, read from the serialized
`rpc_tensor` (a scheduler's input copy `RPC0[host:port]#inp_pos#1` counts as `inp_pos`), so a
measurement can say which tensors a pass moves. `snapshot()` / `since()` give
the traffic between two points (`bench/rpc_traffic.py`, tests/test_rpc.py). With `cut_after`
it drops the connection before the request that would take the client's bytes past that many:
a link lost at a chosen point.
"""

from __future__ import annotations

import re
import socket
import struct
import threading
from collections import Counter
from dataclasses import dataclass, field

# enum rpc_cmd of the pinned ggml-rpc.cpp (protocol 7.0.0)
COMMANDS = (
    "ALLOC_BUFFER GET_ALIGNMENT GET_MAX_SIZE BUFFER_GET_BASE FREE_BUFFER BUFFER_CLEAR SET_TENSOR "
    "SET_TENSOR_HASH GET_TENSOR COPY_TENSOR GRAPH_COMPUTE GET_DEVICE_MEMORY INIT_TENSOR GET_ALLOC_SIZE "
    "HELLO DEVICE_COUNT GRAPH_RECOMPUTE MEMSET_TENSOR"
).split()
# the commands the server answers (rpc_serve_client); the others are one-way
REPLIED = frozenset(
    "HELLO DEVICE_COUNT ALLOC_BUFFER GET_ALLOC_SIZE GET_ALIGNMENT GET_MAX_SIZE BUFFER_GET_BASE "
    "SET_TENSOR_HASH GET_TENSOR COPY_TENSOR GET_DEVICE_MEMORY".split()
)
RPC_TENSOR = 296  # sizeof(struct rpc_tensor), packed
NAME_OFFSET, NAME_SIZE = 228, 64  # rpc_tensor.name
NE_OFFSET = 20  # rpc_tensor.ne: 4 x uint32


@dataclass
class Traffic:
    """Bytes each way (frame headers included), requests per command, round trips (replies), and
    the bytes of tensor data each named tensor moved (`SET_TENSOR` up, `GET_TENSOR` down)."""

    sent: int = 0
    received: int = 0
    requests: Counter[str] = field(default_factory=Counter)
    round_trips: int = 0
    tensors_up: Counter[str] = field(default_factory=Counter)
    tensors_down: Counter[str] = field(default_factory=Counter)
    shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)
    graph_bytes: int = 0  # of the GRAPH_COMPUTE requests: the graphs sent whole

    def minus(self, before: Traffic) -> Traffic:
        return Traffic(
            self.sent - before.sent,
            self.received - before.received,
            self.requests - before.requests,
            self.round_trips - before.round_trips,
            self.tensors_up - before.tensors_up,
            self.tensors_down - before.tensors_down,
            dict(self.shapes),
            self.graph_bytes - before.graph_bytes,
        )

    def copy(self) -> Traffic:
        return self.minus(Traffic())

    def to_dict(self) -> dict[str, object]:
        return {
            "sent": self.sent,
            "received": self.received,
            "round_trips": self.round_trips,
            "requests": dict(self.requests),
            "graph_bytes": self.graph_bytes,
            "tensors_up": dict(self.tensors_up),
            "tensors_down": dict(self.tensors_down),
        }


def _tensor(payload: bytes) -> tuple[str, tuple[int, ...]]:
    name = payload[NAME_OFFSET : NAME_OFFSET + NAME_SIZE].split(b"\0", 1)[0].decode(errors="replace")
    copy = re.fullmatch(r".*#(.+)#\d+", name)  # ggml_backend_sched's copy of an input: BACKEND#name#n
    return copy.group(1) if copy else name, struct.unpack_from("<4I", payload, NE_OFFSET)


class RpcProxy:
    """Forward 127.0.0.1:`port` to `server` ("HOST:PORT"), counting into `traffic`."""

    def __init__(self, server: str, cut_after: int | None = None):
        host, _, port = server.partition(":")
        self.server = (host, int(port))
        self.cut_after = cut_after
        self.traffic = Traffic()
        self._lock = threading.Lock()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.endpoint = f"127.0.0.1:{self._listener.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()

    def snapshot(self) -> Traffic:
        with self._lock:
            return self.traffic.copy()

    def since(self, before: Traffic) -> Traffic:
        with self._lock:
            return self.traffic.minus(before)

    def close(self) -> None:
        self._listener.close()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(self.server)
            for s in (client, upstream):
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            pending: list[str] = []  # the answered requests awaiting their reply: a tensor name or ""
            threading.Thread(target=self._requests, args=(client, upstream, pending), daemon=True).start()
            self._replies(upstream, client, pending)

    def _requests(self, src: socket.socket, dst: socket.socket, pending: list[str]) -> None:
        try:
            while True:
                head = _read(src, 9)
                cmd, size = struct.unpack("<BQ", head)
                payload = _read(src, size)
                name = COMMANDS[cmd] if cmd < len(COMMANDS) else str(cmd)
                if self.cut_after is not None and self.traffic.sent + 9 + size > self.cut_after:
                    break
                with self._lock:
                    t = self.traffic
                    t.sent += 9 + size
                    t.requests[name] += 1
                    if name == "GRAPH_COMPUTE":
                        t.graph_bytes += 9 + size
                    tensor = ""
                    if name in ("SET_TENSOR", "GET_TENSOR"):
                        tensor, ne = _tensor(payload)
                        t.shapes[tensor] = ne
                        if name == "SET_TENSOR":
                            t.tensors_up[tensor] += size - RPC_TENSOR - 9
                    if name in REPLIED:
                        pending.append(tensor if name == "GET_TENSOR" else "")
                dst.sendall(head + payload)
        except (OSError, EOFError):
            pass
        _close(src, dst)

    def _replies(self, src: socket.socket, dst: socket.socket, pending: list[str]) -> None:
        try:
            while True:
                head = _read(src, 8)
                (size,) = struct.unpack("<Q", head)
                payload = _read(src, size)
                with self._lock:
                    self.traffic.received += 8 + size
                    self.traffic.round_trips += 1
                    tensor = pending.pop(0) if pending else ""  # replies come in request order
                    if tensor:
                        self.traffic.tensors_down[tensor] += size
                dst.sendall(head + payload)
        except (OSError, EOFError):
            _close(src, dst)


def _read(s: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = s.recv(n - len(data))
        if not chunk:
            raise EOFError
        data += chunk
    return data


def _close(*sockets: socket.socket) -> None:
    for s in sockets:
        try:
            s.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        s.close()
