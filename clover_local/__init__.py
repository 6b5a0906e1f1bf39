"""clover-local: run the Clover-35B-A3B block-diffusion model locally (llama.cpp, quantized)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .guard import ClosedError
from .rpc import RpcError

if TYPE_CHECKING:
    from .api import Clover

__version__ = "0.1.0"
__all__ = ["ClosedError", "Clover", "RpcError", "__version__"]


def __getattr__(name: str) -> Any:
    """`clover_local.Clover`, imported on first use so the converter never loads the runtime."""
    if name == "Clover":
        from .api import Clover

        return Clover
    raise AttributeError(f"module 'clover_local' has no attribute {name!r}")
