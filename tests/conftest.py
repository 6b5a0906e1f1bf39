"""Shared fixtures: generated Clover checkpoints, cached once per test session."""

from __future__ import annotations

from pathlib import Path

import pytest
from clover_convert.pipeline import Options, convert, prepare

from clover_local.testing.make_checkpoint import write_checkpoint


@pytest.fixture(scope="session")
def checkpoint_factory(tmp_path_factory):
    """`make(preset, seed=0)` -> path of a generated checkpoint, generated once per session."""
    cache: dict[tuple[str, int], Path] = {}

    def make(preset: str = "tiny", seed: int = 0) -> Path:
        key = (preset, seed)
        if key not in cache:
            out = tmp_path_factory.mktemp(f"ckpt-{preset}-{seed}")
            cache[key] = write_checkpoint(out, preset, seed=seed)
        return cache[key]

    return make


@pytest.fixture(scope="session")
def tiny_checkpoint(checkpoint_factory) -> Path:
    return checkpoint_factory("tiny")


@pytest.fixture(scope="session")
def gguf_factory(checkpoint_factory, tmp_path_factory):
    """`make(preset, ar_only=False)` -> (checkpoint dir, F32 GGUF path), converted once per session."""
    cache: dict[tuple[str, bool], tuple[Path, Path]] = {}

    def make(preset: str = "tiny", ar_only: bool = False) -> tuple[Path, Path]:
        if (preset, ar_only) not in cache:
            ckpt = checkpoint_factory(preset)
            out = tmp_path_factory.mktemp(f"gguf-{preset}") / f"{preset}{'-ar' if ar_only else ''}.gguf"
            prep = prepare(Options(str(ckpt), outfile=out, outtype="f32", ar_only=ar_only, threads=1))
            cache[preset, ar_only] = ckpt, convert(prep, threads=1).shards[0]
        return cache[preset, ar_only]

    return make


@pytest.fixture(scope="session")
def llama_gguf(gguf_factory) -> Path:
    """The tiny checkpoint's F32 GGUF, when the patched llama.cpp can run it (else the test skips)."""
    from clover_local import llama as llama_runtime

    missing = llama_runtime.unavailable()
    if missing is not None:
        pytest.skip(missing)
    return gguf_factory("tiny")[1]
