"""Generated checkpoints: loadable, laid out as `expected_shapes` says, deterministic, tokenizers right."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from clover_patches.source import read_member
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Tokenizer

from clover_local.model.checkpoint import INDEX_FILE, Checkpoint
from clover_local.model.config import CheckpointConfig, CloverConfig
from clover_local.model.tensors import expected_shapes
from clover_local.testing import make_checkpoint as mc
from clover_local.testing.safetensors_writer import plan_shards, write_sharded
from clover_local.testing.tokenizer_files import vocabulary

VARIANTS = ["tiny", "tiny-per-expert", "tiny-lm-prefix", "tiny-tied", "tiny-ar-only", "tiny-qwen-vocab"]


def _tokenizer(path: Path) -> Tokenizer:
    return Tokenizer.from_file(str(path / "tokenizer.json"))


def test_tiny_config_loads(tiny_checkpoint: Path) -> None:
    cc = CheckpointConfig.from_dir(tiny_checkpoint)
    m, tok = cc.model, _tokenizer(tiny_checkpoint)
    assert (m.hidden_size, m.num_hidden_layers, m.num_experts, m.num_experts_per_tok) == (64, 4, 8, 2)
    assert m.is_attention == (False, False, False, True) and m.full_attention_interval == 4
    assert (m.linear_num_key_heads, m.linear_num_value_heads, m.v_per_k) == (2, 4, 2)
    assert m.rotary_dim == 8 and sum(m.mrope_section) == m.rotary_dim // 2
    assert m.mask_token_id == tok.token_to_id("<|mask|>")
    assert cc.generation.eos_token_ids == (tok.token_to_id("<|im_end|>"), tok.token_to_id("<|endoftext|>"))
    assert (cc.generation.threshold, cc.generation.block_size) == (0.95, 32)
    assert tok.get_vocab_size() <= m.vocab_size


def test_shards_and_index_consistent(tiny_checkpoint: Path) -> None:
    index = json.loads((tiny_checkpoint / INDEX_FILE).read_text())
    shards = sorted(tiny_checkpoint.glob("model-*.safetensors"))
    assert len(shards) >= 3 and sorted(set(index["weight_map"].values())) == [s.name for s in shards]
    seen: list[str] = []
    total = 0
    for shard in shards:  # read by the format's definition (not our reader): u64 header size, JSON header
        raw = shard.read_bytes()
        size = int.from_bytes(raw[:8], "little")
        header = json.loads(raw[8 : 8 + size])
        header.pop("__metadata__", None)
        assert len(raw) == 8 + size + max(h["data_offsets"][1] for h in header.values())
        for key, h in header.items():
            begin, end = h["data_offsets"]
            assert h["dtype"] == "BF16" and index["weight_map"][key] == shard.name
            assert end - begin == 2 * int(np.prod(h["shape"]))
            total += end - begin
            seen.append(key)
    assert sorted(seen) == sorted(index["weight_map"]) and len(seen) == len(set(seen))
    assert index["metadata"]["total_size"] == total


@pytest.mark.parametrize("preset", VARIANTS)
def test_variant_matches_expected_shapes(checkpoint_factory, preset: str) -> None:
    p = mc.PRESETS[preset]
    ckpt = Checkpoint(checkpoint_factory(preset))
    shapes = expected_shapes(ckpt.model, fused_experts=p.fused_experts, diffusion=p.diffusion)
    assert sorted(ckpt.names()) == sorted(shapes)
    for name, shape in shapes.items():
        assert ckpt.get(name).shape == shape, name
    assert ckpt.fused_experts == p.fused_experts and ckpt.has_diffusion_tensors == p.diffusion
    stored = {e.key for _, e in ckpt.entries.items()}
    assert ("lm_head.weight" in stored) != p.tie_word_embeddings
    assert f"{p.prefix}embed_tokens.weight" in stored


def test_variants_share_values(checkpoint_factory) -> None:
    base = Checkpoint(checkpoint_factory("tiny"))
    per_expert = Checkpoint(checkpoint_factory("tiny-per-expert"))
    lm_prefix = Checkpoint(checkpoint_factory("tiny-lm-prefix"))
    for name in base.names():
        np.testing.assert_array_equal(base.raw(name), lm_prefix.raw(name))
    for layer, e in [(0, 0), (3, 7)]:
        for a, b in zip(base.expert(layer, e), per_expert.expert(layer, e), strict=True):
            np.testing.assert_array_equal(a, b)


def test_value_ranges(tiny_checkpoint: Path) -> None:
    ckpt = Checkpoint(tiny_checkpoint)
    la = "layers.0.linear_attn."
    a = np.exp(ckpt.get(la + "A_log"))
    assert np.all((a > 0.99) & (a < 16.1))
    assert np.all(ckpt.get(la + "dt_bias") < 0)  # softplus(dt_bias) <= 0.1: GDN state has memory
    assert abs(ckpt.get(la + "norm.weight").mean() - 1) < 0.1
    assert abs(ckpt.get("layers.0.input_layernorm.weight").mean()) < 0.05
    assert np.all(ckpt.get(la + "bd_softmax_logit_scale") >= 1)
    q_norm = ckpt.get("layers.3.self_attn.q_norm.weight")  # rotary dims favoured
    assert np.all(q_norm[: ckpt.model.rotary_dim] > 1) and np.all(
        np.abs(q_norm[ckpt.model.rotary_dim :]) < 0.5
    )
    emb = ckpt.get("embed_tokens.weight")
    rms = np.sqrt((emb**2).mean(1))
    assert (
        rms[ckpt.model.mask_token_id]
        < 0.2
        < rms.min(where=np.arange(len(rms)) != ckpt.model.mask_token_id, initial=9)
    )
    for name in ckpt.names():
        assert np.all(np.isfinite(ckpt.get(name))), name


def test_head_gives_peaked_distributions(tiny_checkpoint: Path) -> None:
    """Over unit-RMS hidden states a good share of rows clears a 0.9 threshold (multi-token fills)."""
    w = Checkpoint(tiny_checkpoint).get("lm_head.weight")
    h = np.random.default_rng(0).standard_normal((256, w.shape[1]))
    logits = h @ w.T
    p = np.exp(logits - logits.max(1, keepdims=True))
    p_max = (p / p.sum(1, keepdims=True)).max(1)
    assert 0.1 < (p_max >= 0.9).mean() < 0.9


def _file_bytes(path: Path) -> dict[str, bytes]:
    return {f.name: f.read_bytes() for f in sorted(path.iterdir())}


def test_deterministic_and_seeded(tmp_path: Path, tiny_checkpoint: Path) -> None:
    again = mc.write_checkpoint(tmp_path / "again", "tiny", seed=0)
    other = mc.write_checkpoint(tmp_path / "other", "tiny", seed=1)
    assert _file_bytes(again) == _file_bytes(tiny_checkpoint)
    differ = [n for n, b in _file_bytes(other).items() if b != _file_bytes(again)[n]]
    assert differ == [f"model-0000{i}-of-00003.safetensors" for i in (1, 2, 3)]


@pytest.mark.parametrize("preset", ["tiny", "tiny-per-expert"])
def test_concurrent_shards_write_the_same_bytes(tmp_path: Path, preset: str) -> None:
    """One writer thread or one per shard: identical files (per-expert slices: a cache per thread)."""
    one = mc.write_checkpoint(tmp_path / "one", preset, workers=1)
    many = mc.write_checkpoint(tmp_path / "many", preset, workers=3)
    assert _file_bytes(one) == _file_bytes(many)


def test_a_failing_shard_fails_the_concurrent_write(tmp_path: Path) -> None:
    tensors = [(f"t{i}", (4, 4)) for i in range(6)]

    def source(name: str, shape: tuple[int, ...]):
        if name == "t3":
            raise RuntimeError("no values for t3")
        yield np.zeros(16, np.uint16)

    with pytest.raises(RuntimeError, match="t3"):
        write_sharded(tmp_path, tensors, 3, source, workers=3)
    assert not (tmp_path / INDEX_FILE).exists()


def test_layers_override_keeps_shared_values(tmp_path: Path, tiny_checkpoint: Path) -> None:
    eight = Checkpoint(mc.write_checkpoint(tmp_path / "l8", "tiny", layers=8))
    assert eight.model.is_attention == (False, False, False, True) * 2
    np.testing.assert_array_equal(
        eight.raw("layers.2.linear_attn.in_proj_qkv.weight"),
        Checkpoint(tiny_checkpoint).raw("layers.2.linear_attn.in_proj_qkv.weight"),
    )


def test_interrupted_run_leaves_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def boom(*_: object) -> None:
        raise RuntimeError("interrupted")

    monkeypatch.setattr(mc, "write_sharded", boom)
    with pytest.raises(RuntimeError):
        mc.write_checkpoint(tmp_path / "out", "tiny")
    assert list(tmp_path.iterdir()) == []


def test_refuses_non_empty_dir(tmp_path: Path) -> None:
    (tmp_path / "keep.txt").write_text("x")
    with pytest.raises(FileExistsError):
        mc.write_checkpoint(tmp_path, "tiny")


def test_cli_subprocess(tmp_path: Path) -> None:
    cmd = [sys.executable, "-m", "clover_local.testing.make_checkpoint"]
    helped = subprocess.run([*cmd, "--help"], capture_output=True, text=True, check=True).stdout
    assert all(opt in helped for opt in ("--preset", "--seed", "--layers", "full-width"))
    out = tmp_path / "ck"
    res = subprocess.run(
        [*cmd, str(out), "--preset", "tiny-ar-only", "--seed", "3"], capture_output=True, text=True
    )
    assert res.returncode == 0, res.stderr
    assert not Checkpoint(out).has_diffusion_tensors
    again = subprocess.run([*cmd, str(out)], capture_output=True, text=True)
    assert again.returncode == 2 and "not an empty directory" in again.stderr


def test_plan_shards_balanced() -> None:
    tensors = [(f"t{i}", (1000,)) for i in range(10)] + [("big", (10000,)), ("last", (8,))]
    shards = plan_shards(tensors, 3)
    assert [s.file for s in shards][-1] == "model-00003-of-00003.safetensors"
    assert [n for s in shards for n, _ in s.tensors] == [n for n, _ in tensors]
    assert all(s.tensors for s in shards)


# -- tokenizer --------------------------------------------------------------------------------
def test_tiny_tokenizer_round_trip(tiny_checkpoint: Path) -> None:
    tok = _tokenizer(tiny_checkpoint)
    text = "Hello, world!\n\ndef add(a, b):\n    return a + b  # café 中文 🙂"
    enc = tok.encode(text)
    assert tok.decode(enc.ids, skip_special_tokens=False) == text
    code = "def add(a, b):\n    return a + b"
    assert len(tok.encode(code).ids) < len(code) / 2  # the merges are real
    specials = "<|im_start|>user\nHi<|im_end|><think></think><|mask|><|endoftext|>"
    ids = tok.encode(specials).ids
    for t in ("<|im_start|>", "<|im_end|>", "<think>", "</think>", "<|mask|>", "<|endoftext|>"):
        assert tok.token_to_id(t) in ids


def _render(path: Path, messages: list[dict], **kw: object) -> str:
    cfg = json.loads((path / "tokenizer_config.json").read_text())
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    return env.from_string(cfg["chat_template"]).render(messages=messages, **kw)


def test_chat_template_thinking(tiny_checkpoint: Path) -> None:
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    head = "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    assert _render(tiny_checkpoint, msgs, add_generation_prompt=True) == head + "<think>\n"
    assert (
        _render(tiny_checkpoint, msgs, add_generation_prompt=True, enable_thinking=True) == head + "<think>\n"
    )
    off = _render(tiny_checkpoint, msgs, add_generation_prompt=True, enable_thinking=False)
    assert off == head + "<think>\n\n</think>\n\n"
    history = [*msgs, {"role": "assistant", "content": "<think>\nhm\n</think>\n\nHello!"}]
    assert _render(tiny_checkpoint, history).endswith("<|im_start|>assistant\nHello!<|im_end|>\n")


def _vocab_tests() -> list[tuple[str, list[int]]]:
    inp = read_member("vendor/llama.cpp/models/ggml-vocab-qwen35.gguf.inp").decode()
    out = read_member("vendor/llama.cpp/models/ggml-vocab-qwen35.gguf.out").decode()
    texts = inp.split("\n__ggml_vocab_test__\n")[:-1]  # the file ends with a separator
    ids = [[int(t) for t in line.split()] for line in out.split("\n")[: len(texts)]]
    return list(zip(texts, ids, strict=True))


def test_qwen_vocab_matches_llama_cpp_expectations(checkpoint_factory) -> None:
    tok = _tokenizer(checkpoint_factory("tiny-qwen-vocab"))
    cases = _vocab_tests()
    assert len(cases) > 40
    for text, expected in cases:
        assert tok.encode(text, add_special_tokens=False).ids == expected, repr(text)


def test_full_width_plan_streams_in_bounded_chunks() -> None:
    """full-width is planned, not written, here: sizes as the spec's, data produced chunk by chunk."""
    p = mc.resolve_preset("full-width")
    cfg_dict = mc.config_json(p, vocabulary("tiny"))
    tensors = dict(mc.stored_tensors(p, CloverConfig.from_dict(cfg_dict)))
    assert cfg_dict["layer_types"] == ["linear_attention"] * 3 + ["full_attention"]
    assert tensors["model.layers.0.mlp.experts.gate_up_proj"] == (256, 1024, 2048)
    assert tensors["model.layers.0.linear_attn.in_proj_qkv.weight"] == (8192, 2048)
    assert tensors["model.layers.3.self_attn.q_proj.weight"] == (8192, 2048)
    assert tensors["lm_head.weight"] == (248320, 2048)
    chunks = mc.WeightSource(p, seed=0, mask_token_id=0)(
        "model.layers.0.mlp.experts.gate_up_proj", (256, 1024, 2048)
    )
    first = next(iter(chunks))
    assert first.dtype == np.uint16 and first.size == mc.CHUNK
