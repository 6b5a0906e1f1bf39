"""Plain llama.cpp decoding on an engine's model and context: the baseline of `clover bench`.

What a llama.cpp user runs on the same file with the same library: `llama_decode` of one token,
then llama.cpp's greedy sampler over the full logits, in a Python loop (as llama-cpp-python's
`Llama.generate`). No clover head, no adjustment, no Clover C API.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from llama_cpp import llama_cpp as ll

from .engine import LlamaEngine


def greedy_decode(engine: LlamaEngine, prompt: Sequence[int], n_tokens: int) -> tuple[list[int], float]:
    """`n_tokens` greedy tokens after a prefill of `prompt` and their tokens per second (the prefill
    is not timed, as in `loops.Result.tokens_per_second`). Leaves the engine's sequence reset."""
    engine.reset()
    sampler = ll.llama_sampler_init_greedy()
    out: list[int] = []
    try:
        for start in range(0, len(prompt), engine.n_batch):
            chunk = list(prompt[start : start + engine.n_batch])
            tokens = (ll.llama_token * len(chunk))(*chunk)
            if ll.llama_decode(engine.ctx, ll.llama_batch_get_one(tokens, len(chunk))) != 0:
                raise RuntimeError("llama_decode failed on the prompt")
        token = (ll.llama_token * 1)()
        t0 = time.perf_counter()
        for _ in range(n_tokens):
            token[0] = ll.llama_sampler_sample(sampler, engine.ctx, -1)
            out.append(token[0])
            if ll.llama_decode(engine.ctx, ll.llama_batch_get_one(token, 1)) != 0:
                raise RuntimeError("llama_decode failed")
        seconds = time.perf_counter() - t0
    finally:
        ll.llama_sampler_free(sampler)
        engine.reset()
    return out, n_tokens / seconds
