"""The decoding parameters, declared once: name, type, default, where a checkpoint and a GGUF keep
each one, its command-line help, and whether a request (and the chat's `/set`) may change it.

`DecodingParameters` is the table: one annotated field per parameter, its row in `parameter(...)`.
Everything else comes from it: the checkpoint's defaults (`config.GenerationDefaults`), a request's
settings (`policy.DecodingSettings`), the GGUF keys the converter writes and the runtime reads,
the CLI's decoding options and the chat's settable names. Adding a parameter is one line here.
"""

from __future__ import annotations

from dataclasses import Field, dataclass, field, fields
from typing import Any

from .gguf_names import key

DIFFUSION_PREFIX = key("diffusion.")


@dataclass(frozen=True)
class Row:
    """How one parameter is stored and offered (the table's columns besides name, type, default)."""

    help: str
    gguf_type: str  # a `gguf.GGUFValueType` name; stored as `clover-moe.diffusion.<name>`
    request: str | None  # its name in a request, a CLI option (`--request-name`) and `/set`; None: fixed
    short: str | None  # the CLI option's short flag


def parameter(
    default: Any,
    help: str,
    gguf_type: str = "FLOAT32",
    request: str | None = "",
    short: str | None = None,
) -> Any:
    """A table row: a dataclass field whose metadata holds the `Row` (request "" = the field's name)."""
    return field(default=default, metadata={"row": Row(help, gguf_type, request, short)})


@dataclass(frozen=True, kw_only=True)
class DecodingParameters:
    """The decoding parameters a checkpoint's `generation_config.json` may set (same key names), with
    the documented defaults where it does not (docs/model.md 2.1, 2.5)."""

    block_size: int = parameter(32, "Tokens per block.", "UINT32")
    threshold: float = parameter(0.95, "Fill threshold of a preview.")
    max_new_tokens: int = parameter(2048, "Response budget.", "UINT32", request="max_tokens", short="-n")
    presence_penalty: float = parameter(0.0, "Presence penalty on response tokens.")
    frequency_penalty: float = parameter(0.0, "Frequency penalty on response tokens.")
    repetition_penalty: float = parameter(
        1.0, "Repetition penalty on response tokens (1: off).", request="repeat_penalty"
    )
    # Ramps [ours]: a logit bias on stop tokens (and on `</think>` while thinking) that grows
    # linearly from 0 at `*_ramp_start` x budget to `*_ramp_max` at the budget.
    stop_ramp_start: float = parameter(0.0, "Stop ramp start, as a fraction of the budget.")
    stop_ramp_max: float = parameter(0.0, "Stop ramp logit bias at the budget.")
    think_ramp_start: float = parameter(0.0, "</think> ramp start, as a fraction of the budget.")
    think_ramp_max: float = parameter(0.0, "</think> ramp logit bias at the budget.")
    logit_shift: int = parameter(
        1, "[ours] the hidden state at i predicts token i + logit_shift.", "INT32", request=None
    )


@dataclass(frozen=True)
class Parameter:
    """One row of the table, read from `DecodingParameters`."""

    name: str  # the field, and the `generation_config.json` key
    type: type
    default: Any
    help: str
    gguf_key: str
    gguf_type: str  # a `gguf.GGUFValueType` name (gguf is imported only by what reads or writes files)
    request: str | None  # the request / CLI / `/set` name; None: not settable per request
    cli_flags: tuple[str, ...]  # the CLI option's flags when not just `--request-name`

    @classmethod
    def of(cls, f: Field) -> Parameter:
        row: Row = f.metadata["row"]
        kind = {"int": int, "float": float, "bool": bool}[str(f.type)]
        request = f.name if row.request == "" else row.request
        flags = (f"--{request.replace('_', '-')}", row.short) if request and row.short else ()
        return cls(
            f.name, kind, f.default, row.help, DIFFUSION_PREFIX + f.name, row.gguf_type, request, flags
        )


PARAMETERS: tuple[Parameter, ...] = tuple(Parameter.of(f) for f in fields(DecodingParameters))
BY_REQUEST_NAME: dict[str, Parameter] = {p.request: p for p in PARAMETERS if p.request is not None}


def from_request(overrides: dict[str, Any]) -> dict[str, Any]:
    """Request names (`max_tokens`, `repeat_penalty`, ...) to field names; None values dropped.

    An unknown name is a TypeError, as an unknown keyword argument would be."""
    unknown = sorted(set(overrides) - set(BY_REQUEST_NAME))
    if unknown:
        raise TypeError(f"unknown decoding setting(s): {', '.join(unknown)}")
    return {BY_REQUEST_NAME[k].name: v for k, v in overrides.items() if v is not None}
