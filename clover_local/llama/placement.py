"""A `Placement` on llama.cpp: model and context parameters, devices and their free memory, and the
compute buffers llama.cpp would reserve, measured without allocating anything.

llama-cpp-python 0.3.36 declares `llama_model_params.tensor_buft_overrides` but never fills it
(its `Llama` has no such argument); here it gets a NULL-terminated array of
`llama_model_tensor_buft_override` {pattern, buffer type}, as llama.cpp's `-ot` builds it.
Buffer types are looked up by name among the devices' (`ggml_backend_dev_buffer_type`), as
`common/arg.cpp`'s `parse_tensor_buffer_overrides` does. `flash_attn_type`, `type_k`/`type_v`
and `load_mode` are set the way llama-cpp-python's `Llama` sets them. With RPC servers,
`llama_model_params.devices` lists their devices, then the local GPUs: the devices and the order
llama.cpp's default selection gives after its `--rpc` (`llama_model_load_from_splits`).
"""

from __future__ import annotations

import ctypes
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from llama_cpp import llama_cpp as ll

from ..placement import Placement, PlacementError, ggml_type_id
from . import rpc

FLASH_ATTN_TYPE = {
    "on": ll.LLAMA_FLASH_ATTN_TYPE_ENABLED,
    "off": ll.LLAMA_FLASH_ATTN_TYPE_DISABLED,
    "auto": ll.LLAMA_FLASH_ATTN_TYPE_AUTO,
}
DEVICE_CPU, DEVICE_GPU, DEVICE_IGPU = 0, 1, 2  # enum ggml_backend_dev_type


# struct llama_model_tensor_buft_override { const char * pattern; ggml_backend_buffer_type_t buft; };
class llama_model_tensor_buft_override(ctypes.Structure):
    _fields_ = [("pattern", ctypes.c_char_p), ("buft", ctypes.c_void_p)]


def _load_ggml() -> ctypes.CDLL:
    """libggml (the device registry), next to the libllama that llama-cpp-python loaded."""
    lib = Path(ll._lib._name)
    return ctypes.CDLL(str(lib.with_name("ggml.dll" if lib.suffix == ".dll" else f"libggml{lib.suffix}")))


_ggml = _load_ggml()


def _bind(name: str, argtypes: list[Any], restype: Any) -> Any:
    fn = getattr(_ggml, name)
    fn.argtypes, fn.restype = argtypes, restype
    return fn


# GGML_API size_t ggml_backend_dev_count(void);
ggml_backend_dev_count = _bind("ggml_backend_dev_count", [], ctypes.c_size_t)
# GGML_API ggml_backend_dev_t ggml_backend_dev_get(size_t index);
ggml_backend_dev_get = _bind("ggml_backend_dev_get", [ctypes.c_size_t], ctypes.c_void_p)
# GGML_API const char * ggml_backend_dev_name(ggml_backend_dev_t device);
ggml_backend_dev_name = _bind("ggml_backend_dev_name", [ctypes.c_void_p], ctypes.c_char_p)
# GGML_API const char * ggml_backend_dev_description(ggml_backend_dev_t device);
ggml_backend_dev_description = _bind("ggml_backend_dev_description", [ctypes.c_void_p], ctypes.c_char_p)
# GGML_API void ggml_backend_dev_memory(ggml_backend_dev_t device, size_t * free, size_t * total);
ggml_backend_dev_memory = _bind(
    "ggml_backend_dev_memory",
    [ctypes.c_void_p, ctypes.POINTER(ctypes.c_size_t), ctypes.POINTER(ctypes.c_size_t)],
    None,
)
# GGML_API enum ggml_backend_dev_type ggml_backend_dev_type(ggml_backend_dev_t device);
ggml_backend_dev_type = _bind("ggml_backend_dev_type", [ctypes.c_void_p], ctypes.c_int)
# GGML_API ggml_backend_buffer_type_t ggml_backend_dev_buffer_type(ggml_backend_dev_t device);
ggml_backend_dev_buffer_type = _bind("ggml_backend_dev_buffer_type", [ctypes.c_void_p], ctypes.c_void_p)
# GGML_API const char * ggml_backend_buft_name(ggml_backend_buffer_type_t buft);
ggml_backend_buft_name = _bind("ggml_backend_buft_name", [ctypes.c_void_p], ctypes.c_char_p)


