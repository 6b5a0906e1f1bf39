"""Seeded mutation fuzzing of GGUF headers/metadata and safetensors headers (issue 14).

Each mutant goes through the real CLI (`clover generate`, `clover-convert`) in a forked, time- and
memory-limited child; it must end with exit 0, or exit 1 and one `error:` line: no traceback,
abort or hang. A converted safetensors mutant must also be one the `safetensors` library accepts.
The campaign runs in a fresh interpreter (`python -m clover_local.testing.bad_inputs fuzz N SEED`):
forking a process that has already run llama.cpp's thread pool would deadlock the children.
CI runs a few mutants of each kind; `CLOVER_FUZZ_CASES=2000 CLOVER_FUZZ_SEED=7` runs a longer one.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from clover_local.testing import bad_inputs as bi

CASES = int(os.environ.get("CLOVER_FUZZ_CASES", "12"))
SEED = int(os.environ.get("CLOVER_FUZZ_SEED", "0"))


@pytest.mark.llama
def test_fuzz_gguf_and_safetensors() -> None:
    cmd = [sys.executable, "-m", "clover_local.testing.bad_inputs", "fuzz", str(CASES), str(SEED)]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=300 + 20 * CASES)
    counts = {
        k: v for line in res.stdout.splitlines() if line.startswith("{") for k, v in json.loads(line).items()
    }
    assert res.returncode == 0 and set(counts) == {"gguf", "safetensors"}, res.stdout + res.stderr
    for kind, c in counts.items():
        assert (c["tried"], c["clean"]) == (CASES, CASES), f"{kind}: {res.stdout}"
    assert counts["safetensors"]["of which refused"] > 0  # the mutants do reach the checks


def test_mutations_are_seeded(tiny_checkpoint: Path) -> None:
    header = bi.raw_header(bi.shards(tiny_checkpoint)[0])[0]
    runs = [bi.mutate_safetensors_header(header, np.random.default_rng(3)) for _ in range(2)]
    assert runs[0] == runs[1] != header
