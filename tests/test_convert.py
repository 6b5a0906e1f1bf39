"""clover-convert end to end on generated checkpoints: every layout, every outtype, read back.

Exactness: F32 and BF16 files hold the transformed source bit for bit (BF16 sources); quantized
files are within the per-type bounds below; the numpy reference gives the same logits from the
F32 GGUF as from the safetensors.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from clover_convert.file_check import source_of
from clover_convert.pipeline import Options, convert, prepare
from clover_convert.plan import ExpertSpec, tensor_specs
from clover_convert.transforms import gate_up_split
from gguf import GGMLQuantizationType, GGUFReader, TokenType
from gguf_weights import GGUFWeights

from clover_local.model import gguf_names as gn
from clover_local.model.checkpoint import Checkpoint
from clover_local.model.tensors import DIFFUSION_GGUF

Q = GGMLQuantizationType
QUANTIZED = ["q8_0", "q6_k", "q5_k_m", "q4_k_m", "q4_k_s", "q3_k_m"]
# max |dequantized - source| / max |source| per tensor, by the type the tensor got. Tiny models'
# rows (16..64 values) never fit 256-blocks, so k-quant mixes fall back to these 32-block types;
# k-types themselves are bounded in test_convert_units.
BOUND = {Q.Q8_0: 0.01, Q.Q5_0: 0.05, Q.Q5_1: 0.05, Q.Q4_0: 0.1, Q.F16: 1e-3, Q.F32: 0.0}
# tiny-qwen-vocab differs from tiny only in the tokenizer: test_metadata_and_vocab covers it
LAYOUTS = ["tiny", "tiny-per-expert", "tiny-lm-prefix", "tiny-tied"]


def run_cli(*args: object) -> subprocess.CompletedProcess[str]:
    """The real console command, as a user runs it."""
    cmd = [sys.executable, "-m", "clover_convert.cli", *map(str, args)]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120)


def make(ckpt: Path, out: Path, outtype: str, **kw: object) -> Path:
    prep = prepare(Options(str(ckpt), outfile=out, outtype=outtype, threads=2, **kw))
    return convert(prep, threads=2).shards[0]


def field(reader: GGUFReader, key: str) -> object:
    return reader.fields[key].contents()


@pytest.fixture(scope="module")
def tiny_f32(tiny_checkpoint: Path, tmp_path_factory) -> Path:
    return make(tiny_checkpoint, tmp_path_factory.mktemp("f32") / "tiny-f32.gguf", "f32")


@pytest.mark.parametrize("preset", LAYOUTS)
def test_bf16_holds_every_tensor_exactly(checkpoint_factory, tmp_path: Path, preset: str) -> None:
    ckpt = Checkpoint(checkpoint_factory(preset))
    path = make(ckpt.path, tmp_path / "m.gguf", "bf16")
    weights = GGUFWeights(path, ckpt.model)
    specs = tensor_specs(ckpt.model, diffusion=True)
    assert sorted(weights.tensors) == sorted(s.gguf for s in specs)
    for spec in specs:
        got, want = weights.dequantized(spec.gguf), source_of(ckpt, spec)
        assert got.shape == want.shape, spec.gguf
        assert np.array_equal(got, want), spec.gguf  # BF16 source -> BF16/F32 is exact
    n_gdn = sum(not a for a in ckpt.model.is_attention)
    for suffix in DIFFUSION_GGUF:
        assert sum(n.endswith(suffix) for n in weights.tensors) == n_gdn


def test_f32_round_trip_and_value_head_order(tiny_checkpoint: Path, tiny_f32: Path) -> None:
    ckpt = Checkpoint(tiny_checkpoint)
    cfg = ckpt.model
    weights = GGUFWeights(tiny_f32, cfg)
    for spec in tensor_specs(cfg, diffusion=True):
        assert np.array_equal(weights.dequantized(spec.gguf), source_of(ckpt, spec)), spec.gguf
    for name in weights.names():  # the inverse serves the checkpoint back (A_log, norms: float rounding)
        want = ckpt.get(name).reshape(weights.get(name).shape)
        np.testing.assert_allclose(weights.get(name), want, rtol=1e-6, atol=1e-7, err_msg=name)
    # design.md: GGUF value head p = j*n_k + k is checkpoint head k*(n_v/n_k) + j
    n_k, r = cfg.linear_num_key_heads, cfg.v_per_k
    scale = ckpt.get("layers.0.linear_attn.bd_softmax_logit_scale")
    gguf = weights.dequantized("blk.0.ssm_bd_scale")
    for j in range(r):
        for k in range(n_k):
            assert gguf[j * n_k + k] == scale[k * r + j]
    a_log = ckpt.get("layers.0.linear_attn.A_log")
    np.testing.assert_allclose(weights.dequantized("blk.0.ssm_a")[0 * n_k + 1], -np.exp(a_log[1 * r]))


@pytest.mark.parametrize("outtype", QUANTIZED)
def test_quantized_outtypes_within_bounds(tiny_checkpoint: Path, tmp_path: Path, outtype: str) -> None:
    ckpt = Checkpoint(tiny_checkpoint)
    path = make(tiny_checkpoint, tmp_path / "m.gguf", outtype)
    weights = GGUFWeights(path, ckpt.model)
    kept_f32 = (
        "ssm_a",
        "ssm_dt.bias",
        "ssm_conv1d.weight",
        "ffn_gate_inp.weight",
        *DIFFUSION_GGUF,
        "norm.weight",
    )
    for spec in tensor_specs(ckpt.model, diffusion=True):
        t = weights.tensors[spec.gguf]
        if spec.gguf.endswith(kept_f32):
            assert t.tensor_type == Q.F32, spec.gguf
        want = source_of(ckpt, spec)
        err = np.abs(weights.dequantized(spec.gguf) - want).max() / np.abs(want).max()
        assert err <= BOUND[t.tensor_type], (spec.gguf, t.tensor_type.name, err)
    assert (
        field(GGUFReader(path), "general.file_type")
        == {"q8_0": 7, "q6_k": 18, "q5_k_m": 17, "q4_k_m": 15, "q4_k_s": 14, "q3_k_m": 12}[outtype]
    )


def test_f16_outtype(tiny_checkpoint: Path, tmp_path: Path) -> None:
    ckpt = Checkpoint(tiny_checkpoint)
    weights = GGUFWeights(make(tiny_checkpoint, tmp_path / "m.gguf", "f16"), ckpt.model)
    for spec in tensor_specs(ckpt.model, diffusion=True):
        want = source_of(ckpt, spec)
        assert weights.tensors[spec.gguf].tensor_type in (Q.F16, Q.F32)
        np.testing.assert_allclose(weights.dequantized(spec.gguf), want, rtol=1e-3, atol=1e-6)


def test_reference_logits_from_f32_gguf_equal_safetensors(tiny_checkpoint: Path, tiny_f32: Path) -> None:
    model_mod = pytest.importorskip("clover_local.reference.model")
    ckpt = Checkpoint(tiny_checkpoint)
    from_ckpt = model_mod.ReferenceModel(ckpt, ckpt.model)
    from_gguf = model_mod.ReferenceModel(GGUFWeights(tiny_f32, ckpt.model), ckpt.model)
    prompt, block = [5, 17, 42, 99, 7, 3], [ckpt.model.mask_token_id] * 4 + [11, 12]
    models = (from_ckpt, from_gguf)
    states = [m.new_state() for m in models]
    commits = [m.commit(prompt, s) for m, s in zip(models, states, strict=True)]
    previews = [m.preview(block, s) for m, s in zip(models, states, strict=True)]  # diffusion tensors
    assert np.abs(commits[0] - commits[1]).max() <= 1e-5
    assert np.abs(previews[0] - previews[1]).max() <= 1e-5


def test_metadata_and_vocab(checkpoint_factory, tmp_path: Path) -> None:
    ckpt = Checkpoint(checkpoint_factory("tiny-qwen-vocab"))
    cfg = ckpt.model
    reader = GGUFReader(make(ckpt.path, tmp_path / "m.gguf", "bf16"))
    assert field(reader, "general.architecture") == gn.ARCH == "clover-moe"
    assert field(reader, gn.BLOCK_COUNT) == cfg.num_hidden_layers
    assert field(reader, gn.key("context_length")) == 131072
    assert field(reader, gn.key("rope.dimension_count")) == cfg.rotary_dim
    assert field(reader, gn.key("rope.dimension_sections")) == [*cfg.mrope_section, 0]
    assert field(reader, gn.RECURRENT_LAYERS) == [not a for a in cfg.is_attention]
    assert field(reader, gn.key("ssm.time_step_rank")) == cfg.linear_num_value_heads
    assert field(reader, gn.key("diffusion.block_size")) == 32
    assert field(reader, gn.key("diffusion.threshold")) == pytest.approx(0.95)
    assert field(reader, gn.key("diffusion.logit_shift")) == 1
    assert field(reader, gn.key("diffusion.coreset_top_p")) == pytest.approx(0.9)
    assert field(reader, gn.DIFFUSION_EOS_TOKEN_IDS) == list(ckpt.config.generation.eos_token_ids)
    assert field(reader, "general.quantization_version") == 2
    tokens, types = field(reader, "tokenizer.ggml.tokens"), field(reader, "tokenizer.ggml.token_type")
    assert len(tokens) == len(types) == cfg.vocab_size
    assert [int(d) for d in reader.get_tensor(0).shape] == [cfg.hidden_size, cfg.vocab_size]
    assert field(reader, "tokenizer.ggml.pre") == "qwen35"
    assert tokens[field(reader, "tokenizer.ggml.eos_token_id")] == "<|im_end|>"
    assert tokens[field(reader, "tokenizer.ggml.padding_token_id")] == "<|endoftext|>"
    mask = field(reader, gn.MASK_TOKEN_ID)
    assert mask == cfg.mask_token_id and tokens[mask] == "<|mask|>" and types[mask] == TokenType.CONTROL
    assert tokens[-1] == f"[PAD{cfg.vocab_size - 1}]" and types[-1] == TokenType.UNUSED
    assert types[tokens.index("<think>")] == TokenType.USER_DEFINED
    assert len(field(reader, "tokenizer.ggml.merges")) > 100_000
    assert "enable_thinking" in field(reader, "tokenizer.chat_template")


def test_ar_only(checkpoint_factory, tmp_path: Path) -> None:
    ckpt = Checkpoint(checkpoint_factory("tiny"))
    reader = GGUFReader(make(ckpt.path, tmp_path / "m.gguf", "bf16", ar_only=True))
    names = [t.name for t in reader.tensors]
    assert not [n for n in names if n.endswith(DIFFUSION_GGUF)]
    assert not [k for k in reader.fields if ".diffusion." in k]
    assert "blk.0.ssm_conv1d.weight" in names


def test_cli_writes_and_dry_run_writes_nothing(tiny_checkpoint: Path, tmp_path: Path) -> None:
    out = tmp_path / "m.gguf"
    dry = run_cli(tiny_checkpoint, "-o", out, "--outtype", "q4_k_m", "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert "blk.0.ssm_conv1d_right.weight" in dry.stdout and "dry run: nothing written" in dry.stdout
    plan = json.loads(run_cli(tiny_checkpoint, "-o", out, "--dry-run", "--json").stdout)
    assert plan["files"] == [str(out)] and plan["dropped"] == []
    conv_right = next(t for t in plan["tensors"] if t["name"] == "blk.0.ssm_conv1d_right.weight")
    assert conv_right == {
        "name": "blk.0.ssm_conv1d_right.weight",
        "shape": [3, 128],
        "type": "F32",
        "bytes": 3 * 128 * 4,
        "source": "layers.0.linear_attn.conv_right_weight",
    }
    assert list(tmp_path.iterdir()) == []
    res = run_cli(tiny_checkpoint, "-o", out, "--outtype", "q4_k_m")
    assert res.returncode == 0, res.stderr
    assert res.stdout.startswith(f"wrote {out}") and list(tmp_path.iterdir()) == [out]
    assert len(GGUFReader(out).tensors) == len(
        tensor_specs(Checkpoint(tiny_checkpoint).model, diffusion=True)
    )
    assert "--split-max-size" in run_cli("--help").stdout


def test_split_max_size(tiny_checkpoint: Path, tmp_path: Path) -> None:
    ckpt = Checkpoint(tiny_checkpoint)
    res = run_cli(tiny_checkpoint, "-o", tmp_path / "m.gguf", "--split-max-size", "300K")
    assert res.returncode == 0, res.stderr
    shards = sorted(tmp_path.iterdir())
    n = len(shards)
    assert n >= 3 and [p.name for p in shards] == [f"m-{i:05d}-of-{n:05d}.gguf" for i in range(1, n + 1)]
    readers = [GGUFReader(p) for p in shards]
    assert [field(r, "split.no") for r in readers] == list(range(n))
    assert {field(r, "split.count") for r in readers} == {n}
    assert gn.BLOCK_COUNT in readers[0].fields and gn.BLOCK_COUNT not in readers[1].fields
    weights = GGUFWeights(shards[1], ckpt.model)
    specs = tensor_specs(ckpt.model, diffusion=True)
    assert sorted(weights.tensors) == sorted(s.gguf for s in specs)
    expert = next(s for s in specs if isinstance(s, ExpertSpec) and s.part == "up")
    gate_up = ckpt.get(f"layers.{expert.layer}.mlp.experts.gate_up_proj")
    assert np.array_equal(weights.dequantized(expert.gguf), gate_up_split(gate_up)[1])