def _remote(rpc_servers: Sequence[str]) -> list[int]:
    """The RPC servers' devices, in the order given (each server checked first: `rpc.connect`)."""
    return [d for endpoint in rpc_servers for d in rpc.connect(endpoint)]


def _local() -> list[int]:
    """The devices of the loaded ggml backends (the CPU included)."""
    return [ggml_backend_dev_get(i) for i in range(ggml_backend_dev_count())]


def offload_devices(rpc_servers: Sequence[str]) -> list[int]:
    """The devices layers are offloaded to, in llama.cpp's order: the RPC servers' devices first
    (llama.cpp puts them first to keep network transfers few), then the local GPUs (integrated
    GPUs when there is no discrete one). The CPU is never in the list; it takes what is left."""
    gpus = [d for d in _local() if ggml_backend_dev_type(d) == DEVICE_GPU]
    igpus = [d for d in _local() if ggml_backend_dev_type(d) == DEVICE_IGPU]
    return _remote(rpc_servers) + (gpus or igpus)


def _device_name(dev: int, remote: bool) -> str:
    """A device as its memory lines and `-ot` name it: an RPC device by its buffer type, which
    carries the endpoint (`RPC0[10.0.0.2:50052]`), a local one by its own name (`CUDA0`)."""
    if remote:
        return ggml_backend_buft_name(ggml_backend_dev_buffer_type(dev)).decode()
    return ggml_backend_dev_name(dev).decode()


@dataclass(frozen=True)
class Device:
    """A ggml device: its name (`CUDA0`, `CPU`), description, whether llama.cpp offloads layers
    to it (GPU or integrated GPU) and its memory as the backend reports it."""

    name: str
    description: str
    offload: bool
    free: int
    total: int


def devices(rpc_servers: Sequence[str] = ()) -> list[Device]:
    """The RPC servers' devices, then every device the loaded ggml backends registered (the CPU
    included)."""
    ll.llama_backend_init()
    remote = _remote(rpc_servers)
    out = []
    for i, dev in enumerate(remote + _local()):
        free, total = ctypes.c_size_t(), ctypes.c_size_t()
        ggml_backend_dev_memory(dev, ctypes.byref(free), ctypes.byref(total))
        out.append(
            Device(
                name=_device_name(dev, i < len(remote)),
                description=(ggml_backend_dev_description(dev) or b"").decode(errors="replace"),
                offload=ggml_backend_dev_type(dev) in (DEVICE_GPU, DEVICE_IGPU),
                free=free.value,
                total=total.value,
            )
        )
    return out


def buffer_types(rpc_servers: Sequence[str] = ()) -> dict[str, int]:
    """Buffer type name -> handle, for every device and the RPC servers' (what `-ot PATTERN=BUFFER`
    may name)."""
    ll.llama_backend_init()
    out = {}
    for dev in _remote(rpc_servers) + _local():
        buft = ggml_backend_dev_buffer_type(dev)
        if buft:
            out[ggml_backend_buft_name(buft).decode()] = buft
    return out


def tensor_overrides(placement: Placement) -> ctypes.Array | None:
    """The NULL-terminated override array for `llama_model_params.tensor_buft_overrides`."""
    rules = placement.overrides()
    if not rules:
        return None
    known = buffer_types(placement.rpc_servers)
    arr = (llama_model_tensor_buft_override * (len(rules) + 1))()
    for i, (pattern, buffer) in enumerate(rules):
        if buffer not in known:
            raise PlacementError(
                f"--override-tensor: no buffer type {buffer!r} here; available: {', '.join(sorted(known))}"
            )
        arr[i].pattern, arr[i].buft = pattern.encode(), known[buffer]
    return arr


