"""Upstream llama.cpp's own converter, run on the same weights: the yardstick of tests and bench.

`as_qwen35moe` turns a Clover checkpoint into the Qwen3.5-MoE checkpoint upstream's
`convert_hf_to_gguf.py` expects (nested `text_config`, architecture `Qwen3_5MoeForCausalLM`,
the four Clover tensors per GDN layer removed), streaming shard data with `copy_file_range`.
`convert_command` is the pinned tree's script run on it.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

from clover_patches import source

from clover_local.model.checkpoint import INDEX_FILE, read_safetensors_header
from clover_local.model.tensors import DIFFUSION_SUFFIXES

COPY_CHUNK = 1 << 28


def as_qwen35moe(src: Path, dst: Path) -> Path:
    """Write the Qwen3.5-MoE twin of checkpoint `src` into the new directory `dst`."""
    dst.mkdir(parents=True)
    for f in src.iterdir():
        if f.is_file() and f.suffix != ".safetensors" and f.name not in (INDEX_FILE, "config.json"):
            shutil.copy(f, dst / f.name)
    cfg = json.loads((src / "config.json").read_text())
    text = {k: v for k, v in cfg.items() if k != "architectures"} | {"model_type": "qwen3_5_moe_text"}
    twin = {
        "architectures": ["Qwen3_5MoeForCausalLM"],
        "model_type": "qwen3_5_moe",
        "text_config": text,
        "tie_word_embeddings": cfg.get("tie_word_embeddings", False),
    }
    (dst / "config.json").write_text(json.dumps(twin, indent=1))
    weight_map: dict[str, str] = {}
    for shard in sorted(src.glob("*.safetensors")):
        kept = {k: e for k, e in read_safetensors_header(shard).items() if not k.endswith(DIFFUSION_SUFFIXES)}
        weight_map |= dict.fromkeys(kept, shard.name)
        _copy_shard(shard, dst / shard.name, kept)
    (dst / INDEX_FILE).write_text(json.dumps({"metadata": {}, "weight_map": weight_map}, indent=1))
    return dst


def _copy_shard(src: Path, dst: Path, entries: dict) -> None:
    header, offset = {}, 0
    for key, e in entries.items():
        header[key] = {
            "dtype": e.dtype,
            "shape": list(e.shape),
            "data_offsets": [offset, offset + e.end - e.start],
        }
        offset += e.end - e.start
    blob = json.dumps(header).encode()
    blob += b" " * (-len(blob) % 8)
    with open(src, "rb") as fi, open(dst, "wb") as fo:
        fo.write(len(blob).to_bytes(8, "little") + blob)
        fo.flush()
        for e in entries.values():
            start, left = e.start, e.end - e.start
            while left:
                n = os.copy_file_range(fi.fileno(), fo.fileno(), min(left, COPY_CHUNK), start)
                start, left = start + n, left - n


def pinned_tree() -> Path:
    """The pinned llama-cpp-python source tree, unpacked once into the project cache."""
    root = source.cache_dir() / "tree"
    tree = root / source.TOP
    if not tree.is_dir():
        tmp = root.with_name(f"tree.partial-{os.getpid()}")
        shutil.rmtree(tmp, ignore_errors=True)
        source.extract(tmp)
        root.mkdir(parents=True, exist_ok=True)
        (tmp / source.TOP).rename(tree)
        shutil.rmtree(tmp)
    return tree


def convert_command(model: Path, out: Path, outtype: str) -> list[str]:
    """Upstream's `convert_hf_to_gguf.py` command line (MTP off: the twin has no MTP head)."""
    script = pinned_tree() / "vendor" / "llama.cpp" / "convert_hf_to_gguf.py"
    return [sys.executable, str(script), str(model), "--outtype", outtype, "--outfile", str(out), "--no-mtp"]
