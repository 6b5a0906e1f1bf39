"""The decoding parameters, declared once: name, type, default, allowed range, where a checkpoint
and a GGUF keep each one, its command-line help, and whether a request (and the chat's `/set`) may
change it.

`DecodingParameters` is the table: one annotated field per parameter, its row in `parameter(...)`.
Everything else comes from it: the checkpoint's defaults (`config.GenerationDefaults`, and the
config.json values `CloverConfig` holds), a request's settings (`policy.DecodingSettings`), the
GGUF keys the converter writes and the runtime reads, the ranges the converter, the GGUF check
(`hparam_limits`), the API and the CLI (`clover_local.limits`) enforce, the CLI's decoding
options, the chat's settable names and the server's request fields. Adding a parameter is one
line here.
"""

from __future__ import annotations

from dataclasses import Field, dataclass, field, fields
from typing import Any

from .gguf_names import key
from .ranges import FRACTION, POSITIVE, UNIT, Range

DIFFUSION_PREFIX = key("diffusion.")
CONFIG, GENERATION_CONFIG = "config.json", "generation_config.json"
# a speculative pass runs a draft and a preview block (up to 2 x block_size rows) in one 512-row
# llama.cpp micro-batch
MAX_BLOCK_SIZE = 256


@dataclass(frozen=True)
class Row:
    """How one parameter is checked, stored and offered (the columns besides name, type, default)."""

    help: str
    range: Range | None  # its allowed values; None: any of its type (a bool)
    gguf_type: str  # a `gguf.GGUFValueType` name; stored as `clover-moe.diffusion.<name>`
    request: str | None  # its name in a request, a CLI option (`--request-name`) and `/set`; None: fixed
    short: str | None  # the CLI option's short flag
    config_key: str | None  # its key in config.json, when config.json holds it
    generation: bool  # generation_config.json holds it under its name (and wins over config.json)


def parameter(
    default: Any,
    help: str,
    range: Range | None = None,
    gguf_type: str = "FLOAT32",
    request: str | None = "",
    short: str | None = None,
    config_key: str | None = None,
    generation: bool = True,
) -> Any:
    """A table row: a dataclass field whose metadata holds the `Row` (request "" = the field's name)."""
    row = Row(help, range, gguf_type, request, short, config_key, generation)
    return field(default=default, metadata={"row": row})


@dataclass(frozen=True, kw_only=True)
class DecodingParameters:
    """The decoding parameters a checkpoint's `generation_config.json` (or `config.json`) may set,
    with the documented defaults where it does not (docs/model.md 2.1, 2.4, 2.5)."""

    block_size: int = parameter(
        32, "Tokens per block.", Range(1, MAX_BLOCK_SIZE, integer=True), "UINT32", config_key="block_size"
    )
    threshold: float = parameter(0.95, "Fill threshold of a preview.", UNIT)
    max_new_tokens: int = parameter(
        2048,
        "Response budget.",
        Range(1, 2**31 - 1, integer=True),
        "UINT32",
        request="max_tokens",
        short="-n",
    )
    presence_penalty: float = parameter(0.0, "Presence penalty on response tokens.", Range(-2, 2))
    frequency_penalty: float = parameter(0.0, "Frequency penalty on response tokens.", Range(-2, 2))
    repetition_penalty: float = parameter(
        1.0, "Repetition penalty on response tokens (1: off).", POSITIVE, request="repeat_penalty"
    )
    # Ramps [ours]: a logit bias on stop tokens (and on `</think>` while thinking) that grows
    # linearly from 0 at `*_ramp_start` x budget to `*_ramp_max` at the budget.
    stop_ramp_start: float = parameter(0.0, "Stop ramp start, as a fraction of the budget.", UNIT)
    stop_ramp_max: float = parameter(0.0, "Stop ramp logit bias at the budget.", Range(0))
    think_ramp_start: float = parameter(0.0, "</think> ramp start, as a fraction of the budget.", UNIT)
    think_ramp_max: float = parameter(0.0, "</think> ramp logit bias at the budget.", Range(0))
    logit_shift: int = parameter(
        1,
        "[ours] the hidden state at i predicts token i + logit_shift.",
        Range(0, 1, integer=True),
        "INT32",
        request=None,
    )
    # The previews' expert coreset [vendor]: config.json's, not generation_config.json's
    coreset_enabled: bool = parameter(
        True,
        "Block expert coreset in previews.",
        gguf_type="BOOL",
        request="coreset",
        config_key="moe_block_coreset_enabled",
        generation=False,
    )
    coreset_top_p: float = parameter(
        0.9, "Coreset router mass.", FRACTION, config_key="moe_block_coreset_top_p", generation=False
    )


@dataclass(frozen=True)
class Parameter:
    """One row of the table, read from `DecodingParameters`."""

    name: str  # the field, the `generation_config.json` key and the GGUF key's suffix
    type: type
    default: Any
    help: str
    range: Range | None
    gguf_key: str
    gguf_type: str  # a `gguf.GGUFValueType` name (gguf is imported only by what reads or writes files)
    request: str | None  # the request / CLI / `/set` name; None: not settable per request
    cli_flags: tuple[str, ...]  # the CLI option's flags when not just `--request-name`
    config_key: str | None
    generation: bool

    @classmethod
    def of(cls, f: Field) -> Parameter:
        row: Row = f.metadata["row"]
        kind = {"int": int, "float": float, "bool": bool}[str(f.type)]
        request = f.name if row.request == "" else row.request
        flags: tuple[str, ...] = ()
        if request and kind is bool:
            flags = (f"--{_flag(request)}/--no-{_flag(request)}",)
        elif request and row.short:
            flags = (f"--{_flag(request)}", row.short)
        return cls(
            f.name,
            kind,
            f.default,
            row.help,
            row.range,
            DIFFUSION_PREFIX + f.name,
            row.gguf_type,
            request,
            flags,
            row.config_key,
            row.generation,
        )

    @property
    def source(self) -> str:
        """Where a checkpoint keeps it, as messages name it: `generation_config.json threshold`."""
        return f"{GENERATION_CONFIG} {self.name}" if self.generation else f"{CONFIG} {self.config_key}"


def _flag(name: str) -> str:
    return name.replace("_", "-")


PARAMETERS: tuple[Parameter, ...] = tuple(Parameter.of(f) for f in fields(DecodingParameters))
BY_NAME: dict[str, Parameter] = {p.name: p for p in PARAMETERS}
BY_REQUEST_NAME: dict[str, Parameter] = {p.request: p for p in PARAMETERS if p.request is not None}


def from_request(overrides: dict[str, Any]) -> dict[str, Any]:
    """Request names (`max_tokens`, `repeat_penalty`, `coreset`, ...) to field names; None values
    dropped.

    An unknown name is a TypeError, as an unknown keyword argument would be."""
    unknown = sorted(set(overrides) - set(BY_REQUEST_NAME))
    if unknown:
        raise TypeError(f"unknown decoding setting(s): {', '.join(unknown)}")
    return {BY_REQUEST_NAME[k].name: v for k, v in overrides.items() if v is not None}
