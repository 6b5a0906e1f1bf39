"""bench/device's host checks (CUDA code cut out of the patched tree, run on host threads against ggml's
CPU backend) as the tests run them: CI has no GPU, so these are the only places CI runs that code."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

needs_gxx = pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")


def run_check(script: str, *args: str) -> str:
    """The output of `bash bench/device/<script> args` from the repository root, with this interpreter as
    its PY; a nonzero exit (a case failed, or nothing could be cut) fails the calling test."""
    env = {**os.environ, "PY": sys.executable}
    cmd = ["bash", str(ROOT / "bench" / "device" / script), *args]
    res = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-4000:]
    return res.stdout


def summaries(output: str) -> list[tuple[int, int]]:
    """(cases, failed) from each check program's closing line."""
    return [(int(n), int(f)) for n, f in re.findall(r"^(\d+) cases, (\d+) failed$", output, re.M)]
