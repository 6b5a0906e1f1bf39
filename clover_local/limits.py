"""The allowed range of every numeric option, checked before any work at the API and the CLI.

One table serves both: the API raises `OptionError` (a ValueError) naming the argument, the CLI
turns the same check into one `error:` line naming the flag, exit code 2 (a usage error).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

GGML_MAX_N_THREADS = 512  # ggml's thread pool limit; more crashes llama.cpp
MAX_BLOCK_SIZE = 256  # a preview runs the whole block in one llama.cpp batch


class OptionError(ValueError):
    """An option outside its allowed range; the message names it and the range."""


@dataclass(frozen=True)
class Range:
    low: float | None = None
    high: float | None = None
    low_open: bool = False  # the low end itself is excluded
    integer: bool = False

    def allows(self, v: float) -> bool:
        if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
            return False
        if self.integer and not float(v).is_integer():
            return False
        if self.low is not None and (v < self.low or (self.low_open and v == self.low)):
            return False
        return self.high is None or v <= self.high

    def describe(self) -> str:
        kind = "an integer" if self.integer else "a number"
        low = None if self.low is None else f"{'>' if self.low_open else '>='} {_num(self.low)}"
        high = None if self.high is None else f"<= {_num(self.high)}"
        if low and high and not self.low_open:
            return f"{kind} from {_num(self.low)} to {_num(self.high)}"
        return f"{kind} " + " and ".join(x for x in (low, high) if x) if low or high else kind


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else str(x)


UNIT, FRACTION = Range(0, 1), Range(0, 1, low_open=True)
RANGES: dict[str, Range] = {
    # loading
    "n_ctx": Range(0, integer=True),  # 0: the model's; the upper bound is the model's (api)
    "n_gpu_layers": Range(-1, integer=True),
    "n_threads": Range(1, GGML_MAX_N_THREADS, integer=True),
    "n_threads_batch": Range(1, GGML_MAX_N_THREADS, integer=True),
    "threads": Range(1, GGML_MAX_N_THREADS, integer=True),
    "n_batch": Range(1, integer=True),
    "draft_len": Range(1, MAX_BLOCK_SIZE, integer=True),
    "refinements": Range(0, 64, integer=True),
    "draft_threshold": UNIT,
    # decoding
    "block_size": Range(1, MAX_BLOCK_SIZE, integer=True),
    "threshold": UNIT,
    "coreset_top_p": FRACTION,
    "presence_penalty": Range(-2, 2),
    "frequency_penalty": Range(-2, 2),
    "repeat_penalty": Range(0, low_open=True),
    "stop_ramp_start": UNIT,
    "stop_ramp_max": Range(0),
    "think_ramp_start": UNIT,
    "think_ramp_max": Range(0),
    "temperature": Range(0),
    "top_p": UNIT,
    "top_k": Range(0, integer=True),
    "min_p": UNIT,
    "seed": Range(-1, 2**64 - 1, integer=True),  # -1: a random seed (llama.cpp's convention)
    "max_tokens": Range(integer=True),  # None or <= 0: the model's default budget (llama-cpp-python)
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
