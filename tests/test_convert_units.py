"""The converter's parts alone: transforms and their inverses, type rules, ggml quantization with
every k-type, imatrix reading, size parsing and input resolution."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
from clover_convert import hub
from clover_convert import quantize as ggml_quantize
from clover_convert.encode import Encoder, Piece
from clover_convert.errors import ConvertError
from clover_convert.file_check import BOUNDS
from clover_convert.imatrix import Imatrix
from clover_convert.mix import OUTTYPES, Role, choose, use_more_bits
from clover_convert.pipeline import Options, convert, parse_size, prepare
from clover_convert.transforms import TRANSFORMS, reorder_v_heads
from gguf import GGMLQuantizationType, GGUFWriter
from gguf.quants import dequantize, quantize
from gguf_weights import INVERSES, GGUFWeights, restore_v_heads

from clover_local.model.checkpoint import Checkpoint, bf16_bits, release_pages

Q = GGMLQuantizationType
# max |dequantized - x| / max |x| over a [64, 512] standard-normal tensor
KQUANT_BOUND = {Q.Q8_0: 0.005, Q.Q6_K: 0.02, Q.Q5_K: 0.04, Q.Q4_K: 0.08, Q.Q3_K: 0.16}


def encode(qtype: GGMLQuantizationType, pieces: list[Piece]) -> bytes:
    with ThreadPoolExecutor(2) as pool:
        enc = Encoder(pool, 2, ggml_quantize.load())
        return b"".join(buf.tobytes() for buf in enc.encode(qtype, pieces))


def test_value_head_reorder_matches_design_doc() -> None:
    n_k, r, d = 2, 3, 4
    a = np.arange(n_k * r * d * 5).reshape(n_k * r * d, 5)
    tiled = reorder_v_heads(a, 0, n_k, r, d)
    for j in range(r):
        for k in range(n_k):  # GGUF head p = j*n_k + k is HF head k*r + j
            assert np.array_equal(
                tiled[(j * n_k + k) * d : (j * n_k + k + 1) * d], a[(k * r + j) * d : (k * r + j + 1) * d]
            )
    assert np.array_equal(restore_v_heads(tiled, 0, n_k, r, d), a)
    assert np.array_equal(restore_v_heads(reorder_v_heads(a.T, 1, n_k, r, d), 1, n_k, r, d), a.T)


def test_every_transform_inverts(tiny_checkpoint: Path) -> None:
    ckpt = Checkpoint(tiny_checkpoint)
    cfg = ckpt.model
    sources = {
        "identity": "layers.0.mlp.gate.weight",
        "norm_plus_one": "layers.0.input_layernorm.weight",
        "a_log": "layers.0.linear_attn.A_log",
        "head_rows": "layers.0.linear_attn.in_proj_b.weight",
        "channel_rows": "layers.0.linear_attn.in_proj_z.weight",
        "channel_cols": "layers.0.linear_attn.out_proj.weight",
        "qkv_rows": "layers.0.linear_attn.in_proj_qkv.weight",
        "conv_squeeze": "layers.0.linear_attn.conv1d.weight",
        "conv_right": "layers.0.linear_attn.conv_right_weight",
    }
    assert set(sources) == set(TRANSFORMS)
    for name, source in sources.items():
        t, a = TRANSFORMS[name], ckpt.get(source)
        out = t.forward(a, cfg)
        np.testing.assert_allclose(INVERSES[name](out, cfg), a, rtol=1e-6, err_msg=name)
        if t.row_local:  # streaming in row blocks gives the same tensor
            assert np.array_equal(np.concatenate([t.forward(a[:1], cfg), t.forward(a[1:], cfg)]), out), name
    qkv = TRANSFORMS["qkv_rows"].forward(ckpt.get(sources["qkv_rows"]), cfg)
    assert np.array_equal(
        qkv[: 2 * cfg.key_dim], ckpt.get(sources["qkv_rows"])[: 2 * cfg.key_dim]
    )  # q, k kept


def test_type_rules() -> None:
    q4km, n = OUTTYPES["q4_k_m"], 40
    assert choose(q4km, Role.PROJ, 2048, 0, n, False) == Q.Q6_K
    assert choose(q4km, Role.EXPERTS, 2048, 5, n, False) == Q.Q4_K
    downs = [choose(q4km, Role.EXPERTS_DOWN, 512, i, n, False) for i in range(n)]
    assert downs == [Q.Q6_K if use_more_bits(i, n) else Q.Q4_K for i in range(n)] and Q.Q4_K in downs
    assert choose(q4km, Role.OUTPUT, 2048, None, n, False) == Q.Q6_K
    assert choose(q4km, Role.EMBED, 2048, None, n, False) == Q.Q4_K
    assert choose(q4km, Role.EMBED, 2048, None, n, True) == Q.Q6_K  # tied: the output's type
    assert choose(OUTTYPES["q8_0"], Role.OUTPUT, 2048, None, n, False) == Q.Q8_0
    assert choose(OUTTYPES["bf16"], Role.EXPERTS, 2048, 0, n, False) == Q.BF16
    for out in OUTTYPES.values():
        assert choose(out, Role.F32, 2048, 0, n, False) == Q.F32
    # rows that do not fit a 256-block fall back as llama-quantize does
    assert choose(q4km, Role.EXPERTS, 64, 0, n, False) == Q.Q5_0
    assert choose(q4km, Role.PROJ, 64, 0, n, False) == Q.Q8_0
    assert choose(OUTTYPES["q3_k_m"], Role.EXPERTS, 64, 0, n, False) == Q.Q4_0
    assert choose(q4km, Role.EXPERTS, 20, 0, n, False) == Q.F16


@pytest.mark.parametrize("qtype", list(KQUANT_BOUND))
def test_ggml_quantization_bounds(qtype: GGMLQuantizationType) -> None:
    x = np.random.default_rng(0).standard_normal((64, 512), dtype=np.float32)
    pieces = [Piece(bf16_bits(x[:40])), Piece(x[40:])]  # BF16 bits and float32 pieces mix
    x[:40] = (bf16_bits(x[:40]).astype(np.uint32) << 16).view(np.float32)
    data = np.frombuffer(encode(qtype, pieces), dtype=np.uint8).reshape(64, -1)
    back = dequantize(data, qtype)
    err = np.abs(back - x).max() / np.abs(x).max()
    assert err <= KQUANT_BOUND[qtype]
    # `clover verify`'s tensor check sits at least twice above what a correct tensor gives
    assert np.linalg.norm(back - x) / np.linalg.norm(x) <= BOUNDS[qtype] / 2
    if qtype == Q.Q8_0:  # gguf-py's numpy Q8_0 is bit-exact with ggml's
        assert np.array_equal(data, quantize(x, qtype))


def test_float_encodings_exact() -> None:
    x = np.random.default_rng(1).standard_normal((8, 64), dtype=np.float32)
    bits = bf16_bits(x)
    assert encode(Q.BF16, [Piece(bits)]) == bits.tobytes()
    assert encode(Q.F32, [Piece(x)]) == x.tobytes()
    assert encode(Q.F16, [Piece(x)]) == x.astype(np.float16).tobytes()
    widened = (bits.astype(np.uint32) << 16).view(np.float32)
    assert encode(Q.F32, [Piece(bits)]) == widened.tobytes()


def write_imatrix(path: Path, entries: dict[str, tuple[np.ndarray, np.ndarray]]) -> None:
    w = GGUFWriter(path, "imatrix")
    w.add_array("imatrix.datasets", ["test"])
    w.add_uint32("imatrix.chunk_count", 1)
    w.add_uint32("imatrix.chunk_size", 512)
    for name, (sums, counts) in entries.items():
        w.add_tensor(name + ".in_sum2", sums.astype(np.float32))
        w.add_tensor(name + ".counts", counts.astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def test_imatrix_reading(tmp_path: Path) -> None:
    path = tmp_path / "imatrix.gguf"
    sums = np.arange(12, dtype=np.float32).reshape(3, 4)
    write_imatrix(path, {"blk.0.ffn_down_exps.weight": (sums, np.array([[2.0], [0.0], [4.0]]))})
    im = Imatrix.load(path)
    got = im.weights("blk.0.ffn_down_exps.weight", 4, 3)
    assert np.array_equal(got, np.stack([sums[0] / 2, np.ones(4), sums[2] / 4]))
    assert im.weights("blk.1.ffn_down_exps.weight", 4, 3) is None
    with pytest.raises(ConvertError, match="needs 8 for 2"):
        im.weights("blk.0.ffn_down_exps.weight", 4, 2)
    (tmp_path / "legacy.dat").write_bytes(b"\x01\x00\x00\x00junk")
    with pytest.raises(ConvertError, match="not a GGUF imatrix"):
        Imatrix.load(tmp_path / "legacy.dat")


def test_imatrix_steers_quantization(tiny_checkpoint: Path, tmp_path: Path) -> None:
    ckpt = Checkpoint(tiny_checkpoint)
    cfg = ckpt.model
    name, n_e, ne0 = "blk.0.ffn_down_exps.weight", cfg.num_experts, cfg.moe_intermediate_size
    importance = np.ones((n_e, ne0))
    importance[:, :4] = 1e4  # four columns matter far more than the rest
    write_imatrix(tmp_path / "im.gguf", {name: (importance, np.ones((n_e, 1)))})
    files = {}
    for label, imatrix in (("plain", None), ("imatrix", tmp_path / "im.gguf")):
        prep = prepare(
            Options(
                str(tiny_checkpoint),
                outfile=tmp_path / f"{label}.gguf",
                outtype="q4_k_m",
                imatrix=imatrix,
                threads=2,
            )
        )
        files[label] = GGUFWeights(convert(prep, threads=2).shards[0], cfg)
    want = np.stack([ckpt.expert(0, e)[2] for e in range(n_e)])
    errs = {k: np.square(w.dequantized(name) - want)[..., :4].sum() for k, w in files.items()}
    assert errs["imatrix"] < errs["plain"]
    other = "blk.1.ffn_down_exps.weight"  # no entry: quantized exactly as without an imatrix
    assert np.array_equal(files["plain"].dequantized(other), files["imatrix"].dequantized(other))


def test_parse_size() -> None:
    assert parse_size("50G") == 50 * 10**9
    assert parse_size("500M") == 500 * 10**6
    assert parse_size("1.5T") == 1_500_000_000_000
    assert parse_size("4096") == 4096
    with pytest.raises(ConvertError, match="cannot read size"):
        parse_size("lots")


def test_hub_resolution(tiny_checkpoint: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert hub.resolve(str(tiny_checkpoint)) == hub.Source(tiny_checkpoint)
    assert hub.is_repo_id("clover-ai/Clover-35B-A3B") and not hub.is_repo_id(str(tiny_checkpoint))
    assert not hub.is_repo_id("a/b/c")
    with pytest.raises(ConvertError, match="no such directory"):
        hub.resolve("/no/such/dir")
    calls = []

    def fake_download(repo_id: str, allow_patterns: list[str]) -> str:
        calls.append((repo_id, allow_patterns))
        return str(tiny_checkpoint)

    import huggingface_hub

    monkeypatch.setattr(huggingface_hub, "snapshot_download", fake_download)
    src = hub.resolve("clover-ai/Clover-35B-A3B")
    assert src == hub.Source(tiny_checkpoint, "https://huggingface.co/clover-ai/Clover-35B-A3B")
    assert calls[0][0] == "clover-ai/Clover-35B-A3B" and "*.safetensors" in calls[0][1]


def test_release_pages_keeps_data(tiny_checkpoint: Path) -> None:
    ckpt = Checkpoint(tiny_checkpoint)
    raw = ckpt.raw("embed_tokens.weight")
    before = raw.copy()
    release_pages(raw)  # mapped file pages: dropped from RSS, read back intact
    assert np.array_equal(raw, before)
    heap = before.copy()
    release_pages(heap)  # heap memory is never touched
    assert np.array_equal(heap, before)
