"""`clover_local.conversion_check` (`clover verify`) on F32 and Q8_0 GGUFs of generated checkpoints."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
from clover_convert.pipeline import Options, convert, prepare

from clover_local.backend import LogitAdjustment
from clover_local.llama import unavailable

SKIP = unavailable()
N_GPU_LAYERS = int(os.environ.get("CLOVER_TEST_N_GPU_LAYERS", "0"))  # run these tests on a GPU build
pytestmark = [pytest.mark.llama, pytest.mark.skipif(SKIP is not None, reason=SKIP or "")]


def gguf(ckpt, tmp_path, outtype: str):
    out = tmp_path / f"tiny-{outtype}.gguf"
    return convert(prepare(Options(str(ckpt), outfile=out, outtype=outtype, threads=1)), threads=1).shards[0]


def run(path, ckpt, prompt="hello world", **kw):
    from clover_local.conversion_check import check_conversion

    return check_conversion(
        path,
        ckpt,
        prompt,
        max_new_tokens=16,
        n_threads=2,
        n_gpu_layers=N_GPU_LAYERS,
        log=N_GPU_LAYERS > 0,
        **kw,
    )


def test_f32_file_passes_with_distributions_within_tolerance(tiny_checkpoint, tmp_path):
    report = run(gguf(tiny_checkpoint, tmp_path, "f32"), tiny_checkpoint)
    assert report.file_type == "F32" and report.passed, report.failures
    for d in (report.causal, report.preview, report.commit):
        assert d.rel_kl_mean < report.tolerance.rel_kl_mean and d.top1_all == 1.0
        if N_GPU_LAYERS == 0:
            assert d.max_abs < 1e-3 and d.routing_flip_rows == 0
    assert report.preview.rows == report.commit.rows == 32
    assert sum(d.clear_rows for d in (report.causal, report.preview, report.commit)) > 0
    if N_GPU_LAYERS == 0:
        assert report.generated == report.reference_generated and len(report.generated) == 16
    assert json.loads(json.dumps(report.to_dict()))["passed"] is True


@pytest.mark.parametrize("preset", ["tiny", "tiny-flat"])
@pytest.mark.parametrize("outtype", ["f32", "q8_0"])
def test_correct_conversions_of_peaked_and_flat_models_pass(checkpoint_factory, tmp_path, preset, outtype):
    """A flat model's greedy tokens flip under Q8_0 rounding; its distributions still match."""
    ckpt = checkpoint_factory(preset)
    report = run(gguf(ckpt, tmp_path, outtype), ckpt, [5, 9, 17, 3])
    assert report.passed, report.failures
    if outtype == "q8_0":
        assert report.tolerance.generation is None  # reported, not judged
        assert 0 < report.commit.rel_kl_mean < report.tolerance.rel_kl_mean


@pytest.mark.parametrize(
    ("preset", "outtype"), [("tiny", "f32"), ("tiny-flat", "f32"), ("tiny-flat", "q4_k_m")]
)
def test_a_file_with_one_diffusion_tensor_changed_fails(checkpoint_factory, tmp_path, preset, outtype):
    """ssm_bd_scale of one GDN layer x1.3 after conversion: the tensor check fails it at any file
    type; at F32 the preview's distributions fail too, the causal passes' don't."""
    from gguf import GGUFReader

    ckpt = checkpoint_factory(preset)
    path = gguf(ckpt, tmp_path, outtype)
    reader = GGUFReader(path, "r+")
    (scale,) = [t for t in reader.tensors if t.name == "blk.0.ssm_bd_scale"]
    scale.data[...] *= 1.3
    del reader
    report = run(path, ckpt, [5, 9, 17, 3])
    assert report.passed is False
    assert report.checks["tensors"]["failed"][0]["name"] == "blk.0.ssm_bd_scale"
    assert [f for f in report.failures if f.startswith("tensor ")] == [
        "tensor blk.0.ssm_bd_scale (F32): relative RMS error 0.3 vs its source > 1e-06"
    ]
    if outtype == "f32":
        assert any(f.startswith("preview: mean relative KL") for f in report.failures), report.failures
        assert not any(f.startswith(("causal:", "commit:")) for f in report.failures), report.failures


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
    assert "FAIL" in other.stdout and "KL" in other.stdout


