"""Derive GGUF variants for the benchmarks without re-converting: other layer counts, or upstream's arch.

    python bench/device/gguf_variant.py IN.gguf OUT.gguf [--layers N] [--arch qwen35moe]

`--layers N` keeps the first N layers (the layer pattern is periodic, full attention every 4th,
so the first N layers of a synthetic file are a valid N-layer model with the same per-layer
weights); N above the file's count repeats its layers (layer i is a copy of layer i mod L), so a
synthetic file of a few generated layers gives the real 40-layer shapes for timing (the source's
count must be a multiple of the attention interval, which every per-layer array then repeats).
`--arch qwen35moe` rewrites a clover-moe file as the upstream baseline upstream runs for Clover:
`general.architecture` becomes `qwen35moe`, every `clover-moe.*` key is renamed, and what
upstream does not know is dropped (`clover-moe.diffusion.*` keys, the per-layer diffusion tensors
`ssm_conv1d_right`, `ssm_bd_*`), so upstream's loader sees exactly its own tensor set. Tensor
bytes are copied, never re-encoded.
"""

from __future__ import annotations

import argparse
import re
import sys
import time

from gguf import GGUFReader, GGUFValueType, GGUFWriter

DROP_TENSOR_PARTS = (".ssm_conv1d_right", ".ssm_bd_")
BLK = re.compile(r"^blk\.(\d+)\.")


def variant(src: str, dst: str, layers: int | None = None, arch: str | None = None) -> tuple[int, int]:
    r = GGUFReader(src)
    f = r.fields["general.architecture"]
    src_arch = bytes(f.parts[f.data[0]]).decode()
    new_arch = arch or src_arch
    bc = r.fields[f"{src_arch}.block_count"]
    n_layers_src = int(bc.parts[bc.data[0]][0])
    w = GGUFWriter(dst, new_arch, use_temp_file=False)
    for field in r.fields.values():
        name = field.name
        if name.startswith("GGUF.") or name in ("general.architecture", "general.alignment"):
            continue
        if new_arch != src_arch and name.startswith(f"{src_arch}.diffusion."):
            continue
        if name.startswith(f"{src_arch}."):
            name = new_arch + name[len(src_arch) :]
        vtype = field.types[0]
        sub = field.types[-1] if vtype == GGUFValueType.ARRAY else None
        value = field.contents()
        if layers is not None and name == f"{new_arch}.block_count":
            value = layers
        elif (
            layers is not None
            and vtype == GGUFValueType.ARRAY
            and len(value) == n_layers_src
            and "dimension_sections" not in name
        ):
            # per-layer arrays (attention.recurrent_layers, ...), cut or repeated
            value = [value[i % n_layers_src] for i in range(layers)]
        w.add_key_value(name, value, vtype, sub_type=sub)

    def keep(t) -> bool:
        return new_arch == src_arch or not any(p in t.name for p in DROP_TENSOR_PARTS)

    # (name, tensor): the global tensors once, each kept layer's from layer i mod the source's count
    kept = [t for t in r.tensors if keep(t)]
    by_layer: dict[int, list] = {}
    for t in kept:
        if m := BLK.match(t.name):
            by_layer.setdefault(int(m.group(1)), []).append(t)
    out = [(t.name, t) for t in kept if not BLK.match(t.name)]
    for i in range(n_layers_src if layers is None else layers):
        out += [(BLK.sub(f"blk.{i}.", t.name), t) for t in by_layer[i % n_layers_src]]
    for name, t in out:
        w.add_tensor_info(name, t.data.shape, t.data.dtype, t.data.nbytes, t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    for _, t in out:
        w.write_tensor_data(t.data)
    w.close()
    return len(out), len(r.tensors) - len(kept)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("src")
    ap.add_argument("dst")
    ap.add_argument("--layers", type=int, help="keep the first N layers (more than the file's: repeat them)")
    ap.add_argument("--arch", help="rename the architecture (qwen35moe: the upstream baseline)")
    a = ap.parse_args(argv)
    t0 = time.time()
    kept, dropped = variant(a.src, a.dst, a.layers, a.arch)
    print(f"wrote {a.dst}: {kept} tensors, {dropped} dropped, in {time.time() - t0:.1f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
