"""Where the weights and caches live, and how the file is loaded: llama.cpp's placement options.

The names and meanings are llama.cpp's own (`common/arg.cpp` of the pinned tree), so a command
line that works with `llama-cli` works here: `--cpu-moe` keeps every routed-expert tensor in
system RAM, `--n-cpu-moe N` those of the first N layers, `-ot PATTERN=BUFFER` any tensor whose
name the regex matches (first matching rule wins, user rules first), `-fa on|off|auto`, the K and
V cache types, `--no-mmap`, `--mlock`, `--no-op-offload` (batches use host-resident weights on
the CPU instead of copying them to the GPU for each batch) and `--rpc` (RPC servers whose devices
take layers as local GPUs do). `Placement` only holds and checks the choices; the
llama.cpp side (`clover_local.llama.placement`) turns them into model and context parameters.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Literal

from .rpc import parse_servers

FlashAttn = Literal["on", "off", "auto"]
FLASH_ATTN = ("on", "off", "auto")

# llama.cpp's `kv_cache_types` (common/arg.cpp), in its order
CACHE_TYPES = ("f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1")
QUANTIZED_CACHE = frozenset(CACHE_TYPES[3:])

# common.h's LLM_FFN_EXPS_REGEX: the routed experts' tensors (ffn_{gate,up,down}_exps)
EXPERTS_REGEX = r"\.ffn_(up|down|gate|gate_up)_(ch|)exps"
CPU = "CPU"


class PlacementError(ValueError):
    """An option value llama.cpp would refuse; the message names the option."""


@dataclass(frozen=True)
class Placement:
    """llama.cpp's placement and loading options (the defaults are llama.cpp's).

    `override_tensor` entries are `PATTERN=BUFFER` (one string or several; a comma-separated list
    is split, as llama.cpp does); BUFFER is a buffer type name such as `CPU` or `CUDA0`.
    `rpc_servers`: `HOST:PORT` endpoints (one comma-separated string or several).
    """

    cpu_moe: bool = False
    n_cpu_moe: int = 0
    override_tensor: tuple[str, ...] = field(default=())
    flash_attn: FlashAttn = "auto"
    cache_type_k: str = "f16"
    cache_type_v: str = "f16"
    use_mmap: bool = True
    use_mlock: bool = False
    op_offload: bool = True
    rpc_servers: tuple[str, ...] = field(default=())

    def __post_init__(self) -> None:
        entries = (self.override_tensor,) if isinstance(self.override_tensor, str) else self.override_tensor
        split = tuple(p for entry in entries for p in entry.split(",") if p)
        object.__setattr__(self, "override_tensor", split)
        try:
            object.__setattr__(self, "rpc_servers", parse_servers(self.rpc_servers))
        except ValueError as e:
            raise PlacementError(str(e)) from None
        if self.n_cpu_moe < 0:
            raise PlacementError(f"--n-cpu-moe must be >= 0, got {self.n_cpu_moe}")
        if self.flash_attn not in FLASH_ATTN:
            raise PlacementError(f"--flash-attn must be on, off or auto, got {self.flash_attn!r}")
        for opt, t in (("--cache-type-k", self.cache_type_k), ("--cache-type-v", self.cache_type_v)):
            if t not in CACHE_TYPES:
                raise PlacementError(
                    f"{opt} {t!r} is not a cache type; choose one of {', '.join(CACHE_TYPES)}"
                )
        if self.cache_type_v in QUANTIZED_CACHE and self.flash_attn == "off":
            raise PlacementError(
                f"--cache-type-v {self.cache_type_v} needs flash attention: use --flash-attn on or auto"
            )
        for entry in self.override_tensor:
            pattern, eq, buffer = entry.partition("=")
            if not eq or not pattern or not buffer:
                raise PlacementError(f"--override-tensor {entry!r}: expected PATTERN=BUFFER, e.g. exps=CPU")
            try:
                re.compile(pattern)
            except re.error as e:
                raise PlacementError(f"--override-tensor {entry!r}: bad pattern ({e})") from None

    @classmethod
    def from_llama_kwargs(
        cls,
        flash_attn: bool | str | None = None,
        type_k: int | str | None = None,
        type_v: int | str | None = None,
        **kw: object,
    ) -> Placement:
        """From llama-cpp-python's `Llama` argument names: `flash_attn` a bool (or on/off/auto),
        `type_k` / `type_v` a ggml type id or name; the rest are `Placement` fields."""
        fa = {True: "on", False: "off", None: "auto"}.get(flash_attn, flash_attn)  # type: ignore[arg-type]
        types = {"cache_type_k": type_k, "cache_type_v": type_v}
        given = {k: ggml_type_name(v) for k, v in types.items() if v is not None}
        return cls(flash_attn=fa, **given, **kw)  # type: ignore[arg-type]

    @property
    def experts_on_cpu(self) -> bool:
        """Whether some routed experts are kept in system RAM (by these options alone)."""
        return (
            self.cpu_moe
            or self.n_cpu_moe > 0
            or any(e.endswith(f"={CPU}") and "exps" in e for e in self.override_tensor)
        )

    def overrides(self) -> list[tuple[str, str]]:
        """(regex, buffer type name) in llama.cpp's order of precedence: first match wins."""
        rules = [tuple(e.split("=", 1)) for e in self.override_tensor]
        if self.cpu_moe:
            rules.append((EXPERTS_REGEX, CPU))
        rules += [(rf"blk\.{i}{EXPERTS_REGEX}", CPU) for i in range(self.n_cpu_moe)]
        return rules  # type: ignore[return-value]

    def buffer_for(self, tensor: str) -> str | None:
        """The buffer type an override gives `tensor` (llama.cpp's `std::regex_search`), or None."""
        for pattern, buffer in self.overrides():
            if re.search(pattern, tensor):
                return buffer
        return None

    def options(self) -> list[str]:
        """The command-line options that give this placement (for messages)."""
        out = [f"-ot {e}" for e in self.override_tensor]
        out += ["--cpu-moe"] * self.cpu_moe + [f"--n-cpu-moe {self.n_cpu_moe}"] * (self.n_cpu_moe > 0)
        out += [f"-fa {self.flash_attn}"] * (self.flash_attn != "auto")
        out += [f"-ctk {self.cache_type_k}"] * (self.cache_type_k != "f16")
        out += [f"-ctv {self.cache_type_v}"] * (self.cache_type_v != "f16")
        out += ["--no-mmap"] * (not self.use_mmap) + ["--mlock"] * self.use_mlock
        out += [f"--rpc {','.join(self.rpc_servers)}"] * bool(self.rpc_servers)
        return out + ["--no-op-offload"] * (not self.op_offload)


def ggml_type_name(t: int | str) -> str:
    """A cache type as llama.cpp names it, from a name or a ggml type id (llama-cpp-python's `type_k`)."""
    if isinstance(t, str):
        return t.lower()
    from gguf import GGMLQuantizationType

    try:
        return GGMLQuantizationType(t).name.lower()
    except ValueError:
        raise PlacementError(f"{t} is not a ggml type id") from None


def ggml_type_id(name: str) -> int:
    from gguf import GGMLQuantizationType

    return int(GGMLQuantizationType[name.upper()])


def bytes_per_element(name: str) -> float:
    """Bytes per value of a ggml type (block size / type size of its quantization blocks)."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    block, size = GGML_QUANT_SIZES[GGMLQuantizationType[name.upper()]]
    return size / block
