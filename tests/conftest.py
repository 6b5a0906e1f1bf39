"""Shared fixtures: generated Clover checkpoints, cached once per test session."""

from __future__ import annotations

from pathlib import Path

import pytest

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
