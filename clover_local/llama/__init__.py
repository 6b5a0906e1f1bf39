"""llama.cpp backend: ctypes bindings of the Clover C API and the engine."""

from __future__ import annotations


def unavailable() -> str | None:
    """Why the patched llama.cpp runtime cannot be used here, or None when it can."""
    try:
        from . import capi
    except (ImportError, OSError) as e:
        return f"llama-cpp-python is not importable ({e}); run `make install`"
    if capi.INSTALLED_API_VERSION == 0:
        return "the installed llama-cpp-python lacks the Clover patch series; run `make install`"
    if not capi.PATCHED:
        return (
            "the installed llama-cpp-python was built from another version of the Clover patch series (C API "
            f"{capi.INSTALLED_API_VERSION}, this clover-local needs {capi.API_VERSION}); run `make install`"
        )
    return None
