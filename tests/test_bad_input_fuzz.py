"""Seeded mutation fuzzing of GGUF headers/metadata and safetensors headers (issue 14).

Each mutant goes through the real CLI (`clover generate`, `clover-convert`) in a forked, time- and
memory-limited child; it must end with exit 0, or exit 1 and one `error:` line: no traceback,
abort or hang. A converted safetensors mutant must also be one the `safetensors` library accepts.
CI runs a few mutants of each; `CLOVER_FUZZ_CASES=2000 CLOVER_FUZZ_SEED=7 pytest
tests/test_bad_input_fuzz.py` runs a longer campaign (`python -m clover_local.testing.bad_inputs
fuzz N SEED` prints its counts).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from clover_local.testing import bad_inputs as bi

CASES = int(os.environ.get("CLOVER_FUZZ_CASES", "12"))
SEED = int(os.environ.get("CLOVER_FUZZ_SEED", "0"))


@pytest.fixture(scope="module")
def bases(tmp_path_factory) -> tuple[Path, Path]:
    return bi.prepare_bases(tmp_path_factory.mktemp("fuzz-base"))


def _failures(tally: bi.Tally) -> list[str]:
    return [f"{o.case}: {o.verdict}: {o.detail}" for o in tally.outcomes if not o.clean]


@pytest.mark.llama
def test_fuzz_gguf(bases: tuple[Path, Path], tmp_path: Path) -> None:
    tally = bi.fuzz_gguf(bases[1], tmp_path, CASES, SEED)
    assert tally.counts()["tried"] == CASES
    assert _failures(tally) == []


def test_fuzz_safetensors(bases: tuple[Path, Path], tmp_path: Path) -> None:
    tally = bi.fuzz_safetensors(bases[0], tmp_path, CASES, SEED)
    assert _failures(tally) == []
    assert any(o.returncode == 1 for o in tally.outcomes)  # the mutants do reach the checks


def test_mutations_are_seeded(bases: tuple[Path, Path]) -> None:
    import numpy as np

    header = bi.raw_header(bi.shards(bases[0])[0])[0]
    runs = [bi.mutate_safetensors_header(header, np.random.default_rng(3)) for _ in range(2)]
    assert runs[0] == runs[1] != header
