"""The allowed range of every numeric option, checked before any work at the API and the CLI.

One table serves both: the API raises `OptionError` (a ValueError) naming the argument, the CLI
turns the same check into one `error:` line naming the flag, exit code 2 (a usage error). The
decoding parameters' ranges come from their table (`model.decoding_parameters`), under their
request names.
"""

from __future__ import annotations

from typing import Any

from .model.decoding_parameters import MAX_BLOCK_SIZE, PARAMETERS
from .model.ranges import UNIT, Range

GGML_MAX_N_THREADS = 512  # ggml's thread pool limit; more crashes llama.cpp


class OptionError(ValueError):
    """An option outside its allowed range; the message names it and the range."""


RANGES: dict[str, Range] = {
    # loading
    "n_ctx": Range(0, integer=True),  # 0: the model's; the upper bound is the model's (api)
    "n_gpu_layers": Range(-1, integer=True),
    "n_threads": Range(1, GGML_MAX_N_THREADS, integer=True),
    "n_threads_batch": Range(1, GGML_MAX_N_THREADS, integer=True),
    "threads": Range(1, GGML_MAX_N_THREADS, integer=True),
    "n_batch": Range(1, integer=True),
    "n_cpu_moe": Range(0, integer=True),
    "draft_len": Range(1, MAX_BLOCK_SIZE, integer=True),
    "refinements": Range(0, 64, integer=True),
    "draft_threshold": UNIT,
    "port": Range(1, 65535, integer=True),  # `clover serve`
    # decoding
    **{p.request: p.range for p in PARAMETERS if p.request is not None and p.range is not None},
    # a request's max_tokens None or <= 0 is the model's default budget (llama-cpp-python), so any
    # integer; the budget a model file stores has the table's range
    "max_tokens": Range(integer=True),
    "temperature": Range(0),
    "top_p": UNIT,
    "top_k": Range(0, integer=True),
    "min_p": UNIT,
    "seed": Range(-1, 2**64 - 1, integer=True),  # -1: a random seed (llama.cpp's convention)
}


def check(name: str, value: Any, flag: str | None = None) -> None:
    """Raise `OptionError` when `value` (None: the default, always fine) is outside `name`'s range."""
    r = RANGES.get(name)
    if value is None or r is None or r.allows(value):
        return
    raise OptionError(f"{flag or name} must be {r.describe()}, got {value!r}")


def check_all(values: dict[str, Any], flags: bool = False) -> None:
    """`check` every known option of `values`; `flags` names them as CLI flags (`--block-size`)."""
    for name, value in values.items():
        check(name, value, "--" + name.replace("_", "-") if flags else None)
