"""`Clover`: llama-cpp-python's `Llama` interface over the block-diffusion loop.

`create_completion` / `create_chat_completion` return the same OpenAI-shaped dicts and stream
chunks as `llama_cpp.Llama`, so an application can swap one for the other; Clover's controls
(block size, threshold, coreset, penalties, ramps, thinking) are extra keyword arguments, the
reasoning of a thinking answer goes to `reasoning_content`, and every result carries decoding
statistics under `"clover"`. Everything is driven by one generator of decode events
(`Clover.generate`), which streaming, `--visual` and `bench` consume as well.

A `Clover` runs one request at a time. A request runs only the prompt tokens the sequence does not
already hold (`prompt_cache`: a continuation or the next chat turn keeps the history), so a
stream closed early (or interrupted) leaves only committed tokens, which the next request keeps
where its prompt repeats them. It may be shared by threads: calls are serialized by a lock
(`guard`; a non-streaming request holds it to its end, a stream for each step); starting a request
while a stream is open ends that stream with a RuntimeError. After `close()` every call raises
`ClosedError` (a ValueError).
"""

from __future__ import annotations

import sys
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Literal, Protocol, cast

import numpy as np

from . import limits, memory, policy, speculative
from .backend import Backend, Sampler, SpeculativeBackend
from .guard import Guard, serialized
from .loops import BlockEvent, Event, PassEvent, Result, TokenEvent, ar_loop, diffusion_loop
from .memory import MemoryEstimate
from .model.config import CONTEXT_LIMIT, CheckpointConfig, GenerationDefaults
from .model.decoding_parameters import BY_REQUEST_NAME, from_request
from .model.gguf_info import ModelFileError, ModelInfo, read_header, read_info
from .model.tokenizer import THINK_END, THINK_START, CloverTokenizer
from .placement import FlashAttn, Placement
from .policy import DecodingSettings
from .prompt_cache import Reuse
from .textstream import CONTENT, REASONING, Delta, TextStream

Mode = Literal["diffusion", "ar", "speculative"]
MODES = ("diffusion", "ar", "speculative")
AnyEvent = Event | speculative.IterationEvent
EventCallback = Callable[[AnyEvent], None]


class Tokenizer(Protocol):
    """What the API needs of a tokenizer: `CloverTokenizer` (HF files) or `GgufTokenizer`."""

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str: ...

    def token_id(self, token: str) -> int | None: ...

    def render_chat(
        self,
        messages: Sequence[dict[str, Any]],
        enable_thinking: bool = True,
        add_generation_prompt: bool = True,
    ) -> str: ...


@dataclass
class _Trace:
    """What a request cost, gathered from its events (also when a stop string ends it early)."""

    mode: str
    prompt_tokens: int
    start: float = field(default_factory=time.perf_counter)
    prefill_seconds: float | None = None
    preview_seconds: list[float] = field(default_factory=list)
    commit_seconds: list[float] = field(default_factory=list)
    passes_per_block: list[int] = field(default_factory=list)
    tokens_per_pass: list[int] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)

    def add(self, event: AnyEvent) -> None:
        """Diffusion: previews fill, commits append; ar / speculative: each causal pass appends."""
        if isinstance(event, Result):
            return
        if self.prefill_seconds is None:  # the first event arrives after the prefill and its own pass
            own = event.commit_seconds if isinstance(event, BlockEvent) else event.seconds
            self.prefill_seconds = time.perf_counter() - self.start - own
        if isinstance(event, PassEvent):
            self.preview_seconds.append(event.seconds)
            self.tokens_per_pass.append(len(event.filled))
        elif isinstance(event, BlockEvent):
            self.passes_per_block.append(event.passes)
            self.commit_seconds.append(event.commit_seconds)
        else:
            self.tokens_per_pass.append(len(appended(event)))
            self.commit_seconds.append(event.seconds)
        self.tokens += appended(event)

    def stats(self, reuse: Reuse | None = None) -> dict[str, Any]:
        """The request's statistics; `reuse`: what the prefill kept of the sequence (`prompt_cache`)."""
        total = time.perf_counter() - self.start
        prefill = self.prefill_seconds if self.prefill_seconds is not None else total
        gen = max(total - prefill, 1e-9)
        passes = len(self.tokens_per_pass)
        reuse = reuse or Reuse(0, "none")
        computed = self.prompt_tokens - reuse.kept
        return {
            "mode": self.mode,
            "tokens": list(self.tokens),
            "blocks": len(self.passes_per_block),
            "passes": passes,
            "passes_per_block": list(self.passes_per_block),
            "tokens_per_pass": list(self.tokens_per_pass),
            "mean_tokens_per_pass": sum(self.tokens_per_pass) / passes if passes else 0.0,
            "prompt_ms": prefill * 1e3,
            "prompt_kept_tokens": reuse.kept,  # held from the previous request, not run again
            "prompt_cache": reuse.how,  # "extended", "checkpoint" or "none" (a full prefill)
            "preview_ms": _mean_ms(self.preview_seconds),
            "commit_ms": _mean_ms(self.commit_seconds),
            "prompt_tokens_per_s": computed / prefill if prefill > 0 else 0.0,
            "generation_tokens_per_s": len(self.tokens) / gen,
            "total_ms": total * 1e3,
        }


