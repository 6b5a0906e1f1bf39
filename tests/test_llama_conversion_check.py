"""`clover_local.conversion_check` on F32 and Q8_0 GGUFs of the tiny checkpoint."""

from __future__ import annotations

import json
import os

import pytest
from clover_convert.pipeline import Options, convert, prepare

from clover_local.llama import unavailable

SKIP = unavailable()
N_GPU_LAYERS = int(os.environ.get("CLOVER_TEST_N_GPU_LAYERS", "0"))  # run these tests on a GPU build
pytestmark = [pytest.mark.llama, pytest.mark.skipif(SKIP is not None, reason=SKIP or "")]


def gguf(ckpt, tmp_path, outtype: str):
    out = tmp_path / f"tiny-{outtype}.gguf"
    return convert(prepare(Options(str(ckpt), outfile=out, outtype=outtype, threads=1)), threads=1).shards[0]


def test_f32_file_passes_with_logits_within_tolerance(tiny_checkpoint, tmp_path):
    from clover_local.conversion_check import check_conversion

    report = check_conversion(
        gguf(tiny_checkpoint, tmp_path, "f32"),
        tiny_checkpoint,
        "hello world",
        max_new_tokens=16,
        n_threads=2,
        n_gpu_layers=N_GPU_LAYERS,
        log=N_GPU_LAYERS > 0,
    )
    assert report.file_type == "F32" and report.passed, report.failures
    for d in (report.causal, report.preview, report.commit):
        assert d.max_abs < report.tolerance.logit_max_abs and d.argmax_agreement == 1.0
    assert report.generated == report.reference_generated and len(report.generated) == 16
    assert json.loads(json.dumps(report.to_dict()))["passed"] is True


def test_q8_0_file_is_judged_on_token_agreement(tiny_checkpoint, tmp_path):
    from clover_local.conversion_check import check_conversion

    report = check_conversion(
        gguf(tiny_checkpoint, tmp_path, "q8_0"),
        tiny_checkpoint,
        [5, 9, 17, 3],
        max_new_tokens=16,
        n_threads=2,
        n_gpu_layers=N_GPU_LAYERS,
        log=N_GPU_LAYERS > 0,
    )
    assert report.file_type == "Q8_0" and report.tolerance.logit_max_abs is None
    assert report.passed == (report.token_agreement >= 0.95)
    assert 0 < report.causal.max_rel < 0.2 and report.causal.argmax_agreement >= 0.75
    assert bool(report.failures) == (report.token_agreement < 0.95)


def test_clover_verify_command_passes_a_conversion_and_fails_a_mismatch(checkpoint_factory, tmp_path):
    """The CLI as a user runs it: exit 0 and PASS for the right reference, exit 1 for another."""
    import subprocess
    import sys

    ckpt = checkpoint_factory("tiny")
    path = gguf(ckpt, tmp_path, "f32")
    cmd = [sys.executable, "-m", "clover_local.cli", "verify", str(path), "-n", "8", "-t", "2", "-r"]
    ok = subprocess.run([*cmd, str(ckpt), "--json"], capture_output=True, text=True)
    assert ok.returncode == 0, ok.stderr
    report = json.loads(ok.stdout)
    assert report["passed"] is True and report["token_agreement"] == 1.0
    assert report["speculative_identical"] is True
    other = subprocess.run([*cmd, str(checkpoint_factory("tiny", seed=1))], capture_output=True, text=True)
    assert other.returncode == 1
    assert "FAIL" in other.stdout and "logits differ by" in other.stdout
