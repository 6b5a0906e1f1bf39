"""Memory told up front: what a model needs per device for a placement and a context, before
anything is loaded, and whether it fits.

Weights: each tensor's bytes in the GGUF, on the device llama.cpp gives it (token embedding on the
CPU; layer il on the GPU iff il >= n_layer + 1 - n_gpu_layers, the output head iff n_gpu_layers
>= 1; an override rule first). KV: every full-attention layer's K and V rows for the context
(padded to 256 cells, as llama.cpp pads it) in the cache types. Recurrent state: every GDN layer's
conv and delta-rule state, times 1 + n_rs_seq (the speculative mode's snapshots). Compute
buffers: what llama.cpp itself reserves for these parameters, measured with `no_alloc`.
Free memory: llama.cpp's device API for GPUs and RPC servers' devices (each server's own answer),
`MemAvailable` of /proc/meminfo for the CPU.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from .model import gguf_names as gn
from .model.gguf_header import Header, TensorInfo
from .placement import CPU, Placement, bytes_per_element

GiB = 2**30
CTX_PAD = 256  # llama.cpp pads the context to a multiple of 256 cells
F32 = 4


class MemoryFitError(ValueError):
    """The model cannot fit this machine as placed; the message names options that would help."""


@dataclass
class DeviceMemory:
    """Bytes one device needs; `free` is what it has now (None: unknown); `mapped`: the part of
    `weights` read from the memory-mapped file (the OS pages it in and out, so it may exceed
    the free RAM: slow, as with llama.cpp, but it runs)."""

    name: str
    weights: int = 0
    kv: int = 0
    recurrent: int = 0
    compute: int | None = None
    free: int | None = None
    mapped: int = 0
    graphs: int = 0  # the graph slots' compute buffers (patch 0401), allocated by the first small passes

    @property
    def total(self) -> int:
        return self.weights + self.kv + self.recurrent + (self.compute or 0) + self.graphs

    @property
    def fits(self) -> bool:
        return self.free is None or self.total - self.mapped <= self.free

    def line(self) -> str:
        parts = [f"weights {size(self.weights)}", f"KV {size(self.kv)}", f"recurrent {size(self.recurrent)}"]
        parts.append(f"compute {size(self.compute)}")
        if self.graphs:
            parts.append(f"graph slots {size(self.graphs)}")
        free = f" of {size(self.free)} free" if self.free is not None else ""
        return f"{self.name} {size(self.total)} ({', '.join(parts)}){free}"


@dataclass
class MemoryEstimate:
    """Per-device needs of one model, placement and context."""

    devices: list[DeviceMemory]
    n_ctx: int
    snapshots: int = 0  # recurrent-state snapshots per sequence (speculative mode: the block size)

    @property
    def fits(self) -> bool:
        return all(d.fits for d in self.devices)

    def line(self) -> str:
        snaps = f", recurrent incl. {self.snapshots} snapshots" if self.snapshots else ""
        return f"memory (context {self.n_ctx}{snaps}): " + "; ".join(d.line() for d in self.devices)

    def device(self, name: str) -> DeviceMemory:
        return next(d for d in self.devices if d.name == name)

    def to_dict(self) -> dict[str, object]:
        return {
            "n_ctx": self.n_ctx,
            "snapshots": self.snapshots,
            "fits": self.fits,
            "devices": {
                d.name: {
                    "weights": d.weights,
                    "kv": d.kv,
                    "recurrent": d.recurrent,
                    "compute": d.compute,
                    "graphs": d.graphs,
                    "total": d.total,
                    "free": d.free,
                }
                for d in self.devices
            },
        }


def size(n: int | None) -> str:
    """Bytes for people: GiB from 1 GiB up, else MiB."""
    if n is None:
        return "?"
    return f"{n / GiB:.2f} GiB" if n >= GiB else f"{n / 2**20:.1f} MiB"


@dataclass(frozen=True)
class ModelShape:
    """What the estimate needs of a GGUF: tensor sizes and the cache dimensions."""

    tensors: dict[str, int]  # name -> bytes
    n_layer: int
    attention_layers: tuple[int, ...]
    gdn_layers: tuple[int, ...]
    kv_row: tuple[int, int]  # K and V values per cell and layer (heads_kv x key / value length)
    recurrent_row: tuple[int, int]  # conv and delta-rule state values per layer (llama.cpp's n_embd_r/s)
    block_size: int  # the speculative mode keeps this many recurrent-state snapshots

    @classmethod
    def read(cls, path: str | Path) -> ModelShape:
        from .model.gguf_info import read_header

        return cls.of(read_header(path))

    @classmethod
    def of(cls, header: Header) -> ModelShape:
        """From a header already read (`Clover()` reads it once for the metadata and this)."""
        from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

        from .model.tensors import gdn_layers

        def key(name: str, default: int = 0) -> int:
            v = header.metadata.get(gn.key(name), default)
            return int(v[0] if isinstance(v, list) else v)  # a per-layer array: its first layer's

        def n_bytes(t: TensorInfo) -> int:
            block, type_size = GGML_QUANT_SIZES[GGMLQuantizationType(t.type)]
            return t.n_elements * type_size // block

        tensors = {t.name: n_bytes(t) for t in header.tensors}
        n_layer = key("block_count")
        gdn = tuple(gdn_layers(set(tensors), n_layer))
        heads_kv = key("attention.head_count_kv")
        conv, inner, state, groups = (
            key("ssm.conv_kernel"),
            key("ssm.inner_size"),
            key("ssm.state_size"),
            key("ssm.group_count"),
        )
        return cls(
            tensors=tensors,
            n_layer=n_layer,
            attention_layers=tuple(i for i in range(n_layer) if i not in gdn),
            gdn_layers=gdn,
            kv_row=(heads_kv * key("attention.key_length"), heads_kv * key("attention.value_length")),
            recurrent_row=(max(conv - 1, 0) * (inner + 2 * groups * state), state * inner),
            block_size=key("diffusion.block_size", 32),
        )


_LAYER = re.compile(r"^blk\.(\d+)\.")


def layer_devices(n_layer: int, n_gpu_layers: int, gpus: Sequence[str], gpu_free: Sequence[int]) -> list[str]:
    """Device of layers 0..n_layer (the last entry: the output head), as llama.cpp assigns them:
    the last n_gpu_layers of the n_layer + 1 go to the GPUs, split in proportion to free memory."""
    if not gpus:
        return [CPU] * (n_layer + 1)
    ngl = n_layer + 1 if n_gpu_layers < 0 else min(n_gpu_layers, n_layer + 1)
    start = n_layer + 1 - ngl
    weights = list(gpu_free) if sum(gpu_free) else [1] * len(gpus)
    bounds = [sum(weights[: i + 1]) / sum(weights) for i in range(len(gpus))]

    def gpu(il: int) -> str:  # llama.cpp: upper_bound of the layer's fraction in the cumulative split
        frac = (il - start) / ngl
        return gpus[next((i for i, b in enumerate(bounds) if frac < b), len(gpus) - 1)]

    return [CPU if il < start else gpu(il) for il in range(n_layer + 1)]


def estimate(
    shape: ModelShape,
    placement: Placement,
    n_gpu_layers: int,
    n_ctx: int,
    snapshots: int = 0,
    gpus: Sequence[tuple[str, int | None]] = (),
    ram_free: int | None = None,
    compute: dict[str, int] | None = None,
    graphs: dict[str, int] | None = None,
) -> MemoryEstimate:
    """The per-device needs. `gpus`: (name, free bytes) of the devices llama.cpp offloads to;
    `compute`: llama.cpp's reserved compute/output buffers by buffer type name (`*_Host` and
    unknown names count as system RAM); `graphs`: the graph slots' compute buffers, by the same
    names."""
    names = [g[0] for g in gpus]
    where = layer_devices(shape.n_layer, n_gpu_layers, names, [g[1] or 0 for g in gpus])
    devs = {CPU: DeviceMemory(CPU, free=ram_free)}
    for name, free in gpus:
        devs[name] = DeviceMemory(name, free=free)

    def device_of(tensor: str) -> str:
        override = placement.buffer_for(tensor)
        if override is not None:
            return override if override in devs else CPU
        m = _LAYER.match(tensor)
        if m:
            return where[int(m.group(1))]
        return CPU if tensor == "token_embd.weight" else where[shape.n_layer]

    for name, nbytes in shape.tensors.items():
        devs[device_of(name)].weights += nbytes
    if placement.use_mmap and not placement.use_mlock:
        devs[CPU].mapped = devs[CPU].weights
    if "output.weight" not in shape.tensors and where[shape.n_layer] != CPU:  # tied: a copy on the GPU
        devs[where[shape.n_layer]].weights += shape.tensors.get("token_embd.weight", 0)

    cells = math.ceil(n_ctx / CTX_PAD) * CTX_PAD
    k_row, v_row = shape.kv_row
    per_layer_kv = cells * (
        k_row * bytes_per_element(placement.cache_type_k) + v_row * bytes_per_element(placement.cache_type_v)
    )
    for il in shape.attention_layers:
        devs[where[il]].kv += int(per_layer_kv)
    rows = 1 + snapshots
    per_layer_rs = (shape.recurrent_row[0] + shape.recurrent_row[1]) * F32 * rows
    for il in shape.gdn_layers:
        devs[where[il]].recurrent += per_layer_rs

    if compute is not None:
        for d in devs.values():
            d.compute = 0
        for buft, size in compute.items():
            devs[buft if buft in devs else CPU].compute += size  # type: ignore[operator]
    for buft, size in (graphs or {}).items():
        devs[buft if buft in devs else CPU].graphs += size
    used = [d for d in devs.values() if d.total or d.name == CPU]
    return MemoryEstimate(used, n_ctx=n_ctx, snapshots=snapshots)


# llama.cpp's own report of the buffers it allocated (load_tensors, llama_kv_cache,
# llama_memory_recurrent, sched_reserve, llama_context)
_ALLOCATED = re.compile(r"(\S+)\s+(model|KV|RS|compute|output) buffer size =\s+([\d.]+) MiB")
_KIND = {"model": "weights", "KV": "kv", "RS": "recurrent", "compute": "compute", "output": "compute"}


def allocated(log: str, gpus: Sequence[str] = ()) -> dict[str, dict[str, int]]:
    """Bytes per device and kind (weights, kv, recurrent, compute) that llama.cpp's log of a load
    reports: what the estimate is checked against. Host buffers (`CPU_Mapped`, `CUDA_Host`, ...)
    count as the CPU's."""
    out: dict[str, dict[str, int]] = {}
    for buffer, kind, mib in _ALLOCATED.findall(log):
        device = buffer if buffer in gpus else CPU
        kinds = out.setdefault(device, dict.fromkeys(("weights", "kv", "recurrent", "compute"), 0))
        kinds[_KIND[kind]] += int(float(mib) * 2**20)
    return out


