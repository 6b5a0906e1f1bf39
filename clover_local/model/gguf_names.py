"""GGUF key names of the `clover-moe` architecture: the one list both the converter and the runtime read.

Trunk keys are upstream llama.cpp's `qwen35moe` ones under the `clover-moe.` prefix; the
block-diffusion keys are Clover's additions (docs/design.md, "GGUF format"). Tensor names are in
`tensors`, the decoding parameters' keys in `decoding_parameters`.
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

# -- block diffusion (absent from --ar-only files); the decoding parameters' keys
# (`clover-moe.diffusion.<name>`) come from their table, `decoding_parameters`
DIFFUSION_CORESET_ENABLED = key("diffusion.coreset_enabled")
DIFFUSION_CORESET_TOP_P = key("diffusion.coreset_top_p")
DIFFUSION_EOS_TOKEN_IDS = key("diffusion.eos_token_ids")
MASK_TOKEN_ID = "tokenizer.ggml.mask_token_id"