class Params:
    """Model and context parameters for one placement; holds the override and device arrays while
    llama.cpp reads them (the model keeps only the pointers during loading)."""

    def __init__(
        self,
        placement: Placement,
        n_gpu_layers: int,
        n_ctx: int,
        n_ubatch: int,
        n_rs_seq: int,
        n_threads: int | None = None,
        no_alloc: bool = False,
    ):
        self.model = ll.llama_model_default_params()
        self.model.n_gpu_layers = n_gpu_layers
        self.model.no_alloc = no_alloc
        self._devices = None  # llama.cpp's default selection, unless there are RPC servers
        if placement.rpc_servers:
            ll.llama_backend_init()
            devs = offload_devices(placement.rpc_servers)
            self._devices = (ctypes.c_void_p * (len(devs) + 1))(*devs)
            self.model.devices = ctypes.addressof(self._devices)
        self._overrides = tensor_overrides(placement)
        if self._overrides is not None:
            self.model.tensor_buft_overrides = ctypes.addressof(self._overrides)
        if not placement.use_mmap or placement.use_mlock:  # else llama.cpp's default (auto: mmap)
            self.model.load_mode = {
                (True, True): ll.LLAMA_LOAD_MODE_MMAP_MLOCK,
                (False, True): ll.LLAMA_LOAD_MODE_MLOCK,
                (False, False): ll.LLAMA_LOAD_MODE_NONE,
            }[placement.use_mmap, placement.use_mlock]

        self.context = c = ll.llama_context_default_params()
        c.n_ctx, c.n_batch, c.n_ubatch, c.n_seq_max, c.n_rs_seq = (
            n_ctx,
            max(n_ubatch, 512),
            n_ubatch,
            1,
            n_rs_seq,
        )
        if n_threads is not None:
            c.n_threads = c.n_threads_batch = n_threads
        c.flash_attn_type = FLASH_ATTN_TYPE[placement.flash_attn]
        c.op_offload = placement.op_offload
        c.type_k, c.type_v = ggml_type_id(placement.cache_type_k), ggml_type_id(placement.cache_type_v)


# llama.cpp's own report of what it reserves (llama-context.cpp `sched_reserve`, `llama_context`)
GRAPH_SLOTS, GRAPH_SLOT_ROWS = 4, 64  # patch 0401's defaults
_BUFFER_LINE = re.compile(r"(\S+)\s+(compute|output) buffer size =\s+([\d.]+) MiB")


def graph_slots() -> tuple[int, int]:
    """Patch 0401's graph slots: how many a context keeps and the most rows a slot's ubatch has
    (llama.cpp reads LLAMA_GRAPH_CACHE and LLAMA_GRAPH_CACHE_TOKENS when a context is created)."""
    env = os.environ
    return int(env.get("LLAMA_GRAPH_CACHE", GRAPH_SLOTS)), int(
        env.get("LLAMA_GRAPH_CACHE_TOKENS", GRAPH_SLOT_ROWS)
    )


def compute_buffers(
    path: str | Path, params: Params, slot_rows: int = 0
) -> tuple[dict[str, int], dict[str, int]]:
    """Bytes of compute (and output) buffers per buffer type that llama.cpp reserves for these
    parameters, measured by llama.cpp itself with `no_alloc` (weights and caches are not
    allocated, nothing is read beyond the metadata); with `slot_rows`, also the compute buffers of
    a context reserved for ubatches of that many rows (what one graph slot holds at most), from the
    same model load. Installs a log callback for the duration; the caller's own callback must be set
    again afterwards (the engine sets its own)."""
    lines: list[str] = []

    @ll.llama_log_callback
    def keep(level: int, text: bytes, user_data: ctypes.c_void_p) -> None:
        lines.append(text.decode("utf-8", "replace"))

    def reserved(cparams: Any, kinds: tuple[str, ...]) -> dict[str, int]:
        lines.clear()
        ctx = ll.llama_init_from_model(model, cparams)
        if ctx:
            ll.llama_free(ctx)
        out: dict[str, int] = {}
        for m in _BUFFER_LINE.finditer("".join(lines)):
            if m.group(2) in kinds:
                out[m.group(1)] = out.get(m.group(1), 0) + int(float(m.group(3)) * 2**20)
        return out

    ll.llama_log_set(keep, ctypes.c_void_p(0))
    ll.llama_backend_init()
    params.model.no_alloc = True
    params.model.load_mode = ll.LLAMA_LOAD_MODE_NONE  # mlock of a no_alloc load fails an assert; mmap is moot
    model = ll.llama_model_load_from_file(str(path).encode(), params.model)
    main: dict[str, int] = {}
    slots: dict[str, int] = {}
    if model:
        main = reserved(params.context, ("compute", "output"))
        if slot_rows:
            small = type(params.context).from_buffer_copy(params.context)
            small.n_ubatch = min(slot_rows, params.context.n_ubatch)
            slots = reserved(small, ("compute",))
        ll.llama_model_free(model)
    ll.llama_log_set(ll.llama_log_callback(), ctypes.c_void_p(0))
    return main, slots
