"""The tiny preset's real block-diffusion passes on a CPU engine, for host checks of CUDA graph code.

bench/device's checks without a GPU (fusion_on_cpu, streams_on_cpu) hand llama's eval callback to a
library of their own, which sees the pass's graph node by node; the CUDA backend sees the same node
list (a fully offloaded model's graph is one split).
"""

from __future__ import annotations

import ctypes
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from clover_local.backend import LogitAdjustment, RowAdjustments
from clover_local.llama.engine import LlamaEngine
from clover_local.testing.bad_inputs import prepare_bases

BLOCK = 32


@contextmanager
def tiny_passes(
    record: Callable[[int, bool], bool],
) -> Iterator[list[tuple[str, Callable[[], object]]]]:
    """A CPU engine on the tiny checkpoint's F32 GGUF whose eval callback is `record(tensor address, ask)`,
    after a 48-token prompt: its preview (coreset on) and fused pass of one block each, as (name, run)."""
    with tempfile.TemporaryDirectory() as tmp:
        _, gguf = prepare_bases(Path(tmp))
        callback = lambda t, ask: record(ctypes.addressof(t.contents), ask)  # noqa: E731
        eng = LlamaEngine(gguf, n_ctx=512, speculative=True, eval_callback=callback)
        try:
            rng = np.random.default_rng(0)
            adj = LogitAdjustment.identity(eng.vocab_size)
            ids = rng.integers(0, 256, BLOCK)
            block = [eng.mask_token_id if i % 2 else int(t) for i, t in enumerate(ids)]
            tokens = [int(t) for t in rng.integers(0, 256, BLOCK)]
            eng.prefill([int(t) for t in rng.integers(0, 256, 48)], adj)
            yield [
                ("preview", lambda: eng.preview(block, adj, eng.default_routing)),
                ("fused", lambda: eng.verify_and_draft(tokens, RowAdjustments.constant(adj, BLOCK), block)),
            ]
        finally:
            eng.close()