def _mean_ms(seconds: list[float]) -> float | None:
    return sum(seconds) / len(seconds) * 1e3 if seconds else None


@dataclass
class _Outcome:
    finish_reason: str
    completion_tokens: int
    stats: dict[str, Any]


def appended(event: AnyEvent) -> tuple[int, ...]:
    """The response tokens an event makes final for good (a preview's are only tentative)."""
    if isinstance(event, TokenEvent):
        return (event.token,)
    if isinstance(event, BlockEvent | speculative.IterationEvent):
        return event.tokens
    return ()


def final_tokens(committed: Sequence[int], event: PassEvent, s: DecodingSettings) -> list[int]:
    """The response known for certain after a preview: the committed tokens plus the block's
    positions resolved left to right without a gap, inside the block's extent."""
    end, _ = policy.block_extent(event.tokens, s, s.max_new_tokens - len(committed))
    prefix = []
    for t in event.tokens[:end]:
        if t == s.mask_token_id:
            break
        prefix.append(t)
    return [*committed, *prefix]


def _without_stop(tokens: list[int], s: DecodingSettings) -> list[int]:
    return tokens[:-1] if tokens and tokens[-1] in s.stop_token_ids else tokens


def defaults_from_gguf(info: ModelInfo, eos_fallback: Sequence[int]) -> GenerationDefaults:
    """Decoding defaults from a GGUF's `clover-moe.diffusion.*` keys (docs/design.md).

    `read_info` gives each f32 as the shortest decimal it stands for (0.95, not 0.949999988), so
    thresholds compare as in the checkpoint's config.
    """
    keys = dict(info.diffusion)
    eos = keys.pop("eos_token_ids", None) or list(eos_fallback)
    return GenerationDefaults.from_dict({**keys, "eos_token_id": eos})


def default_mode(placement: Placement) -> Mode:
    """`ar` when the routed experts sit in system RAM, else `diffusion`.

    With the experts on the CPU a 32-row pass computes every expert its rows touch there, so a
    preview costs many AR steps even with a small coreset and block diffusion would need more
    tokens resolved per pass than a model gives (docs/performance.md, "Experts in system RAM").
    """
    return "ar" if placement.experts_on_cpu else "diffusion"


