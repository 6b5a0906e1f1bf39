"""The tensor plan: every GGUF tensor, where it comes from, how it is transformed, its type and size.

Built and validated completely before anything is written, so a bad checkpoint fails before an
output file exists, the GGUF header (which lists every tensor's type and offset) can be written
first, and `--dry-run` is just the plan printed. The tests read a converted file back through the
same name table (`tests/gguf_weights.py`), so the two directions cannot drift apart.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np
from gguf import GGMLQuantizationType

from clover_local.model.checkpoint import Checkpoint, to_float
from clover_local.model.config import CloverConfig
from clover_local.model.tensors import (
    DIFFUSION_SUFFIXES,
    EXPERT_STACKS,
    FIRST,
    LAST,
    TENSORS,
    Tensor,
    checkpoint_name,
    expected_shapes,
    gguf_name,
    layer_rows,
)

from .encode import Piece
from .errors import ConvertError
from .imatrix import Imatrix
from .mix import OutType, Role, choose, nbytes
from .transforms import TRANSFORMS, Transform, gate_up_split

PIECE_BYTES = 32 << 20  # source bytes per streamed row block of a large tensor
DROPPED_PREFIXES = ("mtp.",)  # multi-token-prediction head: not part of the clover-moe graph


@dataclass(frozen=True)
class TensorSpec:
    """One GGUF tensor made from one checkpoint tensor."""

    gguf: str
    source: str  # canonical checkpoint name
    transform: Transform
    role: Role
    layer: int | None = None


@dataclass(frozen=True)
class ExpertSpec:
    """One GGUF expert stack [E, rows, cols] made from all routed experts of a layer."""

    gguf: str
    layer: int
    part: str  # gate | up | down
    role: Role


def tensor_specs(cfg: CloverConfig, diffusion: bool) -> list[TensorSpec | ExpertSpec]:
    """Every GGUF tensor of a Clover model, in file order (the rows of `model.tensors.TENSORS`)."""

    def spec(t: Tensor, layer: int | None = None) -> TensorSpec:
        return TensorSpec(
            gguf_name(t, layer), checkpoint_name(t, layer), TRANSFORMS[t.transform], Role(t.role), layer
        )

    specs: list[TensorSpec | ExpertSpec] = [spec(t) for t in TENSORS if t.part == FIRST]
    for layer in range(cfg.num_hidden_layers):
        specs += [spec(t, layer) for t in layer_rows(cfg, layer, diffusion)]
        for part, name in EXPERT_STACKS.items():
            role = Role.EXPERTS_DOWN if part == "down" else Role.EXPERTS
            specs.append(ExpertSpec(name.format(bid=layer), layer, part, role))
    tied = cfg.tie_word_embeddings
    specs += [spec(t) for t in TENSORS if t.part == LAST and not (tied and t.checkpoint == "lm_head.weight")]
    return specs


@dataclass(frozen=True)
class PlannedTensor:
    """A GGUF tensor with its final type, size and a generator of its rows."""

    name: str
    shape: tuple[int, ...]  # numpy order (ggml ne reversed)
    qtype: GGMLQuantizationType
    source: str  # for the dry-run listing
    source_bytes: int
    pieces: Callable[[], Iterator[Piece]]

    @property
    def nbytes(self) -> int:
        return nbytes(self.qtype, self.shape)


@dataclass(frozen=True)
class Plan:
    tensors: list[PlannedTensor]
    dropped: list[str]  # checkpoint tensors deliberately not converted
    diffusion: bool

    @property
    def nbytes(self) -> int:
        return sum(t.nbytes for t in self.tensors)

    @property
    def source_bytes(self) -> int:
        return sum(t.source_bytes for t in self.tensors)


def validate(ckpt: Checkpoint, ar_only: bool) -> tuple[bool, list[str]]:
    """Check names and shapes against the config; return (write diffusion tensors, dropped names)."""
    cfg = ckpt.model
    if not ckpt.has_diffusion_tensors and not ar_only:
        raise ConvertError(
            "checkpoint has no block-diffusion tensors (linear_attn.conv_right_weight, bd_softmax_*): "
            "pass --ar-only to convert it for left-to-right decoding only"
        )
    diffusion = ckpt.has_diffusion_tensors and not ar_only
    expected = expected_shapes(cfg, fused_experts=ckpt.fused_experts, diffusion=ckpt.has_diffusion_tensors)
    dropped = sorted(n for n in ckpt.names() if n.startswith(DROPPED_PREFIXES))
    present = set(ckpt.names()) - set(dropped)
    unknown = sorted(present - set(expected))
    if unknown:
        raise ConvertError(f"unknown tensor {ckpt.entries[unknown[0]].key}" + _more(unknown))
    missing = [n for n in expected if n not in present]
    if missing:
        raise ConvertError(f"missing tensor {missing[0]}" + _more(missing))
    for name, want in expected.items():
        got = ckpt.entries[name].shape
        if got != tuple(want) and not (_is_conv_right(name) and got == (want[0], 1, want[1])):
            raise ConvertError(
                f"tensor {ckpt.entries[name].key} has shape {list(got)}, config.json implies {list(want)}"
            )
    if ar_only:
        dropped += sorted(n for n in present if _is_diffusion(n))
    return diffusion, dropped


def build_plan(ckpt: Checkpoint, out: OutType, ar_only: bool = False, imatrix: Imatrix | None = None) -> Plan:
    """Validate the checkpoint and plan every output tensor."""
    diffusion, dropped = validate(ckpt, ar_only)
    cfg = ckpt.model
    tensors = []
    for spec in tensor_specs(cfg, diffusion):
        if isinstance(spec, ExpertSpec):
            tensors.append(_plan_experts(ckpt, spec, out, imatrix))
        else:
            tensors.append(_plan_tensor(ckpt, spec, out, imatrix))
    return Plan(tensors, dropped, diffusion)


def _plan_tensor(ckpt: Checkpoint, spec: TensorSpec, out: OutType, imatrix: Imatrix | None) -> PlannedTensor:
    cfg = ckpt.model
    entry = ckpt.entries[spec.source]
    shape = _output_shape(spec, entry.shape)
    qtype = choose(out, spec.role, shape[-1], spec.layer, cfg.num_hidden_layers, cfg.tie_word_embeddings)
    imat = imatrix.weights(spec.gguf, shape[-1], 1) if imatrix is not None and _quantized(qtype) else None

    def forward(a: np.ndarray) -> np.ndarray:
        return spec.transform.forward(to_float(a, entry.dtype) if spec.transform.numeric else a, cfg)

    def pieces() -> Iterator[Piece]:
        raw = ckpt.raw(spec.source)
        imp = None if imat is None else imat[0]
        if spec.transform.row_local and raw.ndim == 2:
            step = max(1, PIECE_BYTES // max(1, raw[0].nbytes))
            for r in range(0, raw.shape[0], step):
                block = raw[r : r + step]
                yield Piece(forward(block), imp, block)
        else:
            yield Piece(forward(raw).reshape(-1, shape[-1]), imp, raw)

    return PlannedTensor(spec.gguf, shape, qtype, spec.source, entry.end - entry.start, pieces)


def _plan_experts(ckpt: Checkpoint, spec: ExpertSpec, out: OutType, imatrix: Imatrix | None) -> PlannedTensor:
    cfg = ckpt.model
    n_e, inter, h = cfg.num_experts, cfg.moe_intermediate_size, cfg.hidden_size
    shape = (n_e, h, inter) if spec.part == "down" else (n_e, inter, h)
    qtype = choose(out, spec.role, shape[-1], spec.layer, cfg.num_hidden_layers, cfg.tie_word_embeddings)
    imat = imatrix.weights(spec.gguf, shape[-1], n_e) if imatrix is not None and _quantized(qtype) else None
    pre = f"layers.{spec.layer}.mlp.experts."
    if ckpt.fused_experts:
        fused = pre + ("down_proj" if spec.part == "down" else "gate_up_proj")
        source, source_bytes = fused, _nbytes(ckpt, fused) // (1 if spec.part == "down" else 2)
    else:
        source = f"{pre}{{0..{n_e - 1}}}.{spec.part}_proj.weight"
        source_bytes = sum(_nbytes(ckpt, f"{pre}{e}.{spec.part}_proj.weight") for e in range(n_e))

    def pieces() -> Iterator[Piece]:
        for e in range(n_e):
            if not ckpt.fused_experts:
                rows = ckpt.raw(f"{pre}{e}.{spec.part}_proj.weight")
            elif spec.part == "down":
                rows = ckpt.raw(pre + "down_proj")[e]
            else:
                gate, up = gate_up_split(ckpt.raw(pre + "gate_up_proj")[e])
                rows = gate if spec.part == "gate" else up
            yield Piece(rows, None if imat is None else imat[e], rows)

    return PlannedTensor(spec.gguf, shape, qtype, source, source_bytes, pieces)


def _output_shape(spec: TensorSpec, shape: tuple[int, ...]) -> tuple[int, ...]:
    if spec.transform.name in ("conv_squeeze", "conv_right"):
        return (shape[0], shape[-1])
    return shape


def _nbytes(ckpt: Checkpoint, name: str) -> int:
    e = ckpt.entries[name]
    return e.end - e.start


def _quantized(qtype: GGMLQuantizationType) -> bool:
    return qtype not in (GGMLQuantizationType.F32, GGMLQuantizationType.F16, GGMLQuantizationType.BF16)


def _is_diffusion(name: str) -> bool:
    return name.rsplit(".", 1)[-1] in DIFFUSION_SUFFIXES


def _is_conv_right(name: str) -> bool:
    return name.endswith("conv_right_weight")


def _more(names: list[str]) -> str:
    return f" (and {len(names) - 1} more)" if len(names) > 1 else ""
