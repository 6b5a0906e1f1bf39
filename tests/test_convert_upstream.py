"""Parity with upstream llama.cpp: on the same weights, our trunk is upstream's `qwen35moe` file.

Runs the pinned tree's `convert_hf_to_gguf.py` on the Qwen3.5-MoE twin of a generated checkpoint
(needs torch + transformers, and the pinned sdist in the cache or PyPI reachable).
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import numpy as np
import pytest
from clover_convert.pipeline import Options, convert, prepare
from clover_convert.upstream import as_qwen35moe, convert_command
from clover_patches.source import SourceError
from gguf import GGUFReader

from clover_local.model import gguf_names as gn
from clover_local.model.tensors import DIFFUSION_GGUF

pytestmark = pytest.mark.reference
# upstream detects the pre-tokenizer by hashing a test string; this generated vocabulary hashes as
# plain Qwen2, while Clover files name the Qwen3.5 pre-tokenizer (same regex in llama.cpp)
EXPECTED_VALUE_DIFFERENCES = {"general.name", "general.architecture", "tokenizer.ggml.pre"}


def test_trunk_equals_upstream_qwen35moe(checkpoint_factory, tmp_path: Path) -> None:
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    ckpt = checkpoint_factory("tiny-qwen-vocab")
    twin = as_qwen35moe(ckpt, tmp_path / "twin")
    try:
        cmd = convert_command(twin, tmp_path / "upstream.gguf", "bf16")
    except SourceError as e:
        pytest.skip(f"pinned llama.cpp source unavailable: {e}")
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    prep = prepare(Options(str(ckpt), outfile=tmp_path / "ours.gguf", threads=2))
    ours_path = convert(prep, threads=2).shards[0]
    up, ours = GGUFReader(tmp_path / "upstream.gguf"), GGUFReader(ours_path)

    up_t, ours_t = {t.name: t for t in up.tensors}, {t.name: t for t in ours.tensors}
    assert sorted(up_t) == sorted(n for n in ours_t if not n.endswith(DIFFUSION_GGUF))
    for name, t in up_t.items():
        o = ours_t[name]
        assert (o.tensor_type, list(o.shape)) == (t.tensor_type, list(t.shape)), name
        if name.endswith(".ssm_a"):  # -exp in torch vs numpy: last-ulp differences
            np.testing.assert_allclose(o.data, t.data, rtol=1e-6, err_msg=name)
        else:
            assert np.array_equal(o.data.view(np.uint8), t.data.view(np.uint8)), name

    def keys(r: GGUFReader, arch: str) -> dict[str, object]:
        return {k.replace(f"{arch}.", "ARCH."): f for k, f in r.fields.items() if not k.startswith("GGUF.")}

    up_k, ours_k = keys(up, "qwen35moe"), keys(ours, gn.ARCH)
    assert sorted(up_k) == sorted(k for k in ours_k if ".diffusion." not in k)
    for k, f in up_k.items():
        assert f.types == ours_k[k].types, k
        if k not in EXPECTED_VALUE_DIFFERENCES:
            assert f.contents() == ours_k[k].contents(), k
