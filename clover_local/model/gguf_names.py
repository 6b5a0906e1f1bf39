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


# -- trunk hyperparameters: the converter writes them with gguf-py's adders (its `Keys`); these are
# the ones the runtime reads, and the one gguf-py has no name for
BLOCK_COUNT = key("block_count")
RECURRENT_LAYERS = key("attention.recurrent_layers")

# -- block diffusion (absent from --ar-only files); the decoding parameters' keys
# (`clover-moe.diffusion.<name>`, the previews' coreset among them) come from their table,
# `decoding_parameters`
DIFFUSION_EOS_TOKEN_IDS = key("diffusion.eos_token_ids")
MASK_TOKEN_ID = "tokenizer.ggml.mask_token_id"
