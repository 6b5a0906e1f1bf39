"""GGUF names of the `clover-moe` architecture: the one list both the converter and the runtime read.

Trunk keys and tensors are upstream llama.cpp's `qwen35moe` ones under the `clover-moe.` prefix;
the block-diffusion keys and the four per-GDN-layer tensors are Clover's additions
(docs/design.md, "GGUF format").
"""

from __future__ import annotations

ARCH = "clover-moe"


def key(suffix: str) -> str:
    """An architecture key: `key("block_count")` -> `clover-moe.block_count`."""
    return f"{ARCH}.{suffix}"


# -- trunk hyperparameters (qwen35moe key set) --------------------------------------------------
BLOCK_COUNT = key("block_count")
CONTEXT_LENGTH = key("context_length")
EMBEDDING_LENGTH = key("embedding_length")
FEED_FORWARD_LENGTH = key("feed_forward_length")
HEAD_COUNT = key("attention.head_count")
HEAD_COUNT_KV = key("attention.head_count_kv")
KEY_LENGTH = key("attention.key_length")
VALUE_LENGTH = key("attention.value_length")
RMS_EPS = key("attention.layer_norm_rms_epsilon")
RECURRENT_LAYERS = key("attention.recurrent_layers")
ROPE_FREQ_BASE = key("rope.freq_base")
ROPE_DIMENSION_COUNT = key("rope.dimension_count")
ROPE_DIMENSION_SECTIONS = key("rope.dimension_sections")
EXPERT_COUNT = key("expert_count")
EXPERT_USED_COUNT = key("expert_used_count")
EXPERT_FEED_FORWARD_LENGTH = key("expert_feed_forward_length")
EXPERT_SHARED_FEED_FORWARD_LENGTH = key("expert_shared_feed_forward_length")
SSM_CONV_KERNEL = key("ssm.conv_kernel")
SSM_STATE_SIZE = key("ssm.state_size")
SSM_GROUP_COUNT = key("ssm.group_count")
SSM_TIME_STEP_RANK = key("ssm.time_step_rank")
SSM_INNER_SIZE = key("ssm.inner_size")
FULL_ATTENTION_INTERVAL = key("full_attention_interval")

# -- block diffusion (absent from --ar-only files) ----------------------------------------------
DIFFUSION_BLOCK_SIZE = key("diffusion.block_size")
DIFFUSION_THRESHOLD = key("diffusion.threshold")
DIFFUSION_LOGIT_SHIFT = key("diffusion.logit_shift")
DIFFUSION_CORESET_ENABLED = key("diffusion.coreset_enabled")
DIFFUSION_CORESET_TOP_P = key("diffusion.coreset_top_p")
DIFFUSION_MAX_NEW_TOKENS = key("diffusion.max_new_tokens")
DIFFUSION_PRESENCE_PENALTY = key("diffusion.presence_penalty")
DIFFUSION_FREQUENCY_PENALTY = key("diffusion.frequency_penalty")
DIFFUSION_REPETITION_PENALTY = key("diffusion.repetition_penalty")
DIFFUSION_STOP_RAMP_START = key("diffusion.stop_ramp_start")
DIFFUSION_STOP_RAMP_MAX = key("diffusion.stop_ramp_max")
DIFFUSION_THINK_RAMP_START = key("diffusion.think_ramp_start")
DIFFUSION_THINK_RAMP_MAX = key("diffusion.think_ramp_max")
DIFFUSION_EOS_TOKEN_IDS = key("diffusion.eos_token_ids")
MASK_TOKEN_ID = "tokenizer.ggml.mask_token_id"

# -- tensors ------------------------------------------------------------------------------------
TOKEN_EMBD = "token_embd.weight"
OUTPUT_NORM = "output_norm.weight"
OUTPUT = "output.weight"

# per-layer suffixes: blk.N.<suffix>
ATTN_NORM = "attn_norm.weight"
POST_ATTENTION_NORM = "post_attention_norm.weight"
ATTN_Q = "attn_q.weight"
ATTN_K = "attn_k.weight"
ATTN_V = "attn_v.weight"
ATTN_OUTPUT = "attn_output.weight"
ATTN_Q_NORM = "attn_q_norm.weight"
ATTN_K_NORM = "attn_k_norm.weight"
ATTN_QKV = "attn_qkv.weight"
ATTN_GATE = "attn_gate.weight"
SSM_CONV1D = "ssm_conv1d.weight"
SSM_DT_BIAS = "ssm_dt.bias"
SSM_A = "ssm_a"
SSM_BETA = "ssm_beta.weight"
SSM_ALPHA = "ssm_alpha.weight"
SSM_NORM = "ssm_norm.weight"
SSM_OUT = "ssm_out.weight"
FFN_GATE_INP = "ffn_gate_inp.weight"
FFN_GATE_EXPS = "ffn_gate_exps.weight"
FFN_UP_EXPS = "ffn_up_exps.weight"
FFN_DOWN_EXPS = "ffn_down_exps.weight"
FFN_GATE_INP_SHEXP = "ffn_gate_inp_shexp.weight"
FFN_GATE_SHEXP = "ffn_gate_shexp.weight"
FFN_UP_SHEXP = "ffn_up_shexp.weight"
FFN_DOWN_SHEXP = "ffn_down_shexp.weight"
# Clover's block-diffusion tensors
SSM_CONV1D_RIGHT = "ssm_conv1d_right.weight"
SSM_BD_SCALE = "ssm_bd_scale"
SSM_BD_HIST_BIAS = "ssm_bd_hist_bias"
SSM_BD_HIST_C = "ssm_bd_hist_c"
DIFFUSION_TENSORS = (SSM_CONV1D_RIGHT, SSM_BD_SCALE, SSM_BD_HIST_BIAS, SSM_BD_HIST_C)


def blk(layer: int, suffix: str) -> str:
    """A per-layer tensor name: `blk(3, ATTN_Q)` -> `blk.3.attn_q.weight`."""
    return f"blk.{layer}.{suffix}"
