"""The converter's one error type: a one-line message for the user, never a traceback."""

from __future__ import annotations


class ConvertError(RuntimeError):
    """Bad input or environment; `str(e)` is the whole message the CLI prints."""