class Clover:
    """A Clover model ready for requests; the same methods and result shapes as `llama_cpp.Llama`.

    `Clover(path)` runs a GGUF through the patched llama.cpp. `from_checkpoint` runs a Hugging Face
    checkpoint directory on the numpy reference (exact but slow: for checking a conversion and for
    tests), and `from_backend` wraps any `backend.Backend` plus a tokenizer.
    """

    def __init__(
        self,
        model_path: str | Path,
        n_ctx: int = 4096,
        n_gpu_layers: int = 0,
        n_threads: int | None = None,
        verbose: bool = False,
        mode: Mode | None = None,
        coreset: bool | None = None,
        coreset_top_p: float | None = None,
        flash_attn: bool | FlashAttn | None = None,
        use_mmap: bool = True,
        use_mlock: bool = False,
        type_k: int | str | None = None,
        type_v: int | str | None = None,
        cpu_moe: bool = False,
        n_cpu_moe: int = 0,
        override_tensor: str | Sequence[str] = (),
        op_offload: bool = True,
        rpc_servers: str | Sequence[str] | None = None,
        on_memory: Callable[[MemoryEstimate], None] | None = None,
        **llama_args: Any,
    ):
        """llama-cpp-python's `Llama` arguments where they exist (`flash_attn`, `use_mmap`,
        `use_mlock`, `type_k`/`type_v`: a ggml type id or name such as "q8_0", `op_offload`), and
        llama.cpp's placement options (`cpu_moe`, `n_cpu_moe`, `override_tensor`: "PATTERN=BUFFER"
        entries; `flash_attn` also takes "on"/"off"/"auto"), and `rpc_servers` as `Llama`'s: "HOST:PORT"
        endpoints, comma-separated (or a sequence), of `clover rpc-server`s whose devices take layers
        before the local GPUs (`n_gpu_layers` of them in all); a server that does not answer, or is
        lost later, raises `RpcError` (a `ConnectionError`). Before loading, the memory the model
        needs per device is estimated (`self.memory`) and handed to `on_memory` (printed to stderr
        when `verbose`); a model that cannot fit raises `MemoryFitError` naming the options that
        would make it fit, instead of failing inside llama.cpp. `mode` None: `default_mode`.
        `llama_args`: llama-cpp-python's
        other constructor arguments (`LLAMA_ARGS_WITHOUT_EFFECT`), accepted so that code written
        for `Llama` runs unchanged; they change nothing here."""
        for name in set(llama_args) - LLAMA_ARGS_WITHOUT_EFFECT:
            raise TypeError(f"Clover() got an unexpected keyword argument {name!r}")
        limits.check_all({"n_ctx": n_ctx, "n_gpu_layers": n_gpu_layers, "n_threads": n_threads})
        limits.check_all({k: llama_args.get(k) for k in ("n_threads_batch", "n_batch")})
        limits.check("coreset_top_p", coreset_top_p)
        placement = Placement.from_llama_kwargs(
            flash_attn=flash_attn,
            type_k=type_k,
            type_v=type_v,
            use_mmap=use_mmap,
            use_mlock=use_mlock,
            cpu_moe=cpu_moe,
            n_cpu_moe=n_cpu_moe,
            override_tensor=(override_tensor,)
            if isinstance(override_tensor, str)
            else tuple(override_tensor),
            op_offload=op_offload,
            rpc_servers=rpc_servers,
        )
        mode = mode or default_mode(placement)
        header = read_header(model_path)  # read once: the metadata and the memory estimate
        info = read_info(model_path, header)
        if info.gdn_layers >= int(info.hyperparameters.get("block_count", 0)):
            raise ModelFileError(
                f"{model_path}: no full-attention layer (every layer is Gated DeltaNet); llama.cpp's "
                "hybrid memory needs one (a generated model needs --layers 4 or more)"
            )
        if mode == "diffusion" and not info.has_diffusion_tensors:
            raise ModelFileError(
                f"{model_path}: no block-diffusion tensors (an --ar-only or upstream file); "
                "use mode='ar' (--mode ar), or convert the checkpoint again without --ar-only"
            )
        limit = _context_limit(n_ctx)
        from llama_cpp import _logger

        from .llama.engine import LlamaEngine
        from .llama.tokenizer import GgufTokenizer

        _logger.set_verbose(verbose)
        speculative_mode = mode == "speculative"
        self.memory = memory.plan(
            model_path, placement, n_gpu_layers, limit, speculative_mode, shape=memory.ModelShape.of(header)
        )
        if on_memory is not None:
            on_memory(self.memory)
        elif verbose:
            print(self.memory.line(), file=sys.stderr)
        if not self.memory.fits:
            raise memory.MemoryFitError(memory.summary(self.memory, placement, n_gpu_layers))
        engine = LlamaEngine(
            model_path,
            n_ctx=limit,
            n_gpu_layers=n_gpu_layers,
            n_threads=n_threads,
            placement=placement,
            coreset=coreset,
            coreset_top_p=coreset_top_p,
            speculative=speculative_mode,
            log=verbose,  # llama.cpp's own stderr log: no Python log callback while verbose
        )
        tokenizer = GgufTokenizer(engine.model)
        defaults = defaults_from_gguf(info, tokenizer.end_of_generation_ids())
        mask = info.mask_token_id if info.mask_token_id is not None else -1
        self._attach(engine, tokenizer, defaults, mask, str(model_path), limit, mode)
        self.file_type = info.file_type

    @classmethod
    def from_backend(
        cls,
        backend: Backend,
        tokenizer: Tokenizer,
        defaults: GenerationDefaults,
        mask_token_id: int,
        model_name: str,
        n_ctx: int = 0,
        mode: Mode = "diffusion",
    ) -> Clover:
        """A `Clover` on any backend (tests, the reference); `n_ctx` 0 means the model's limit."""
        self = cls.__new__(cls)
        self._attach(backend, tokenizer, defaults, mask_token_id, model_name, _context_limit(n_ctx), mode)
        return self

    @classmethod
    def from_checkpoint(
        cls,
        path: str | Path,
        n_ctx: int = 0,
        mode: Mode = "diffusion",
        coreset: bool | None = None,
        coreset_top_p: float | None = None,
    ) -> Clover:
        """The numpy reference on a checkpoint directory: the oracle a GGUF's output is checked against."""
        from .reference.backend import NumpyBackend
        from .reference.model import ReferenceModel

        ck = CheckpointConfig.from_dir(path)
        overrides = from_request({"coreset": coreset, "coreset_top_p": coreset_top_p})
        model = ReferenceModel.from_checkpoint(path, **overrides)
        tokenizer = CloverTokenizer.from_dir(path)
        mask = ck.model.mask_token_id if ck.model.mask_token_id is not None else -1
        return cls.from_backend(NumpyBackend(model), tokenizer, ck.generation, mask, str(path), n_ctx, mode)

    def _attach(
        self,
        backend: Backend,
        tokenizer: Tokenizer,
        defaults: GenerationDefaults,
        mask_token_id: int,
        model_name: str,
        context_limit: int,
        mode: Mode,
    ) -> None:
        if mode not in MODES:
            raise ValueError(f"mode must be one of {', '.join(MODES)}, not {mode!r}")
        # the previews route as the backend was loaded (the model file's routing, or the loading
        # options'), unless a request says otherwise
        routing = backend.default_routing
        defaults = replace(defaults, coreset_enabled=routing.coreset, coreset_top_p=routing.top_p)
        self.backend, self.tokenizer, self.defaults = backend, tokenizer, defaults
        self.mask_token_id, self.model_path, self.context_limit, self.mode = (
            mask_token_id,
            model_name,
            context_limit,
            mode,
        )
        self.file_type = ""  # a GGUF's file type (Q4_K_M, ...); empty for other backends
        self.think_ids = (tokenizer.token_id(THINK_START), tokenizer.token_id(THINK_END))
        # draft controls of the speculative mode (draft length, refinements, threshold, adaptive);
        # assign a new `SpeculativeSettings` to change them; temperature and seed come per request
        self.draft = speculative.SpeculativeSettings()
        self._request = 0
        self._guard = Guard("this Clover")  # one call at a time; none after close()

    # -- lifecycle --------------------------------------------------------------------------------

    def close(self) -> None:
        """Free the model and context (the llama.cpp engine), after the call in progress.

        Idempotent; any later call raises `ClosedError` (a ValueError).
        """
        if self._guard.close():
            self.backend.close()

    def __enter__(self) -> Clover:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def n_ctx(self) -> int:
        """The context size in tokens (prompt and response), as `Llama.n_ctx()`."""
        return self.context_limit

    def n_vocab(self) -> int:
        return self.backend.vocab_size

    def token_eos(self) -> int:
        return self.defaults.eos_token_ids[0] if self.defaults.eos_token_ids else -1

    def token_bos(self) -> int:
        return -1  # Clover adds no BOS

    @serialized
    def reset(self) -> None:
        """Forget the sequence (the next request runs its whole prompt), as `Llama.reset`."""
        reset = getattr(self.backend, "reset", None)
        if reset is not None:
            reset()

    # -- tokens -----------------------------------------------------------------------------------

    @serialized
    def tokenize(self, text: bytes, add_bos: bool = False, special: bool = True) -> list[int]:
        """Like `Llama.tokenize`: Clover adds no BOS and always recognises special tokens."""
        return self.tokenizer.encode(text.decode("utf-8"))

    @serialized
    def detokenize(self, tokens: Sequence[int]) -> bytes:
        return self.tokenizer.decode(tokens).encode("utf-8")

    # -- decoding ---------------------------------------------------------------------------------

    def decoding_settings(
        self,
        n_prompt: int,
        max_tokens: int | None = None,
        **overrides: Any,
    ) -> DecodingSettings:
        """The policy's settings for a request: the model's defaults, then these overrides.

        `overrides` go by the decoding parameters' request names (`block_size`, `threshold`,
        `repeat_penalty`, `coreset`, ...: `decoding_parameters.BY_REQUEST_NAME`); None keeps the
        default.
        `max_tokens` None (or <= 0) means the model's default budget, cut to what fits the context.
        In AR mode blocks are one token wide, which is also what the length check then counts.
        """
        chosen = from_request(overrides)
        block = 1 if self.mode == "ar" else (chosen.pop("block_size", None) or self.defaults.block_size)
        if max_tokens is None or max_tokens <= 0:
            fits = (self.context_limit - n_prompt) // block * block
            max_tokens = min(self.defaults.max_new_tokens, fits) if fits > 0 else self.defaults.max_new_tokens
        return DecodingSettings.from_defaults(
            self.defaults,
            self.mask_token_id,
            **chosen,
            block_size=block,
            max_new_tokens=max_tokens,
            think_start_id=self.think_ids[0],
            think_end_id=self.think_ids[1],
            context_limit=self.context_limit,
        )

    def _text(self, ids: Sequence[int]) -> str:
        """Response text: control tokens (`<|im_end|>`, ...) vanish, as in llama-cpp-python."""
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    @serialized
    def generate(self, tokens: Sequence[int], s: DecodingSettings) -> Iterator[AnyEvent]:
        """The decode events of one request (like `Llama.generate`, which yields tokens).

        diffusion: a `PassEvent` per preview, a `BlockEvent` per commit; ar: a `TokenEvent` per
        token; speculative: an `IterationEvent` per verify-and-draft pass. All end with a `Result`.
        Every mode applies `s.sampler` with `s.seed`: diffusion and ar draw each row's token in the
        pass (one uniform per row), speculative by its acceptance rule over the distributions.
        """
        if self.mode == "ar":
            return self._guard.steps(ar_loop(self.backend, tokens, s))
        if self.mode == "speculative":
            if not self.backend.capabilities.speculative:
                raise ValueError("this backend cannot run the speculative mode (no verify_and_draft pass)")
            backend = cast(SpeculativeBackend, self.backend)
            return self._guard.steps(speculative.speculative_loop(backend, tokens, s, self.draft))
        return self._guard.steps(diffusion_loop(self.backend, tokens, s))

    def _run(
        self,
        prompt: list[int],
        s: DecodingSettings,
        stop: Sequence[str],
        reasoning: bool,
        on_event: EventCallback | None,
        checkpoint_at: int | None = None,
    ) -> Iterator[list[Delta] | _Outcome]:
        """Text deltas of one request as its tokens become final, then its `_Outcome`.

        `checkpoint_at`: where the prompt's reusable history ends (`LlamaEngine.prefill`)."""
        self._request += 1
        mine = self._request
        if hasattr(self.backend, "checkpoint_at"):
            self.backend.checkpoint_at = checkpoint_at
        trace, text = _Trace(self.mode, len(prompt)), TextStream(self._text, stop, reasoning)
        events = self.generate(prompt, s)
        committed: list[int] = []
        final: list[int] = []
        finish = "stop"
        try:
            for event in events:
                if self._request != mine:
                    raise RuntimeError(
                        "another request started on this Clover; finish or close a stream first"
                    )
                trace.add(event)
                if on_event is not None:
                    on_event(event)
                if isinstance(event, Result):
                    finish = event.finish_reason
                    break
                if isinstance(event, PassEvent):
                    final = final_tokens(committed, event, s)
                else:
                    committed += appended(event)
                    final = committed
                deltas = text.feed(_without_stop(final, s))
                if deltas:
                    yield deltas
                if text.stopped:
                    break
        finally:
            events.close()
        deltas = text.feed(_without_stop(final, s), final=True)
        if deltas:
            yield deltas
        reuse = getattr(self.backend, "reuse", None)
        stats = {**trace.stats(reuse), "sampling": _sampling_report(s)}
        yield _Outcome("stop" if text.stopped else finish, text.n_tokens, stats)

    def _prepare(
        self, prompt: list[int], max_tokens: int | None, sampling: Sampling, overrides: dict[str, Any]
    ) -> DecodingSettings:
        """Validate a request before any pass runs: option ranges, length.

        The request's routing travels with its settings to every preview it runs; the backend
        keeps only the model file's (`default_routing`), so nothing one request sets sticks."""
        limits.check_all({**asdict(sampling), **overrides, "max_tokens": max_tokens})
        s = self.decoding_settings(len(prompt), max_tokens, **overrides)
        policy.check_length(len(prompt), s)
        return replace(s, sampler=sampling.sampler(), seed=sampling.seed)

    @serialized
    def create_completion(
        self,
        prompt: str | list[int],
        max_tokens: int | None = None,
        temperature: float = 0.0,
        top_p: float = 1.0,
        top_k: int = 0,
        stop: str | list[str] | None = None,
        stream: bool = False,
        seed: int | None = None,
        model: str | None = None,
        *,
        min_p: float = 0.0,
        echo: bool = False,
        on_event: EventCallback | None = None,
        **settings: Any,
    ) -> dict[str, Any] | Iterator[dict[str, Any]]:
        """Complete a raw prompt (no chat template), like `Llama.create_completion`.

        Clover extras: the decoding parameters by their request names (`DECODING_OVERRIDES`:
        `block_size`, `threshold`, the penalties, the `stop_ramp_*` / `think_ramp_*` ramps, `coreset`
        / `coreset_top_p` for previews; the model's defaults when omitted), and `on_event`, called
        with every decode event.
        llama-cpp-python's other request arguments are accepted (`request_overrides`). Raises
        `RequestTooLong` (a ValueError) before any work when the request cannot fit, `OptionError`
        (a ValueError) for a value out of range.
        """
        if isinstance(prompt, list):
            check_token_ids(prompt, self.backend.vocab_size)
        ids = prompt if isinstance(prompt, list) else self.tokenizer.encode(prompt)
        sampling = Sampling(temperature, top_p, top_k, min_p, seed)
        overrides = request_overrides("create_completion", settings)
        s = self._prepare(ids, max_tokens, sampling, overrides)
        steps = self._run(ids, s, _stops(stop), False, on_event)
        head = {"id": f"cmpl-{uuid.uuid4()}", "object": "text_completion", "created": int(time.time())}
        head["model"] = model or self.model_path
        if stream:
            return self._completion_chunks(head, steps, len(ids))
        text, outcome = _collect(steps)
        if echo:
            text[CONTENT] = (prompt if isinstance(prompt, str) else self._text(ids)) + text[CONTENT]
        choice = {"text": text[CONTENT], "index": 0, "logprobs": None, "finish_reason": outcome.finish_reason}
        return {**head, "choices": [choice], **_usage(len(ids), outcome)}

    def _completion_chunks(
        self, head: dict[str, Any], steps: Iterator[list[Delta] | _Outcome], n_prompt: int
    ) -> Iterator[dict[str, Any]]:
        for step in steps:
            if isinstance(step, _Outcome):
                choice = {"text": "", "index": 0, "logprobs": None, "finish_reason": step.finish_reason}
                yield {**head, "choices": [choice], **_usage(n_prompt, step)}
                return
            for _, delta in step:
                yield {
                    **head,
                    "choices": [{"text": delta, "index": 0, "logprobs": None, "finish_reason": None}],
                }

    @serialized
    def create_chat_completion(
        self,
        messages: list[dict[str, Any]],
        temperature: float = 0.0,
        top_p: float = 1.0,
        top_k: int = 0,
        stream: bool = False,
        stop: str | list[str] | None = None,
        seed: int | None = None,
        max_tokens: int | None = None,
        model: str | None = None,
        *,
        min_p: float = 0.0,
        thinking: bool = False,
        on_event: EventCallback | None = None,
        **settings: Any,
    ) -> dict[str, Any] | Iterator[dict[str, Any]]:
        """Answer a conversation, like `Llama.create_chat_completion`, with the model's chat template.

        `thinking` is the template's `enable_thinking`; with it the text up to `</think>` goes to
        `message.reasoning_content` (`delta.reasoning_content` when streaming) and the rest to
        `content`. Off by default, so code reading only `content` gets the answer (a thinking
        answer that runs out of budget has an empty `content`). Other extras as in `create_completion`.
        """
        sampling = Sampling(temperature, top_p, top_k, min_p, seed)
        overrides = request_overrides("create_chat_completion", settings)
        ids = self.tokenizer.encode(self.tokenizer.render_chat(messages, enable_thinking=thinking))
        s = self._prepare(ids, max_tokens, sampling, overrides)
        reasoning = policy.thinking(ids, [], s)
        history = self._history_length(ids, messages, thinking)
        steps = self._run(ids, s, _stops(stop), reasoning, on_event, history)
        head = {"id": f"chatcmpl-{uuid.uuid4()}", "object": "chat.completion", "created": int(time.time())}
        head["model"] = model or self.model_path
        if stream:
            return self._chat_chunks({**head, "object": "chat.completion.chunk"}, steps, len(ids))
        text, outcome = _collect(steps)
        message: dict[str, Any] = {"role": "assistant", "content": text[CONTENT]}
        if reasoning:
            message[REASONING] = text[REASONING]
        choice = {"index": 0, "message": message, "logprobs": None, "finish_reason": outcome.finish_reason}
        return {**head, "choices": [choice], **_usage(len(ids), outcome)}

    def _history_length(self, ids: list[int], messages: list[dict[str, Any]], thinking: bool) -> int | None:
        """How many of a chat prompt's tokens are its messages, before the template's generation
        prompt: what the next turn's prompt repeats (None when the template does not split so)."""
        if not hasattr(self.backend, "checkpoint_at"):
            return None
        text = self.tokenizer.render_chat(messages, enable_thinking=thinking, add_generation_prompt=False)
        history = self.tokenizer.encode(text)
        return len(history) if ids[: len(history)] == history else None

    def _chat_chunks(
        self, head: dict[str, Any], steps: Iterator[list[Delta] | _Outcome], n_prompt: int
    ) -> Iterator[dict[str, Any]]:
        def chunk(delta: dict[str, str], finish: str | None = None) -> dict[str, Any]:
            return {
                **head,
                "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}],
            }

        yield chunk({"role": "assistant"})
        for step in steps:
            if isinstance(step, _Outcome):
                yield {**chunk({}, step.finish_reason), **_usage(n_prompt, step)}
                return
            for name, delta in step:
                yield chunk({name: delta})

    __call__ = create_completion


