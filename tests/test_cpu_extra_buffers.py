"""CPU matmuls on repacked weights (ggml-cpu's extra buffer types: AMX, CPU_REPACK) give the logits of
plain weight buffers.

The pinned tree's AMX kernel added a 32-row block's products onto stale output memory when a weight
had one K block (32 input columns for Q4_0/Q4_1/Q8_0): the tiny preset's shared-expert down
projection, in every pass of 32 rows or more (patch 0201); built with GCC 12 it faulted in
`ldtilecfg` on every pass of 2 rows or more, its tile config half unwritten (patch 0202). These
tests run where some extra buffer type takes weights (AMX_INT8 CPUs; CPU_REPACK on AVX2 / NEON /
...), and skip elsewhere.
"""

from __future__ import annotations

import re

import numpy as np
import pytest
from clover_convert.pipeline import Options, convert, prepare

from clover_local.llama import unavailable
from clover_local.model.config import CheckpointConfig

SKIP = unavailable()
pytestmark = [pytest.mark.llama, pytest.mark.skipif(SKIP is not None, reason=SKIP or "")]
EXTRA_BUFFER = re.compile(r"(AMX|CPU_REPACK) model buffer size")


@pytest.fixture(scope="module", params=["q8_0", "q4_k_m"])
def quantized(request, checkpoint_factory, tmp_path_factory):
    ckpt = checkpoint_factory("tiny")
    out = tmp_path_factory.mktemp("extra-bufts") / f"tiny-{request.param}.gguf"
    opts = Options(str(ckpt), outfile=out, outtype=request.param, threads=1)
    return ckpt, convert(prepare(opts), threads=1).shards[0]


def passes(path, extra: bool, prompt: list[int], block: list[int]) -> tuple[np.ndarray, np.ndarray]:
    from clover_local.llama.engine import LlamaEngine

    with LlamaEngine(path, n_ctx=256, n_threads=2, f32_cache=True, log=True, extra_buffer_types=extra) as eng:
        return eng.causal_logits(prompt), eng.preview_logits(block)


def test_repacked_weights_give_the_plain_buffers_logits(quantized, capfd):
    """A 48-row causal pass (a full 32-row chunk and a partial one) and a 32-row preview."""
    ckpt, path = quantized
    mask = CheckpointConfig.from_dir(ckpt).model.mask_token_id
    rng = np.random.default_rng(3)
    prompt = [int(t) for t in rng.integers(0, 400, 48)]
    block = [mask if i % 2 else int(t) for i, t in enumerate(rng.integers(0, 400, 32))]
    capfd.readouterr()
    repacked = passes(path, True, prompt, block)
    used = EXTRA_BUFFER.findall(capfd.readouterr().err)
    if not used:
        pytest.skip("no extra buffer type takes this file's weights on this CPU")
    plain = passes(path, False, prompt, block)
    assert not EXTRA_BUFFER.search(capfd.readouterr().err)
    for got, want in zip(repacked, plain, strict=True):
        # the same quantized products summed in another order: float32 rounding apart, except where
        # that rounding moves an activation across a Q8 quantization step (seen: one row of 48 on an
        # AMX VM, from a 5e-7 input difference); 0201's stale-dst bug broke most rows
        close = np.abs(got - want).max(axis=1) <= 1e-3 * np.abs(want).max()
        assert close.mean() >= 0.9, f"{(~close).sum()} of {len(close)} rows differ"
        assert (got.argmax(axis=1) == want.argmax(axis=1)).mean() >= 0.9