def ram_available(meminfo: str = "/proc/meminfo") -> int | None:
    """`MemAvailable` in bytes (None where /proc/meminfo is absent: not Linux)."""
    try:
        text = Path(meminfo).read_text()
    except OSError:
        return None
    m = re.search(r"^MemAvailable:\s+(\d+) kB", text, re.M)
    return int(m.group(1)) * 1024 if m else None


def advice(est: MemoryEstimate, placement: Placement, n_gpu_layers: int) -> str:
    """The options that would make an estimate that does not fit fit (one line's worth)."""
    over = [d for d in est.devices if not d.fits]
    hints = []
    if any(d.name != CPU for d in over):
        if not placement.experts_on_cpu:
            hints.append("--cpu-moe (routed experts in system RAM)")
        hints.append(f"fewer --n-gpu-layers (now {n_gpu_layers})")
    if any(d.kv for d in over):
        if placement.cache_type_k == "f16" or placement.cache_type_v == "f16":
            hints.append("-ctk q8_0 -ctv q8_0")
        hints.append(f"a smaller --n-ctx (now {est.n_ctx})")
    if est.snapshots:
        hints.append("--mode diffusion or ar (no recurrent-state snapshots)")
    if any(d.name == CPU for d in over):
        hints.append("a smaller quantization")
    return ", ".join(dict.fromkeys(hints))


