"""The tensors of a converted GGUF against its checkpoint: each stored tensor dequantized and compared
with what the converter must have written (the forward transform of its source).

`clover verify` judges a file by the logits it gives, and quantized logits cannot tell a correct
file from a wrong one on small random models: rounding amplified through depth gives about the KL
of one diffusion tensor off by 30% (docs/performance.md, "clover verify tolerances"). Tensor by
tensor there is no such ambiguity: a correct Q4_K tensor is a few percent off its source, a scaled
one 30%. The bounds (`BOUNDS`) are relative RMS errors per ggml type, about twice what the
converter's quantizers give on normal data (tests/test_convert_units.py holds them to it; Q8_0
0.5%, Q6_K 1.8%, Q5_K 3.6%, Q4_K 7.1%, Q3_K 15%). Below Q3_K a 30% error hides in the rounding:
those types are reported, not judged.
The runtime reaches this through the `clover_local.checks` entry point, without importing the
converter.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType, GGUFReader, ReaderTensor
from gguf.quants import dequantize

from clover_local.model.checkpoint import Checkpoint

from .plan import ExpertSpec, TensorSpec, tensor_specs

Q = GGMLQuantizationType
# relative RMS error of a correct tensor (||stored - source|| / ||source||), by the stored type
BOUNDS: dict[GGMLQuantizationType, float] = {
    Q.F32: 1e-6,
    Q.F16: 2e-3,
    Q.BF16: 8e-3,
    Q.Q8_0: 0.02,
    Q.Q6_K: 0.04,
    Q.Q5_K: 0.08,
    Q.Q5_0: 0.08,
    Q.Q5_1: 0.08,
    Q.Q4_K: 0.15,
    Q.Q4_0: 0.15,
    Q.Q4_1: 0.15,
    Q.Q3_K: 0.32,
}
EXPERTS_CHECKED = 4  # routed experts compared per stack (first, last, two between): every row of them
_SHARD = re.compile(r"^(.*)-(\d{5})-of-(\d{5})\.gguf$")


@dataclass(frozen=True)
class TensorError:
    name: str
    type: str  # the stored ggml type's name
    error: float  # relative RMS error against the source
    bound: float | None  # None: a type without a bound (reported only)

    @property
    def passed(self) -> bool:
        return self.bound is None or self.error <= self.bound


def shard_files(path: Path) -> list[Path]:
    """All shards of a split GGUF given any one of them (or just `path` when not split)."""
    m = _SHARD.match(path.name)
    if not m:
        return [path]
    n = int(m.group(3))
    return [path.with_name(f"{m.group(1)}-{i:05d}-of-{n:05d}.gguf") for i in range(1, n + 1)]


def source_of(
    ckpt: Checkpoint, spec: TensorSpec | ExpertSpec, experts: list[int] | None = None
) -> np.ndarray:
    """What a GGUF tensor must hold: the forward transform of its float source (`experts`: those
    routed experts of a stack only)."""
    if isinstance(spec, ExpertSpec):
        ids = range(ckpt.model.num_experts) if experts is None else experts
        part = ("gate", "up", "down").index(spec.part)
        return np.stack([ckpt.expert(spec.layer, e)[part] for e in ids])
    return spec.transform.forward(ckpt.get(spec.source), ckpt.model)


def stored(t: ReaderTensor, rows: list[int] | None = None) -> np.ndarray:
    """A GGUF tensor as float32 in numpy order (`rows`: those entries of its first axis only)."""
    shape = tuple(int(d) for d in reversed(t.shape))
    data = t.data.reshape(shape[0], -1) if rows is not None else t.data
    if rows is not None:
        data = data[rows]
        shape = (len(rows), *shape[1:])
    return dequantize(data, t.tensor_type).reshape(shape)


def tensor_errors(gguf_path: str | Path, checkpoint_dir: str | Path) -> list[TensorError]:
    """Every tensor the file should hold, compared with its source; a missing one has error inf."""
    ckpt = Checkpoint(checkpoint_dir)
    tensors = {t.name: t for p in shard_files(Path(gguf_path)) for t in GGUFReader(p).tensors}
    diffusion = any(n.endswith("ssm_bd_scale") for n in tensors)
    out = []
    for spec in tensor_specs(ckpt.model, diffusion):
        t = tensors.get(spec.gguf)
        if t is None:
            out.append(TensorError(spec.gguf, "missing", float("inf"), 0.0))
            continue
        experts = None
        if isinstance(spec, ExpertSpec):
            n = ckpt.model.num_experts
            experts = sorted({round(i * (n - 1) / (EXPERTS_CHECKED - 1)) for i in range(EXPERTS_CHECKED)})
        want = source_of(ckpt, spec, experts).astype(np.float64)
        got = stored(t, experts)
        if got.size != want.size:
            out.append(TensorError(spec.gguf, t.tensor_type.name, float("inf"), 0.0))
            continue
        norm = np.linalg.norm(want)
        diff = np.linalg.norm(got.reshape(want.shape) - want)
        err = float(diff / norm) if norm > 0 else float(diff)
        out.append(TensorError(spec.gguf, t.tensor_type.name, err, BOUNDS.get(t.tensor_type)))
    return out


def check(gguf_path: str | Path, checkpoint_dir: str | Path) -> tuple[dict, list[str]]:
    """The `clover_local.checks` entry point: (report, failures) for `clover verify`."""
    errors = tensor_errors(gguf_path, checkpoint_dir)
    worst = max(errors, key=lambda e: e.error / e.bound if e.bound else 0.0, default=None)
    report = {
        "checked": len(errors),
        "failed": [e.__dict__ for e in errors if not e.passed],
        "worst": None if worst is None else worst.__dict__,
    }
    failures = [
        f"tensor {e.name}: missing or of another size than its checkpoint source"
        if e.error == float("inf")
        else f"tensor {e.name} ({e.type}): relative RMS error {e.error:.3g} vs its source > {e.bound:.3g}"
        for e in errors
        if not e.passed
    ]
    return report, failures
