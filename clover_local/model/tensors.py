"""Every tensor of a Clover model, declared once: its GGUF name, its checkpoint name, its checkpoint
shape, and how the converter transforms and types it.

The trunk's GGUF names are gguf-py's (`gguf.TENSOR_NAMES` of `gguf.MODEL_TENSORS[QWEN35MOE]`):
`clover-moe` stores them exactly as upstream's `qwen35moe`. Clover's four preview tensors per GDN
layer are its own (docs/model.md 2). The checkpoint reader's expected shapes, the converter's plan
and the GGUF checks all come from `TENSORS`; adding a tensor is one row here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from gguf import MODEL_ARCH, MODEL_TENSOR, MODEL_TENSORS, TENSOR_NAMES

from .config import CloverConfig

Shape = Callable[[CloverConfig], tuple[int, ...]]

# where a row sits: before the layers, in every layer, in attention / GDN layers (`diffusion`: GDN
# layers of files that keep the preview tensors), after the MoE router, after the layers
FIRST, LAYER, ATTENTION, GDN, DIFFUSION, MLP, LAST = (
    "first",
    "layer",
    "attention",
    "gdn",
    "diffusion",
    "mlp",
    "last",
)
LAYER_PARTS = (LAYER, ATTENTION, GDN, DIFFUSION, MLP)


@dataclass(frozen=True)
class Tensor:
    """One row: `{bid}` in a name stands for the layer."""

    part: str
    gguf: str
    checkpoint: str  # canonical: prefix stripped (`model.checkpoint.canonical_name`)
    shape: Shape  # in the checkpoint
    transform: str  # a `clover_convert.transforms.TRANSFORMS` key
    role: str  # a `clover_convert.mix.Role` value: how the converter picks its type


def _trunk(t: MODEL_TENSOR, suffix: str = ".weight") -> str:
    if t not in MODEL_TENSORS[MODEL_ARCH.QWEN35MOE]:
        raise AssertionError(f"{t.name} is not a qwen35moe tensor")
    return TENSOR_NAMES[t] + suffix


def _q(c: CloverConfig) -> int:
    return c.num_attention_heads * c.head_dim


def _kv(c: CloverConfig) -> int:
    return c.num_key_value_heads * c.head_dim


T = MODEL_TENSOR
LA, SA, M = "layers.{bid}.linear_attn.", "layers.{bid}.self_attn.", "layers.{bid}.mlp."
TENSORS: tuple[Tensor, ...] = (
    Tensor(FIRST, _trunk(T.TOKEN_EMBD), "embed_tokens.weight", lambda c: (c.vocab_size, c.hidden_size), "identity", "embed"),
    Tensor(LAYER, _trunk(T.ATTN_NORM), "layers.{bid}.input_layernorm.weight", lambda c: (c.hidden_size,), "norm_plus_one", "f32"),
    Tensor(LAYER, _trunk(T.ATTN_POST_NORM), "layers.{bid}.post_attention_layernorm.weight", lambda c: (c.hidden_size,), "norm_plus_one", "f32"),
    # query|gate interleaved per head, as upstream
    Tensor(ATTENTION, _trunk(T.ATTN_Q), SA + "q_proj.weight", lambda c: (2 * _q(c), c.hidden_size), "identity", "proj"),
    Tensor(ATTENTION, _trunk(T.ATTN_K), SA + "k_proj.weight", lambda c: (_kv(c), c.hidden_size), "identity", "proj"),
    Tensor(ATTENTION, _trunk(T.ATTN_V), SA + "v_proj.weight", lambda c: (_kv(c), c.hidden_size), "identity", "proj"),
    Tensor(ATTENTION, _trunk(T.ATTN_OUT), SA + "o_proj.weight", lambda c: (c.hidden_size, _q(c)), "identity", "proj"),
    Tensor(ATTENTION, _trunk(T.ATTN_Q_NORM), SA + "q_norm.weight", lambda c: (c.head_dim,), "norm_plus_one", "f32"),
    Tensor(ATTENTION, _trunk(T.ATTN_K_NORM), SA + "k_norm.weight", lambda c: (c.head_dim,), "norm_plus_one", "f32"),
    Tensor(GDN, _trunk(T.ATTN_QKV), LA + "in_proj_qkv.weight", lambda c: (c.conv_dim, c.hidden_size), "qkv_rows", "proj"),
    Tensor(GDN, _trunk(T.ATTN_GATE), LA + "in_proj_z.weight", lambda c: (c.value_dim, c.hidden_size), "channel_rows", "proj"),
    Tensor(GDN, _trunk(T.SSM_BETA), LA + "in_proj_b.weight", lambda c: (c.linear_num_value_heads, c.hidden_size), "head_rows", "proj"),
    Tensor(GDN, _trunk(T.SSM_ALPHA), LA + "in_proj_a.weight", lambda c: (c.linear_num_value_heads, c.hidden_size), "head_rows", "proj"),
    Tensor(GDN, _trunk(T.SSM_CONV1D), LA + "conv1d.weight", lambda c: (c.conv_dim, 1, c.linear_conv_kernel_dim), "conv_squeeze", "f32"),
    Tensor(GDN, _trunk(T.SSM_DT, ".bias"), LA + "dt_bias", lambda c: (c.linear_num_value_heads,), "head_rows", "f32"),
    Tensor(GDN, _trunk(T.SSM_A, ""), LA + "A_log", lambda c: (c.linear_num_value_heads,), "a_log", "f32"),
    Tensor(GDN, _trunk(T.SSM_NORM), LA + "norm.weight", lambda c: (c.linear_value_head_dim,), "identity", "f32"),
    Tensor(GDN, _trunk(T.SSM_OUT), LA + "out_proj.weight", lambda c: (c.hidden_size, c.value_dim), "channel_cols", "proj"),
    # Clover's preview tensors: names [public], placement and shapes [ours]
    Tensor(DIFFUSION, "blk.{bid}.ssm_conv1d_right.weight", LA + "conv_right_weight", lambda c: (c.conv_dim, c.linear_conv_kernel_dim - 1), "conv_right", "f32"),
    Tensor(DIFFUSION, "blk.{bid}.ssm_bd_scale", LA + "bd_softmax_logit_scale", lambda c: (c.linear_num_value_heads,), "head_rows", "f32"),
    Tensor(DIFFUSION, "blk.{bid}.ssm_bd_hist_bias", LA + "bd_softmax_history_bias", lambda c: (c.linear_num_value_heads,), "head_rows", "f32"),
    Tensor(DIFFUSION, "blk.{bid}.ssm_bd_hist_c", LA + "bd_softmax_history_c", lambda c: (c.linear_num_value_heads,), "head_rows", "f32"),
    Tensor(MLP, _trunk(T.FFN_GATE_INP), M + "gate.weight", lambda c: (c.num_experts, c.hidden_size), "identity", "f32"),
    Tensor(MLP, _trunk(T.FFN_GATE_INP_SHEXP), M + "shared_expert_gate.weight", lambda c: (1, c.hidden_size), "identity", "f32"),
    Tensor(MLP, _trunk(T.FFN_GATE_SHEXP), M + "shared_expert.gate_proj.weight", lambda c: (c.shared_expert_intermediate_size, c.hidden_size), "identity", "proj"),
    Tensor(MLP, _trunk(T.FFN_UP_SHEXP), M + "shared_expert.up_proj.weight", lambda c: (c.shared_expert_intermediate_size, c.hidden_size), "identity", "proj"),
    Tensor(MLP, _trunk(T.FFN_DOWN_SHEXP), M + "shared_expert.down_proj.weight", lambda c: (c.hidden_size, c.shared_expert_intermediate_size), "identity", "proj"),
    Tensor(LAST, _trunk(T.OUTPUT_NORM), "norm.weight", lambda c: (c.hidden_size,), "norm_plus_one", "f32"),
    Tensor(LAST, _trunk(T.OUTPUT), "lm_head.weight", lambda c: (c.vocab_size, c.hidden_size), "identity", "output"),
)  # fmt: skip

# routed experts: GGUF stacks [E, rows, cols] per part; the checkpoint fuses gate and up
# (`gate_up_proj` [E, 2I, H], `down_proj` [E, H, I]) or stores one module per expert
EXPERT_STACKS = {
    "gate": _trunk(T.FFN_GATE_EXP),
    "up": _trunk(T.FFN_UP_EXP),
    "down": _trunk(T.FFN_DOWN_EXP),
}
DIFFUSION_SUFFIXES = tuple(t.checkpoint.rsplit(".", 1)[-1] for t in TENSORS if t.part == DIFFUSION)
DIFFUSION_GGUF = tuple(t.gguf.removeprefix("blk.{bid}.") for t in TENSORS if t.part == DIFFUSION)


def layer_rows(cfg: CloverConfig, layer: int, diffusion: bool) -> list[Tensor]:
    """The rows of one layer in file order: norms, its mixer's (and the preview tensors), the MoE."""
    mixer = ATTENTION if cfg.is_attention[layer] else GDN
    parts = {LAYER, mixer, MLP} | ({DIFFUSION} if diffusion and mixer == GDN else set())
    return [t for t in TENSORS if t.part in parts]


