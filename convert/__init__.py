"""clover-convert: a Clover safetensors checkpoint to GGUF, every diffusion tensor kept."""
