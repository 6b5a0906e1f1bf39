"""Bad input: one `error:` line, exit status 1, no traceback, and nothing left in the output folder."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from clover_convert import writer
from clover_convert.cli import app
from typer.testing import CliRunner

Edit = Callable[[Path], None]


def run_cli(*args: object) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "clover_convert.cli", *map(str, args)]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120)


def assert_refused(res: subprocess.CompletedProcess[str], message: str, out_dir: Path) -> None:
    assert res.returncode == 1, res.stdout + res.stderr
    assert res.stderr.startswith("error: ") and res.stderr.count("\n") == 1, res.stderr
    assert message in res.stderr, res.stderr
    assert "Traceback" not in res.stderr
    assert list(out_dir.iterdir()) == []  # no output, no .tmp


def shards(ckpt: Path) -> list[Path]:
    return sorted(ckpt.glob("*.safetensors"))


def edit_tensors(shard: Path, change: Callable[[dict[str, tuple[dict, bytes]]], None]) -> None:
    """Rewrite a shard from its tensors (name -> (header entry, bytes)), laid out again as the
    safetensors format requires (the data block tiled exactly)."""
    blob = shard.read_bytes()
    n = int.from_bytes(blob[:8], "little")
    header = json.loads(blob[8 : 8 + n])
    meta = header.pop("__metadata__", None)
    data = blob[8 + n :]
    tensors = {k: (v, data[v["data_offsets"][0] : v["data_offsets"][1]]) for k, v in header.items()}
    change(tensors)
    new, chunks, pos = {"__metadata__": meta} if meta else {}, [], 0
    for k, (info, raw) in tensors.items():
        new[k] = {**info, "data_offsets": [pos, pos + len(raw)]}
        chunks.append(raw)
        pos += len(raw)
    head = json.dumps(new).encode()
    shard.write_bytes(len(head).to_bytes(8, "little") + head + b"".join(chunks))


def edit_index(ckpt: Path, change: Callable[[dict], None]) -> None:
    path = ckpt / "model.safetensors.index.json"
    index = json.loads(path.read_text())
    change(index["weight_map"])
    path.write_text(json.dumps(index))


def edit_config(ckpt: Path, **values: object) -> None:
    path = ckpt / "config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **values}))


def edit_rope(ckpt: Path, **values: object) -> None:
    rope = json.loads((ckpt / "config.json").read_text())["rope_parameters"]
    edit_config(ckpt, rope_parameters={**rope, **values})


def drop_tensor(ckpt: Path) -> None:
    name = "model.layers.1.linear_attn.in_proj_z.weight"
    shard = ckpt / json.loads((ckpt / "model.safetensors.index.json").read_text())["weight_map"][name]
    edit_tensors(shard, lambda t: t.pop(name))
    edit_index(ckpt, lambda m: m.pop(name))


def alias_tensor(ckpt: Path, alias: str, into: Path | None = None) -> None:
    """Add `alias` to a shard (the last one unless `into`), pointing at an existing tensor's bytes."""
    shard = into or shards(ckpt)[-1]

    def add(t: dict) -> None:
        t[alias] = next(iter(t.values()))

    edit_tensors(shard, add)
    edit_index(ckpt, lambda m: m.setdefault(alias, shard.name))


def truncate_shard(ckpt: Path) -> None:
    shard = shards(ckpt)[1]
    shard.write_bytes(shard.read_bytes()[:-1000])


def corrupt_shard(ckpt: Path) -> None:
    shard = shards(ckpt)[0]
    shard.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00not json at all!" + shard.read_bytes()[24:])


CASES: dict[str, tuple[Edit, str]] = {
    "missing config": (lambda c: (c / "config.json").unlink(), "no config.json"),
    "not clover": (
        lambda c: edit_config(c, architectures=["Qwen3_5MoeForCausalLM"], model_type="qwen3_5_moe"),
        "not a Clover checkpoint: architectures Qwen3_5MoeForCausalLM",
    ),
    "missing tensor": (drop_tensor, "missing tensor layers.1.linear_attn.in_proj_z.weight"),
    "unknown tensor": (
        lambda c: alias_tensor(c, "model.layers.0.mlp.extra.weight"),
        "unknown tensor model.layers.0.mlp.extra.weight",
    ),
    "duplicate tensor": (
        lambda c: alias_tensor(c, "model.embed_tokens.weight"),
        "duplicate tensor model.embed_tokens.weight",
    ),
    "shape vs config": (
        lambda c: edit_config(c, moe_intermediate_size=48),
        "tensor model.layers.0.mlp.experts.gate_up_proj has shape [8, 64, 64], "
        "config.json implies [8, 96, 64]",
    ),
    "truncated shard": (truncate_shard, "truncated shard"),
    "corrupt shard": (corrupt_shard, "corrupt safetensors header"),
    "index points at missing shard": (lambda c: shards(c)[2].unlink(), "points at a missing shard"),
    "no tokenizer": (lambda c: (c / "tokenizer.json").unlink(), "no tokenizer.json"),
    # llama.cpp aborts on rotary sections past the head dimension, and on none
    "rotary sections past the head dim": (
        lambda c: edit_rope(c, mrope_section=[1000, 1000, 1000]),
        "config.json mrope_section is [1000, 1000, 1000]: must add up to at most the head dimension, 32",
    ),
    "no rotary sections": (
        lambda c: edit_rope(c, mrope_section=[0, 0, 0, 5]),
        "config.json mrope_section is [0, 0, 0, 5]: must have one of its first three sections > 0",
    ),
    "a negative rotary section": (
        lambda c: edit_rope(c, mrope_section=[-1, 11, 10]),
        "config.json mrope_section is [-1, 11, 10]: must be up to 4 integers >= 0",
    ),
}


