"""CPU matmuls on repacked weights (ggml-cpu's extra buffer types: AMX, CPU_REPACK) give the logits of
plain weight buffers.

The pinned tree's AMX kernel added a 32-row block's products onto stale output memory when a weight
had one K block (32 input columns for Q4_0/Q4_1/Q8_0): the tiny preset's shared-expert down
projection, in every pass of 32 rows or more (patch 0201). These tests run where some extra buffer
type takes weights (AMX_INT8 CPUs; CPU_REPACK on AVX2 / NEON / ...), and skip elsewhere.
"""

from __future__ import annotations

import re
import subprocess
import sys

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


def faults_when_repacked(path) -> int:
    """The signal that kills an 8-row pass with extra buffer types forced on, in a subprocess (0: none).

    The pinned tree's AMX kernels fault in `ldtilecfg` on some virtual machines; the engine keeps
    them off there by default (`default_extra_buffer_types`), and this suite must not die with them.
    """
    code = (
        "import sys; from clover_local.llama.engine import LlamaEngine\n"
        "with LlamaEngine(sys.argv[1], n_ctx=64, n_threads=2, extra_buffer_types=True) as e:\n"
        "    e.causal_logits(list(range(1, 9)))\n"
    )
    rc = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True).returncode
    return -rc if rc < 0 else 0


def test_repacked_weights_give_the_plain_buffers_logits(quantized, capfd):
    """A 48-row causal pass (a full 32-row chunk and a partial one) and a 32-row preview."""
    ckpt, path = quantized
    if sig := faults_when_repacked(path):
        pytest.skip(f"ggml-cpu's extra buffer types crash on this CPU (signal {sig}): off by default here")
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
        # the same quantized products summed in another order: float32 rounding apart
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-3 * np.abs(want).max())


def test_amx_cpus_keep_weights_in_plain_buffers_by_default(quantized, capfd):
    """The engine's default (`extra_buffer_types=None`) uses no AMX buffer where the CPU has AMX."""
    from llama_cpp import llama_cpp as ll

    from clover_local.llama.engine import LlamaEngine

    if "AMX_INT8 = 1" not in ll.llama_print_system_info().decode():
        pytest.skip("no AMX on this CPU")
    _, path = quantized
    capfd.readouterr()
    with LlamaEngine(path, n_ctx=64, n_threads=2, log=True) as eng:
        eng.causal_logits(list(range(1, 9)))
    assert "AMX model buffer size" not in capfd.readouterr().err