def gguf_name(t: Tensor, layer: int | None = None) -> str:
    return t.gguf.format(bid=layer)


def checkpoint_name(t: Tensor, layer: int | None = None) -> str:
    return t.checkpoint.format(bid=layer)


def expected_shapes(
    cfg: CloverConfig, fused_experts: bool = True, diffusion: bool = True
) -> dict[str, tuple]:
    """Canonical name -> shape of every tensor of a Clover checkpoint, as the publisher stores it."""
    out = {t.checkpoint: t.shape(cfg) for t in TENSORS if t.part in (FIRST, LAST)}
    if cfg.tie_word_embeddings:
        del out["lm_head.weight"]
    n_e, inter, h = cfg.num_experts, cfg.moe_intermediate_size, cfg.hidden_size
    for i in range(cfg.num_hidden_layers):
        out |= {checkpoint_name(t, i): t.shape(cfg) for t in layer_rows(cfg, i, diffusion)}
        m = M.format(bid=i)
        if fused_experts:
            out[m + "experts.gate_up_proj"] = (n_e, 2 * inter, h)
            out[m + "experts.down_proj"] = (n_e, h, inter)
        else:
            for e in range(n_e):
                out[f"{m}experts.{e}.gate_proj.weight"] = (inter, h)
                out[f"{m}experts.{e}.up_proj.weight"] = (inter, h)
                out[f"{m}experts.{e}.down_proj.weight"] = (h, inter)
    return out


def gdn_layers(names: set[str], n_layers: int) -> list[int]:
    """The GDN layers of a GGUF, from its tensor names (the layers with a conv weight)."""
    conv = _trunk(T.SSM_CONV1D)
    return [i for i in range(n_layers) if conv.format(bid=i) in names]


def missing_diffusion_tensors(names: set[str], layers: list[int]) -> list[str]:
    """The preview tensors of these GDN layers that a GGUF (its tensor names) lacks."""
    rows = [t for t in TENSORS if t.part == DIFFUSION]
    return [gguf_name(t, i) for i in layers for t in rows if gguf_name(t, i) not in names]
