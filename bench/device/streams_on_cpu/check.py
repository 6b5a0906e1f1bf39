"""Experiment 0115's stream plan on the tiny preset's real passes, without a GPU (check.sh).

    python check.py LIBRARY

LIBRARY is streams_plan.cpp built by check.sh. A CPU engine on the tiny checkpoint's F32 GGUF records a
preview (coreset on) and a fused pass node by node through llama's eval callback (the CUDA backend sees the
same node list: a fully offloaded model's graph is one split); the library plans each as ggml-cuda would and
checks the plan. Every layer must give two regions: its attention or GDN input projections and its MoE
block. Exit 1: a check failed or a region is missing.
"""

from __future__ import annotations

import ctypes
import sys
import tempfile
from pathlib import Path

import numpy as np

from clover_local.backend import LogitAdjustment, RowAdjustments
from clover_local.llama.engine import LlamaEngine
from clover_local.testing.bad_inputs import prepare_bases

BLOCK = 32
LAYERS = 4  # the tiny preset


def main(library: str) -> int:
    lib = ctypes.CDLL(library)
    lib.sp_eval.argtypes, lib.sp_eval.restype = [ctypes.c_void_p, ctypes.c_bool], ctypes.c_bool
    with tempfile.TemporaryDirectory() as tmp:
        _, gguf = prepare_bases(Path(tmp))  # the tiny checkpoint's F32 GGUF
        record = lambda t, ask: lib.sp_eval(ctypes.addressof(t.contents), ask)  # noqa: E731
        eng = LlamaEngine(gguf, n_ctx=512, speculative=True, eval_callback=record)
        rng = np.random.default_rng(0)
        adj = LogitAdjustment.identity(eng.vocab_size)
        block = [eng.mask_token_id if i % 2 else int(t) for i, t in enumerate(rng.integers(0, 256, BLOCK))]
        tokens = [int(t) for t in rng.integers(0, 256, BLOCK)]
        eng.prefill([int(t) for t in rng.integers(0, 256, 48)], adj)
        rc = 0
        for name, run in (
            ("preview", lambda: eng.preview(block, adj, eng.default_routing)),
            ("fused", lambda: eng.verify_and_draft(tokens, RowAdjustments.constant(adj, BLOCK), block)),
        ):
            lib.sp_reset()
            run()
            print(f"-- {name}", flush=True)
            regions = lib.sp_check()
            if regions != 2 * LAYERS:
                print(f"FAIL {name}: {regions} (want {2 * LAYERS} regions; negative: failed checks)")
                rc = 1
        eng.close()
    return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