def _context_limit(n_ctx: int) -> int:
    if n_ctx > CONTEXT_LIMIT:
        raise ValueError(
            f"n_ctx {n_ctx} exceeds the model's limit of {CONTEXT_LIMIT} tokens (prompt and response)"
        )
    return n_ctx if n_ctx > 0 else CONTEXT_LIMIT


@dataclass(frozen=True)
class Sampling:
    """A request's sampling arguments, as llama-cpp-python takes them."""

    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    seed: int | None = None

    def __post_init__(self) -> None:
        if self.seed is not None and self.seed < 0:  # -1: a random seed, as in llama.cpp
            object.__setattr__(self, "seed", None)

    def sampler(self) -> Sampler:
        """The decoding policy's sampler (every mode applies all four, `backend.Sampler`)."""
        return Sampler(self.temperature, self.top_k, self.top_p, self.min_p)


def _sampling_report(s: DecodingSettings) -> str:
    """`clover.sampling`: what decoded the request, "greedy" or the sampler in effect and its seed."""
    seeded = "" if s.sampler.greedy or s.seed is None else f", seed {s.seed}"
    return f"{s.sampler}{seeded}"


# llama-cpp-python's constructor arguments that mean nothing for Clover: accepted, no effect
LLAMA_ARGS_WITHOUT_EFFECT = frozenset(
    "split_mode main_gpu tensor_split vocab_only kv_overrides seed n_batch n_ubatch n_threads_batch "
    "rope_scaling_type pooling_type rope_freq_base rope_freq_scale yarn_ext_factor yarn_attn_factor "
    "yarn_beta_fast yarn_beta_slow yarn_orig_ctx logits_all embedding offload_kqv swa_full no_perf "
    "last_n_tokens_size lora_base lora_scale lora_path numa chat_format chat_handler draft_model "
    "tokenizer spm_infill".split()
)
# the decoding overrides a request may carry (`Clover.decoding_settings`): the table's request
# names, but `max_tokens`, an argument of its own as in llama-cpp-python
DECODING_OVERRIDES = tuple(name for name in BY_REQUEST_NAME if name != "max_tokens")
# llama-cpp-python's request arguments without effect here (sampler variants the graph has not)
REQUEST_ARGS_WITHOUT_EFFECT = frozenset(
    "typical_p tfs_z mirostat_tau mirostat_eta top_logprobs tool_choice function_call".split()
)
# ... and those that would change the answer in a way Clover cannot: refused when set
REQUEST_ARGS_REFUSED = {
    "suffix": "suffix (fill-in-the-middle) is not supported: the model has no infill tokens",
    "logprobs": "logprobs are not available: each pass returns only the picked token and its probability",
    "grammar": "grammars are not supported: the graph picks each position's argmax, unconstrained",
    "logit_bias": "logit_bias is not supported yet; the model's penalties and ramps are its controls",
    "mirostat_mode": "mirostat sampling is not supported",
    "tools": "tools are not supported yet (no tool-call parsing)",
    "functions": "functions are not supported yet (no tool-call parsing)",
    "stopping_criteria": "stopping_criteria is not supported; use stop strings",
    "logits_processor": "logits_processor is not supported: the logits stay on the device",
}


