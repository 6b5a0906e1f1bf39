"""ggml's RPC backend through its C API (`ggml/include/ggml-rpc.h`, with patch 0301): serve this
machine's devices, take a server's devices for a model, tell a server that was lost.

Same style as `capi.py`: each function has its C prototype as a comment and binds libggml-rpc,
which sits next to the libllama llama-cpp-python loaded (every `patches/build.py` build has it:
`-DGGML_RPC=ON`). llama.cpp's `--rpc` registers each server's devices in ggml's device registry
(`ggml_backend_register`), where every later model of the process would find them; here they go
only into the `llama_model_params.devices` of the models that name the server
(`clover_local.llama.placement`). A server that cannot be used raises `RpcError`.
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from pathlib import Path

from llama_cpp import llama_cpp as ll

from ..rpc import RpcError, probe

PROTOCOL = (7, 0)  # RPC_PROTO_MAJOR_VERSION, RPC_PROTO_MINOR_VERSION of the pinned ggml-rpc.h


def _load() -> ctypes.CDLL | None:
    lib = Path(ll._lib._name)
    name = "ggml-rpc.dll" if lib.suffix == ".dll" else f"libggml-rpc{lib.suffix}"
    try:
        return ctypes.CDLL(str(lib.with_name(name)))
    except OSError:
        return None


_rpc = _load()
# patch 0301's ggml_backend_rpc_server_lost: without it a lost server aborts the process
AVAILABLE = _rpc is not None and hasattr(_rpc, "ggml_backend_rpc_server_lost")


def _bind(name: str, argtypes: list[object], restype: object) -> ctypes._CFuncPtr:
    fn = getattr(_rpc, name)
    fn.argtypes, fn.restype = argtypes, restype
    return fn


if AVAILABLE:
    # GGML_BACKEND_API ggml_backend_reg_t ggml_backend_rpc_add_server(const char * endpoint);
    _add_server = _bind("ggml_backend_rpc_add_server", [ctypes.c_char_p], ctypes.c_void_p)
    # GGML_BACKEND_API bool ggml_backend_rpc_server_lost(const char * endpoint);
    _server_lost = _bind("ggml_backend_rpc_server_lost", [ctypes.c_char_p], ctypes.c_bool)
    # GGML_BACKEND_API void ggml_backend_rpc_start_server(const char * endpoint, const char * cache_dir,
    #         size_t n_threads, size_t n_devices, ggml_backend_dev_t * devices);
    _start_server = _bind(
        "ggml_backend_rpc_start_server",
        [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_size_t, ctypes.c_size_t, ctypes.POINTER(ctypes.c_void_p)],
        None,
    )
    # libggml-base, found through libggml-rpc's dependencies:
    # GGML_API size_t ggml_backend_reg_dev_count(ggml_backend_reg_t reg);
    _reg_dev_count = _bind("ggml_backend_reg_dev_count", [ctypes.c_void_p], ctypes.c_size_t)
    # GGML_API ggml_backend_dev_t ggml_backend_reg_dev_get(ggml_backend_reg_t reg, size_t index);
    _reg_dev_get = _bind("ggml_backend_reg_dev_get", [ctypes.c_void_p, ctypes.c_size_t], ctypes.c_void_p)
    # GGML_API ggml_backend_buffer_type_t ggml_backend_dev_buffer_type(ggml_backend_dev_t device);
    _dev_buffer_type = _bind("ggml_backend_dev_buffer_type", [ctypes.c_void_p], ctypes.c_void_p)


def require() -> None:
    if not AVAILABLE:
        raise RpcError(
            "this llama-cpp-python has no RPC backend with patch 0301 (libggml-rpc, "
            "ggml_backend_rpc_server_lost): run `make install` (patches/build.py) to build it"
        )


def connect(endpoint: str) -> list[int]:
    """The devices of the RPC server at `endpoint` (ggml device handles, valid for the process):
    asked with `probe` first, so that a server that does not answer fails in seconds instead of
    holding ggml's blocking connect."""
    require()
    major, minor, patch = probe(endpoint)
    if major != PROTOCOL[0] or minor > PROTOCOL[1]:
        raise RpcError(
            f"RPC server {endpoint} speaks RPC protocol {major}.{minor}.{patch}, this build "
            f"{PROTOCOL[0]}.{PROTOCOL[1]}: serve it with the same clover-local (clover rpc-server)"
        )
    reg = _add_server(endpoint.encode())
    devices = [_reg_dev_get(reg, i) for i in range(_reg_dev_count(reg))] if reg else []
    # a device's buffer type asks the server its alignment once and is kept for the process: a
    # server lost in between gives none (patch 0301) instead of a buffer type that would abort later
    if not devices or not all(_dev_buffer_type(d) for d in devices):
        raise RpcError(f"RPC server {endpoint}: lost while connecting, or it serves no device")
    return devices


def lost(endpoints: Sequence[str]) -> str | None:
    """The first of `endpoints` whose connection failed (patch 0301: its device computes nothing
    from then on, and what a pass read from it is zeros), or None."""
    return next((e for e in endpoints if _server_lost(e.encode())), None)


def serve(endpoint: str, devices: Sequence[int], threads: int) -> None:
    """Serve `devices` on `endpoint` (an IPv4 `HOST:PORT`) with ggml's own server loop, one client
    at a time; returns only when it could not start or accept (it says why on stderr)."""
    require()
    handles = (ctypes.c_void_p * len(devices))(*devices)
    _start_server(endpoint.encode(), None, threads, len(devices), handles)