def test_a_reference_cache_serves_the_next_check_of_the_same_checkpoint(checkpoint_factory, tmp_path):
    """The second file of a checkpoint takes the reference's results from the cache (the reference
    is not loaded: it would fail here) and gets the verdict it gets without the cache; another
    prompt, or a cache that is not one, recomputes and replaces the file."""
    import subprocess
    import sys

    ckpt = checkpoint_factory("tiny")
    f32, q8 = gguf(ckpt, tmp_path, "f32"), gguf(ckpt, tmp_path, "q8_0")
    cache = tmp_path / "ref.npz"
    args = ["verify", "-n", "8", "-t", "2", "-r", str(ckpt), "--json", "--reference-cache", str(cache)]

    def verify(*extra: str, reference: bool = True) -> subprocess.CompletedProcess:
        # without `reference` the float64 reference cannot be loaded: a cache miss ends in an error
        blocked = (
            ""
            if reference
            else "import clover_local.reference.model as m; m.ReferenceModel.from_checkpoint = None; "
        )
        cli = blocked + "import sys; from clover_local.cli import app; sys.argv[0] = 'clover'; app()"
        return subprocess.run([sys.executable, "-c", cli, *args, *extra], capture_output=True, text=True)

    first = verify(str(f32))
    assert first.returncode == 0, first.stderr
    assert cache.is_file() and not list(tmp_path.glob(".ref.npz.*"))
    second = verify(str(q8), reference=False)
    assert second.returncode == 0, second.stderr
    plain = subprocess.run(
        [sys.executable, "-m", "clover_local.cli", *args[:-2], str(q8)], capture_output=True, text=True
    )
    assert plain.returncode == 0, plain.stderr
    with_cache, without = json.loads(second.stdout), json.loads(plain.stdout)
    assert with_cache["reference_generated"] == without["reference_generated"]
    for name in ("causal", "preview", "commit"):
        assert with_cache[name] == without[name]
    assert with_cache["passed"] is without["passed"] is True

    assert verify(str(q8), "-p", "another prompt", reference=False).returncode != 0  # a miss
    held = cache.read_bytes()
    assert verify(str(q8), "-p", "another prompt").returncode == 0
    assert cache.read_bytes() != held
    cache.write_text("not an npz")
    assert verify(str(q8)).returncode == 0 and cache.read_bytes()[:2] == b"PK"


def test_a_reference_runs_key_changes_with_the_checkpoint_the_inputs_and_the_code(
    tiny_checkpoint, monkeypatch
):
    import os

    from clover_local import conversion_check
    from clover_local.conversion_check import ReferenceRun
    from clover_local.policy import DecodingSettings

    settings, inputs = DecodingSettings(mask_token_id=3), {"causal": [1, 2]}
    key = ReferenceRun.key(tiny_checkpoint, inputs, settings)
    assert ReferenceRun.key(tiny_checkpoint, inputs, settings) == key
    assert ReferenceRun.key(tiny_checkpoint, {"causal": [1, 3]}, settings) != key
    assert ReferenceRun.key(tiny_checkpoint, inputs, DecodingSettings(mask_token_id=4)) != key
    monkeypatch.setattr(conversion_check, "reference_code", lambda: "other code")
    assert ReferenceRun.key(tiny_checkpoint, inputs, settings) != key
    monkeypatch.undo()
    config = tiny_checkpoint / "config.json"
    stat = config.stat()
    os.utime(config, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1))  # the checkpoint was rewritten
    try:
        assert ReferenceRun.key(tiny_checkpoint, inputs, settings) != key
    finally:  # a session fixture: leave it as it was
        os.utime(config, ns=(stat.st_atime_ns, stat.st_mtime_ns))


def test_speculative_and_ar_may_part_only_at_a_near_tie_of_kernels_that_differ():
    from clover_local.conversion_check import divergence, first_difference

    assert first_difference([1, 2, 3], [1, 2, 3]) is None
    assert first_difference([1, 2, 3], [1, 5, 3]) == 1 and first_difference([1, 2], [1, 2, 3]) == 2
    assert divergence([1, 2], [1, 2], None, 1.0, exact=False) is None
    assert divergence([1, 2], [1, 5], 0.2, 1.0, exact=False)["near_tie"] is True
    # a clear lead: a wrong pass
    assert divergence([1, 2], [1, 5], 2.0, 1.0, exact=False)["near_tie"] is False
    assert divergence([1, 2], [1, 5], -0.2, 1.0, exact=False)["near_tie"] is True  # rounded the other way
    assert divergence([1, 2], [1, 5], -2.0, 1.0, exact=False)["near_tie"] is False
    # the CPU's plain buffers run one kernel for batched and one-row passes: they must agree exactly
    assert divergence([1, 2], [1, 5], 0.2, 1.0, exact=True)["near_tie"] is False
    assert divergence([1, 2], [1, 2, 3], None, 1.0, exact=False)["near_tie"] is False  # lengths differ


def test_one_row_margin_is_the_ar_steps_logit_lead(checkpoint_factory, tmp_path):
    from clover_local.conversion_check import one_row_margin
    from clover_local.llama.engine import LlamaEngine

    path = gguf(checkpoint_factory("tiny"), tmp_path, "f32")
    with LlamaEngine(path, n_ctx=256, n_threads=2) as eng:
        context = [5, 9, 13, 17]
        logits = eng.causal_logits(context)[-1]
        top, second = np.argsort(logits)[::-1][:2]
        margin = one_row_margin(eng, context, int(top), int(second))
        assert margin == pytest.approx(float(logits[top] - logits[second]), abs=1e-3) and margin >= 0
        # after the step's adjustment (a penalty on the leader), as both modes pick
        values = np.array([[1.0, 1.0, -100.0]], dtype=np.float32)
        penalty = LogitAdjustment(np.array([top]), values, len(logits))
        adjusted = one_row_margin(eng, context, int(top), int(second), penalty)
        assert adjusted == pytest.approx(margin - 100.0, abs=1e-3)
