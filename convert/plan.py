"""The tensor plan: every GGUF tensor, where it comes from, how it is transformed, its type and size.

Built and validated completely before anything is written, so a bad checkpoint fails before an
output file exists, the GGUF header (which lists every tensor's type and offset) can be written
first, and `--dry-run` is just the plan printed. The same name table drives the inverse
(`gguf_weights`), so the two directions cannot drift apart.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np
from gguf import GGMLQuantizationType

from clover_local.model import gguf_names as gn
from clover_local.model.checkpoint import CLOVER_GDN_EXTRAS, Checkpoint, expected_shapes, to_float
from clover_local.model.config import CloverConfig

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


def _layer_table(cfg: CloverConfig, layer: int, diffusion: bool) -> list[tuple[str, str, str, Role]]:
    """(GGUF suffix, checkpoint suffix, transform, role) of one layer's non-expert tensors."""
    rows: list[tuple[str, str, str, Role]] = [
        (gn.ATTN_NORM, "input_layernorm.weight", "norm_plus_one", Role.F32),
        (gn.POST_ATTENTION_NORM, "post_attention_layernorm.weight", "norm_plus_one", Role.F32),
    ]
    if cfg.is_attention[layer]:
        rows += [
            (gn.ATTN_Q, "self_attn.q_proj.weight", "identity", Role.PROJ),  # query|gate per head, as upstream
            (gn.ATTN_K, "self_attn.k_proj.weight", "identity", Role.PROJ),
            (gn.ATTN_V, "self_attn.v_proj.weight", "identity", Role.PROJ),
            (gn.ATTN_OUTPUT, "self_attn.o_proj.weight", "identity", Role.PROJ),
            (gn.ATTN_Q_NORM, "self_attn.q_norm.weight", "norm_plus_one", Role.F32),
            (gn.ATTN_K_NORM, "self_attn.k_norm.weight", "norm_plus_one", Role.F32),
        ]
    else:
        la = "linear_attn."
        rows += [
            (gn.ATTN_QKV, la + "in_proj_qkv.weight", "qkv_rows", Role.PROJ),
            (gn.ATTN_GATE, la + "in_proj_z.weight", "channel_rows", Role.PROJ),
            (gn.SSM_BETA, la + "in_proj_b.weight", "head_rows", Role.PROJ),
            (gn.SSM_ALPHA, la + "in_proj_a.weight", "head_rows", Role.PROJ),
            (gn.SSM_CONV1D, la + "conv1d.weight", "conv_squeeze", Role.F32),
            (gn.SSM_DT_BIAS, la + "dt_bias", "head_rows", Role.F32),
            (gn.SSM_A, la + "A_log", "a_log", Role.F32),
            (gn.SSM_NORM, la + "norm.weight", "identity", Role.F32),
            (gn.SSM_OUT, la + "out_proj.weight", "channel_cols", Role.PROJ),
        ]
        if diffusion:
            rows += [
                (gn.SSM_CONV1D_RIGHT, la + "conv_right_weight", "conv_right", Role.F32),
                (gn.SSM_BD_SCALE, la + "bd_softmax_logit_scale", "head_rows", Role.F32),
                (gn.SSM_BD_HIST_BIAS, la + "bd_softmax_history_bias", "head_rows", Role.F32),
                (gn.SSM_BD_HIST_C, la + "bd_softmax_history_c", "head_rows", Role.F32),
            ]
    m = "mlp."
    rows += [
        (gn.FFN_GATE_INP, m + "gate.weight", "identity", Role.F32),
        (gn.FFN_GATE_INP_SHEXP, m + "shared_expert_gate.weight", "identity", Role.F32),
        (gn.FFN_GATE_SHEXP, m + "shared_expert.gate_proj.weight", "identity", Role.PROJ),
        (gn.FFN_UP_SHEXP, m + "shared_expert.up_proj.weight", "identity", Role.PROJ),
        (gn.FFN_DOWN_SHEXP, m + "shared_expert.down_proj.weight", "identity", Role.PROJ),
    ]
    return rows


def tensor_specs(cfg: CloverConfig, diffusion: bool) -> list[TensorSpec | ExpertSpec]:
    """Every GGUF tensor of a Clover model, in file order."""
    specs: list[TensorSpec | ExpertSpec] = [
        TensorSpec(gn.TOKEN_EMBD, "embed_tokens.weight", TRANSFORMS["identity"], Role.EMBED)
    ]
    for layer in range(cfg.num_hidden_layers):
        for suffix, source, transform, role in _layer_table(cfg, layer, diffusion):
            specs.append(
                TensorSpec(
                    gn.blk(layer, suffix), f"layers.{layer}.{source}", TRANSFORMS[transform], role, layer
                )
            )
        specs += [
            ExpertSpec(gn.blk(layer, gn.FFN_GATE_EXPS), layer, "gate", Role.EXPERTS),
            ExpertSpec(gn.blk(layer, gn.FFN_UP_EXPS), layer, "up", Role.EXPERTS),
            ExpertSpec(gn.blk(layer, gn.FFN_DOWN_EXPS), layer, "down", Role.EXPERTS_DOWN),
        ]
    specs.append(TensorSpec(gn.OUTPUT_NORM, "norm.weight", TRANSFORMS["norm_plus_one"], Role.F32))
    if not cfg.tie_word_embeddings:
        specs.append(TensorSpec(gn.OUTPUT, "lm_head.weight", TRANSFORMS["identity"], Role.OUTPUT))
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
    return name.rsplit(".", 1)[-1] in CLOVER_GDN_EXTRAS


def _is_conv_right(name: str) -> bool:
    return name.endswith("conv_right_weight")


def _more(names: list[str]) -> str:
    return f" (and {len(names) - 1} more)" if len(names) > 1 else ""
