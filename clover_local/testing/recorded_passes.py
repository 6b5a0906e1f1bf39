"""The tiny preset's real block-diffusion passes on a CPU engine, for host checks of CUDA graph code.

bench/device's checks without a GPU (fusion_on_cpu, streams_on_cpu) hand llama's eval callback to a
library of their own, which sees the pass's graph node by node; the CUDA backend sees the same node
list (a fully offloaded model's graph is one split).
"""

from __future__ import annotations

import ctypes
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np

from clover_local.backend import LogitAdjustment, RowAdjustments
from clover_local.llama.engine import LlamaEngine
from clover_local.testing.bad_inputs import prepare_bases

BLOCK = 32


def recorded_passes(lib: ctypes.CDLL, prefix: str) -> Iterator[str]:
    """The tiny checkpoint's F32 GGUF on a CPU engine whose eval callback is `lib`'s `<prefix>_eval(tensor
    address, ask)`: after a 48-token prompt, its preview (coreset on) and fused pass of one block each, each
    recorded from `<prefix>_reset()` on, announced as `-- <name>` and yielded by name to be checked."""
    record = getattr(lib, f"{prefix}_eval")
    record.argtypes, record.restype = [ctypes.c_void_p, ctypes.c_bool], ctypes.c_bool
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
            passes: list[tuple[str, Callable[[], object]]] = [
                ("preview", lambda: eng.preview(block, adj, eng.default_routing)),
                ("fused", lambda: eng.verify_and_draft(tokens, RowAdjustments.constant(adj, BLOCK), block)),
            ]
            for name, run in passes:
                getattr(lib, f"{prefix}_reset")()
                run()
                print(f"-- {name}", flush=True)
                yield name
        finally:
            eng.close()