def refusal(name: str, value: Any) -> str | None:
    """Why a request argument that Clover cannot honour is refused (`REQUEST_ARGS_REFUSED`), or None:
    another name, or the value that asks for nothing (None, False, 0, empty)."""
    if name in REQUEST_ARGS_REFUSED and value not in (None, False, 0, "", [], {}):
        return REQUEST_ARGS_REFUSED[name]
    return None


def request_overrides(method: str, settings: dict[str, Any]) -> dict[str, Any]:
    """Clover's decoding overrides among a request's extra keywords; llama-cpp-python's other request
    arguments pass where they change nothing and are refused, with the reason, where they would."""
    overrides = {}
    for name, value in settings.items():
        if name in DECODING_OVERRIDES:
            overrides[name] = value
        elif name == "response_format":
            kind = (value or {}).get("type", "text") if isinstance(value, dict) else value
            if kind != "text":
                raise ValueError(
                    f"response_format {kind!r} needs grammar-constrained sampling, which Clover's decoding "
                    "has not (the graph picks each position's argmax); ask for JSON in the prompt instead"
                )
        elif name in REQUEST_ARGS_REFUSED:
            why = refusal(name, value)
            if why:
                raise ValueError(why)
        elif name not in REQUEST_ARGS_WITHOUT_EFFECT:
            raise TypeError(f"{method}() got an unexpected keyword argument {name!r}")
    return overrides


def check_token_ids(ids: Sequence[int], vocab_size: int) -> None:
    """A prompt given as token ids holds tokens of the vocabulary (llama.cpp fails the pass on any
    other), checked before any work."""
    if not all(isinstance(t, int | np.integer) and 0 <= t < vocab_size for t in ids):
        raise ValueError(f"prompt: token ids must lie in [0, {vocab_size})")


def _stops(stop: str | list[str] | None) -> list[str]:
    return [stop] if isinstance(stop, str) else list(stop or [])


def _collect(steps: Iterator[list[Delta] | _Outcome]) -> tuple[dict[str, str], _Outcome]:
    text = {CONTENT: "", REASONING: ""}
    for step in steps:
        if isinstance(step, _Outcome):
            return text, step
        for name, delta in step:
            text[name] += delta
    raise AssertionError("a request ended without an outcome")


def _usage(n_prompt: int, outcome: _Outcome) -> dict[str, Any]:
    usage = {
        "prompt_tokens": n_prompt,
        "completion_tokens": outcome.completion_tokens,
        "total_tokens": n_prompt + outcome.completion_tokens,
    }
    return {"usage": usage, "clover": outcome.stats}
