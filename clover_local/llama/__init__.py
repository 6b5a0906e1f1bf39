"""llama.cpp backend: ctypes bindings of the Clover C API and the engine."""

from __future__ import annotations


def unavailable() -> str | None:
    """Why the patched llama.cpp runtime cannot be used here, or None when it can."""
    try:
        from . import capi
    except (ImportError, OSError) as e:
        return f"llama-cpp-python is not importable ({e}); run `make install`"
    if not capi.PATCHED:
        return "the installed llama-cpp-python lacks the Clover patch series; run `make install`"
    return None
