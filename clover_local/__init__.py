"""clover-local: run the Clover-35B-A3B block-diffusion model locally (llama.cpp, quantized)."""

__version__ = "0.1.0"
