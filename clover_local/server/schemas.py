"""Request bodies of the server: OpenAI's fields, as llama-cpp-python's server takes them, plus
Clover's own decoding settings as extra fields (the decoding parameters' table, by request name).

Unknown fields are ignored (apps send many: `user`, `metadata`, ...), but a known field of the
wrong type or out of range is a 400, and so is an OpenAI or llama-cpp-python feature this model
cannot give (several choices, tools, log probabilities, `logit_bias`, grammars: the API's
`REQUEST_ARGS_REFUSED`) rather than an answer that silently lacks it.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, create_model, field_validator

from .. import limits
from ..api import DECODING_OVERRIDES, Mode, refusal
from ..model.decoding_parameters import BY_REQUEST_NAME


class UnsupportedField(ValueError):
    """A request asks for an OpenAI feature the server does not provide."""

    def __init__(self, param: str, message: str):
        super().__init__(message)
        self.param = param


class Controls(BaseModel):
    """The request's mode and denoise events, and the range check of every field. Fields it does
    not declare are kept aside (`model_extra`), for `RequestBase.check_supported`."""

    model_config = ConfigDict(extra="allow")

    mode: Mode | None = Field(
        None, description="diffusion or ar on any server; speculative when started with --mode speculative"
    )
    denoise: bool = Field(False, description="stream: add a `clover.pass` event per decoding pass")

    @field_validator("*")
    @classmethod
    def _in_range(cls, value: Any, info: ValidationInfo) -> Any:
        """Every numeric setting against the runtime's one range table (`limits`), field by field
        so that the error names it; the same check `Clover` makes, before the request is queued."""
        if info.field_name in limits.RANGES:
            limits.check(info.field_name, value)
        return value


# the decoding parameters a request may set, as fields (None: the server's `clover serve` option,
# else the model's); `max_tokens` is OpenAI's field, declared with the others below
CloverSettings = create_model(
    "CloverSettings",
    __base__=Controls,
    __doc__="Clover's decoding controls: the mode, denoise events and the decoding parameters.",
    **{
        name: (BY_REQUEST_NAME[name].type | None, Field(None, description=BY_REQUEST_NAME[name].help))
        for name in DECODING_OVERRIDES
    },
)

# the request fields handed to `Clover.create_*_completion` under the same names
FORWARDED = ("max_tokens", "temperature", "top_p", "top_k", "stop", "seed", *DECODING_OVERRIDES)


class StreamOptions(BaseModel):
    include_usage: bool = False


class RequestBase(CloverSettings):
    """The fields `/v1/completions` and `/v1/chat/completions` share."""

    model: str | None = None
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1, description="OpenAI's newer name of max_tokens")
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    seed: int | None = None
    n: int = Field(1, ge=1)
    user: str | None = None

    def check_supported(self) -> None:
        if self.n != 1:
            raise UnsupportedField("n", "only n=1 is supported: one choice per request")
        for name, value in (self.model_extra or {}).items():
            why = refusal(name, value)
            if why:
                raise UnsupportedField(name, why)

    def clover_kwargs(self, defaults: dict[str, Any]) -> dict[str, Any]:
        """Keyword arguments of `Clover.create_*_completion`: the server's defaults, then what this
        request sets (a field left out or null keeps the default)."""
        own = {name: getattr(self, name) for name in FORWARDED}
        own["max_tokens"] = self.max_tokens or self.max_completion_tokens
        return {**defaults, **{k: v for k, v in own.items() if v is not None}}


class CompletionRequest(RequestBase):
    prompt: str | list[int] = Field(..., description="text, or token ids")
    logprobs: int | None = None
    echo: bool = False
    suffix: str | None = None

    def check_supported(self) -> None:
        super().check_supported()
        if self.logprobs:
            raise UnsupportedField("logprobs", "logprobs are not supported: the decoder reads only argmaxes")
        if self.echo:
            raise UnsupportedField("echo", "echo is not supported")
        if self.suffix:
            raise UnsupportedField("suffix", "suffix (fill-in-the-middle) is not supported")


class TextPart(BaseModel):
    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    reasoning_content: str | None = None

    def to_template(self) -> dict[str, Any]:
        """The message as the chat template takes it: text parts joined, `developer` as `system`."""
        text = self.content if not isinstance(self.content, list) else "".join(p.text for p in self.content)
        role = "system" if self.role == "developer" else self.role
        out: dict[str, Any] = {"role": role, "content": text or ""}
        if self.reasoning_content:
            out["reasoning_content"] = self.reasoning_content
        return out


class ChatTemplateKwargs(BaseModel):
    model_config = ConfigDict(extra="ignore")

    enable_thinking: bool | None = None


class ChatCompletionRequest(RequestBase):
    messages: list[ChatMessage] = Field(..., min_length=1)
    thinking: bool | None = Field(None, description="the chat template's enable_thinking (default: on)")
    chat_template_kwargs: ChatTemplateKwargs | None = None
    logprobs: bool | None = None
    tools: list[Any] | None = None
    functions: list[Any] | None = None
    response_format: dict[str, Any] | None = None

    def check_supported(self) -> None:
        super().check_supported()
        if self.logprobs:
            raise UnsupportedField("logprobs", "logprobs are not supported: the decoder reads only argmaxes")
        for name in ("tools", "functions"):
            if getattr(self, name):
                raise UnsupportedField(name, f"{name} (function calling) are not supported")
        if self.response_format and self.response_format.get("type") not in (None, "text"):
            raise UnsupportedField("response_format", "only response_format type 'text' is supported")

    def clover_kwargs(self, defaults: dict[str, Any]) -> dict[str, Any]:
        """As for a completion, plus `thinking` (from `thinking` or `chat_template_kwargs`)."""
        kw = super().clover_kwargs(defaults)
        template = self.chat_template_kwargs
        thinking = self.thinking if self.thinking is not None else template and template.enable_thinking
        return kw if thinking is None else {**kw, "thinking": thinking}

    def template_messages(self) -> list[dict[str, Any]]:
        return [m.to_template() for m in self.messages]