def summary(est: MemoryEstimate, placement: Placement, n_gpu_layers: int) -> str:
    """The one line printed before loading, or the one error line when it cannot fit."""
    if est.fits:
        return est.line()
    short = "; ".join(
        f"{d.name} needs {size(d.total)}, {size(d.free)} free" for d in est.devices if not d.fits
    )
    return f"the model does not fit: {short}; try {advice(est, placement, n_gpu_layers)}"


def plan(
    path: str | Path,
    placement: Placement,
    n_gpu_layers: int,
    n_ctx: int,
    speculative: bool = False,
    n_ubatch: int = 512,
    shape: ModelShape | None = None,
) -> MemoryEstimate:
    """The estimate for loading `path` here: this machine's devices and free memory, and the
    compute buffers llama.cpp reserves for these parameters. Without the patched runtime: no
    GPUs and compute buffers unknown."""
    from .llama import unavailable

    shape = shape or ModelShape.read(path)
    snapshots = shape.block_size if speculative else 0
    gpus: list[tuple[str, int | None]] = []
    compute = graphs = None
    if unavailable() is None:
        from .llama.placement import Params, compute_buffers, devices, graph_slots

        gpus = [(d.name, d.free) for d in devices(placement.rpc_servers) if d.offload]
        params = Params(placement, n_gpu_layers, n_ctx, n_ubatch, n_rs_seq=snapshots)
        slots, rows = graph_slots()
        reserved, slot = compute_buffers(path, params, slot_rows=rows if slots else 0)
        compute = reserved or None
        if compute is not None and slot:
            graphs = {k: slots * v for k, v in slot.items()}  # each slot holds at most a `rows` reservation
    return estimate(shape, placement, n_gpu_layers, n_ctx, snapshots, gpus, ram_available(), compute, graphs)