@pytest.fixture
def ckpt_copy(tiny_checkpoint: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(tiny_checkpoint, tmp_path / "ckpt"))


@pytest.fixture
def out_dir(tmp_path: Path) -> Path:
    path = tmp_path / "out"
    path.mkdir()
    return path


@pytest.mark.parametrize("case", list(CASES))
def test_bad_checkpoint(ckpt_copy: Path, out_dir: Path, case: str) -> None:
    edit, message = CASES[case]
    edit(ckpt_copy)
    assert_refused(run_cli(ckpt_copy, "-o", out_dir / "m.gguf"), message, out_dir)


def test_ar_only_checkpoint_needs_flag(checkpoint_factory, out_dir: Path) -> None:
    ckpt = checkpoint_factory("tiny-ar-only")
    assert_refused(run_cli(ckpt, "-o", out_dir / "m.gguf"), "pass --ar-only", out_dir)
    res = run_cli(ckpt, "-o", out_dir / "m.gguf", "--ar-only")
    assert res.returncode == 0 and (out_dir / "m.gguf").is_file(), res.stderr


def test_bad_options(tiny_checkpoint: Path, tmp_path: Path, out_dir: Path) -> None:
    target = out_dir / "m.gguf"
    assert_refused(
        run_cli(tiny_checkpoint, "-o", target, "--outtype", "q2_k"), "unknown --outtype q2_k", out_dir
    )
    assert_refused(run_cli(tmp_path / "nowhere", "-o", target), "no such directory", out_dir)
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    res = run_cli(tiny_checkpoint, "-o", blocker / "m.gguf")
    assert (
        res.returncode == 1
        and f"cannot write {blocker / 'm.gguf'}: {blocker} is not a directory" in res.stderr
    )
    assert_refused(
        run_cli(tiny_checkpoint, "-o", target, "--imatrix", tmp_path / "none.gguf", "--outtype", "q4_k_m"),
        "--imatrix",
        out_dir,
    )
    target.write_bytes(b"old")
    res = run_cli(tiny_checkpoint, "-o", target)
    assert res.returncode == 1 and "exists (pass --force to overwrite)" in res.stderr
    assert target.read_bytes() == b"old"


def test_no_disk_space(tiny_checkpoint: Path, out_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(writer, "free_bytes", lambda directory: 100_000)
    res = CliRunner().invoke(app, [str(tiny_checkpoint), "-o", str(out_dir / "m.gguf")])
    assert res.exit_code == 1
    assert "error: not enough disk space in" in res.output and "MB free" in res.output
    assert list(out_dir.iterdir()) == []


def test_failure_while_writing_leaves_nothing(
    tiny_checkpoint: Path, out_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A disk that fills up mid-write: the error is reported and the partial .tmp removed."""

    def full(*args: object) -> None:
        raise OSError(28, "No space left on device", str(out_dir / "m.gguf.tmp"))

    monkeypatch.setattr(writer, "_write_tensor", full)
    res = CliRunner().invoke(app, [str(tiny_checkpoint), "-o", str(out_dir / "m.gguf")])
    assert res.exit_code == 1 and "No space left on device" in res.output
    assert list(out_dir.iterdir()) == []


def test_threads_are_bounded(tiny_checkpoint: Path, out_dir: Path) -> None:
    """A thread count beyond any machine's cores is a usage error, before any work."""
    res = run_cli(tiny_checkpoint, "-o", out_dir / "m.gguf", "--threads", "100000")
    assert res.returncode == 2 and "'--threads'" in res.stderr and "512" in res.stderr, res.stderr
    assert list(out_dir.iterdir()) == []
