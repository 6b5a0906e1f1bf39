"""Output types: which ggml type each tensor gets for an `--outtype`.

Mirrors llama.cpp's `llama-quant.cpp` where it applies to this model: tensors llama-quantize never
quantizes stay F32 (norms, biases, `ssm_a`, the router, conv weights, and here the block-diffusion
scalars), `output.weight` gets Q6_K, `ffn_down_exps` gets the k-quant mixes' extra bits on the
same layers (`use_more_bits`), and a row length that does not fit the block size falls back the
same way. Attention, GDN and shared-expert projections (about 5% of the weights, every token's
path) get the mix's higher type; routed experts get the main type.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, LlamaFileType

Q = GGMLQuantizationType


class Role(enum.Enum):
    """What a tensor is, as far as choosing its type goes."""

    F32 = "f32"  # always float32
    EMBED = "embed"
    OUTPUT = "output"
    PROJ = "proj"  # attention / GDN / shared-expert projections
    EXPERTS = "experts"  # routed gate / up
    EXPERTS_DOWN = "experts_down"


@dataclass(frozen=True)
class OutType:
    """An `--outtype`: its main (routed experts) and higher (projections) ggml types."""

    name: str
    main: GGMLQuantizationType
    high: GGMLQuantizationType
    file_type: LlamaFileType

    @property
    def quantized(self) -> bool:
        return self.main not in (Q.F32, Q.F16, Q.BF16)


OUTTYPES: dict[str, OutType] = {
    t.name: t
    for t in (
        OutType("f32", Q.F32, Q.F32, LlamaFileType.ALL_F32),
        OutType("f16", Q.F16, Q.F16, LlamaFileType.MOSTLY_F16),
        OutType("bf16", Q.BF16, Q.BF16, LlamaFileType.MOSTLY_BF16),
        OutType("q8_0", Q.Q8_0, Q.Q8_0, LlamaFileType.MOSTLY_Q8_0),
        OutType("q6_k", Q.Q6_K, Q.Q6_K, LlamaFileType.MOSTLY_Q6_K),
        OutType("q5_k_m", Q.Q5_K, Q.Q6_K, LlamaFileType.MOSTLY_Q5_K_M),
        OutType("q4_k_m", Q.Q4_K, Q.Q6_K, LlamaFileType.MOSTLY_Q4_K_M),
        OutType("q4_k_s", Q.Q4_K, Q.Q5_K, LlamaFileType.MOSTLY_Q4_K_S),
        OutType("q3_k_m", Q.Q3_K, Q.Q5_K, LlamaFileType.MOSTLY_Q3_K_M),
    )
}

# llama-quant.cpp `tensor_type_fallback`: a 256-block type whose rows do not fit
_FALLBACK = {Q.Q3_K: Q.Q4_0, Q.Q4_K: Q.Q5_0, Q.Q5_K: Q.Q5_1, Q.Q6_K: Q.Q8_0}


def use_more_bits(layer: int, n_layers: int) -> bool:
    """llama-quant.cpp's choice of layers that get more bits (first/last eighth, every third)."""
    return layer < n_layers // 8 or layer >= 7 * n_layers // 8 or (layer - n_layers // 8) % 3 == 2


def _down_exps(out: OutType, layer: int, n_layers: int) -> GGMLQuantizationType:
    """llama-quant.cpp's FFN_DOWN rule of the k-quant mixes."""
    if out.name in ("q4_k_m", "q5_k_m") and use_more_bits(layer, n_layers):
        return Q.Q6_K
    if out.name == "q4_k_s" and layer < n_layers // 8:
        return Q.Q5_K
    if out.name == "q3_k_m":
        return Q.Q5_K if layer < n_layers // 16 else Q.Q4_K
    return out.main


def choose(
    out: OutType, role: Role, ne0: int, layer: int | None, n_layers: int, tied: bool
) -> GGMLQuantizationType:
    """The ggml type of one tensor whose rows hold `ne0` values."""
    if role is Role.F32:
        return Q.F32
    if not out.quantized:
        return out.main
    if role is Role.OUTPUT or (role is Role.EMBED and tied):
        # llama-quant: Q6_K, or Q8_0 where Q8_0 is asked for or rows do not fit 256-blocks
        return Q.Q8_0 if out.main == Q.Q8_0 or ne0 % GGML_QUANT_SIZES[Q.Q6_K][0] else Q.Q6_K
    if role is Role.PROJ:
        wanted = out.high
    elif role is Role.EXPERTS_DOWN:
        wanted = _down_exps(out, layer or 0, n_layers)
    else:
        wanted = out.main
    return fit(wanted, ne0)


def fit(qtype: GGMLQuantizationType, ne0: int) -> GGMLQuantizationType:
    """llama-quantize's fallback for rows not divisible by the block size (last resort F16)."""
    if ne0 % GGML_QUANT_SIZES[qtype][0] == 0:
        return qtype
    qtype = _FALLBACK.get(qtype, qtype)
    return qtype if ne0 % GGML_QUANT_SIZES[qtype][0] == 0 else Q.F16


def nbytes(qtype: GGMLQuantizationType, shape: tuple[int, ...]) -> int:
    """Bytes of a tensor of numpy `shape` stored as `qtype`."""
    block, size = GGML_QUANT_SIZES[qtype]
    rows = 1
    for d in shape[:-1]:
        rows *= d
    return rows * (shape[-1] // block) * size
