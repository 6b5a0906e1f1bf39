"""Patch 0114's CUDA fusions without a GPU: `bench/device/fusion_on_cpu/check.sh` cuts each kernel and
matcher out of the patched clover-fusion.cu and runs them on host threads against ggml's CPU backend,
on test-backend-ops' graphs and on the tiny preset's real preview and fused pass with every tensor where
the allocator put it. CI has no GPU, so this is the only place CI runs that code."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CHECK = ROOT / "bench" / "device" / "fusion_on_cpu" / "check.sh"

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")


@pytest.fixture(scope="module")
def check_output() -> str:
    """One run of every check (the patched tree is prepared once)."""
    env = {**os.environ, "PY": sys.executable}
    res = subprocess.run(["bash", str(CHECK), "all"], cwd=ROOT, env=env, capture_output=True, text=True)
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-4000:]
    return res.stdout


def test_kernels_match_the_cpu_on_the_test_cases(check_output):
    # the coreset's cases, then the conv's: each program ends with its count
    summary = re.findall(r"^(\d+) cases, (\d+) failed$", check_output, re.M)
    assert len(summary) == 2 and all(int(n) > 0 and f == "0" for n, f in summary), check_output


def test_kernels_match_the_cpu_on_a_real_preview_with_its_allocation(check_output):
    # the tiny preset's 3 GDN and 4 MoE layers in both passes; in the preview the allocator gives the conv's
    # output memory of its inputs, which the kernel must not write over (the first version of 0114 did)
    assert check_output.count("3 conv constructions (3 expected), 4 coresets (4 expected), 0 failed") == 2
    assert "output staged" in check_output, check_output
