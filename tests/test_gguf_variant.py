"""bench/device/gguf_variant.py: the layer-count and baseline variants the H200 timings run."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from gguf import GGUFReader

from clover_local import llama

SCRIPT = Path(__file__).resolve().parents[1] / "bench" / "device" / "gguf_variant.py"


def _variant(src: Path, dst: Path, *args: str) -> GGUFReader:
    res = subprocess.run(
        [sys.executable, str(SCRIPT), str(src), str(dst), *args], capture_output=True, text=True
    )
    assert res.returncode == 0, res.stderr
    return GGUFReader(dst)


def _field(r: GGUFReader, name: str):
    return r.fields[name].contents()


def test_more_layers_repeat_the_file_s_layers(gguf_factory, tmp_path: Path) -> None:
    _, src = gguf_factory("tiny")
    r = GGUFReader(src)
    n = _field(r, "clover-moe.block_count")
    out = _variant(src, tmp_path / "x3.gguf", "--layers", str(3 * n))
    assert _field(out, "clover-moe.block_count") == 3 * n
    src_t = {t.name: t for t in r.tensors}
    names = [t.name for t in out.tensors]
    assert (
        len(names)
        == len(set(names))
        == len(r.tensors) + 2 * sum(t.name.startswith("blk.") for t in r.tensors)
    )
    for t in out.tensors:
        if t.name.startswith("blk."):
            i, rest = t.name[4:].split(".", 1)
            same = src_t[f"blk.{int(i) % n}.{rest}"]
        else:
            same = src_t[t.name]
        assert t.tensor_type == same.tensor_type and np.array_equal(t.data, same.data), t.name
    for name, field in r.fields.items():  # per-layer arrays (the layer pattern) repeat too
        value = field.contents()
        if isinstance(value, list) and len(value) == n and "dimension_sections" not in name:
            assert _field(out, name) == value * 3, name
    fewer = _variant(src, tmp_path / "x1.gguf", "--layers", "1")
    assert {t.name.split(".")[1] for t in fewer.tensors if t.name.startswith("blk.")} == {"0"}


@pytest.mark.skipif(llama.unavailable() is not None, reason=llama.unavailable() or "")
def test_a_repeated_variant_and_its_baseline_twin_load_and_run(gguf_factory, tmp_path: Path) -> None:
    import llama_cpp as ll

    from clover_local.backend import LogitAdjustment
    from clover_local.llama.engine import LlamaEngine

    _, src = gguf_factory("tiny")
    bigger = tmp_path / "x2.gguf"
    _variant(src, bigger, "--layers", "8")
    twin = _variant(src, tmp_path / "twin.gguf", "--layers", "8", "--arch", "qwen35moe")
    assert _field(twin, "general.architecture") == "qwen35moe"
    assert not [t.name for t in twin.tensors if ".ssm_bd_" in t.name or ".ssm_conv1d_right" in t.name]
    assert not [k for k in twin.fields if ".diffusion." in k]
    with LlamaEngine(str(bigger), n_ctx=256, n_threads=2) as eng:
        assert ll.llama_model_n_layer(eng.model) == 8
        identity = LogitAdjustment.identity(eng.vocab_size)
        token, _ = eng.prefill([1, 2, 3], identity)
        assert 0 <= eng.commit([token], identity)[0] < eng.vocab_size
    model = ll.llama_model_load_from_file(
        str(tmp_path / "twin.gguf").encode(), ll.llama_model_default_params()
    )
    assert model, "upstream's loader refused the qwen35moe twin"
    try:
        assert ll.llama_model_n_layer(model) == 8
    finally:
        ll.llama_model_free(model)
