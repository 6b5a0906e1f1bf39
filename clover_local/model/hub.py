"""The Hugging Face Hub, for the converter (checkpoints) and the runtime (GGUF files).

`huggingface_hub` is optional (the `hub` extra) and imported only when a repo id is given, so local
work never needs it or the network. One place turns its absence and its errors into the caller's
one-line error.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType

# the HTTP libraries huggingface_hub uses, by version (httpx, its fork httpx2, requests)
HTTP_CLIENTS = ("httpx", "httpcore", "requests", "urllib3")
REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


def is_repo_id(spec: str) -> bool:
    """`owner/name` that is not an existing local path."""
    return bool(REPO_ID.match(spec)) and not Path(spec).exists()


@contextmanager
def hub(repo_id: str, error: type[Exception]) -> Iterator[ModuleType]:
    """The `huggingface_hub` module for downloads of `repo_id`; any failure raises `error` with one line."""
    try:
        import huggingface_hub
        from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError, RepositoryNotFoundError
    except ImportError:
        raise error(
            f"{repo_id} is a Hugging Face repo id; downloading needs huggingface_hub "
            "(pip install 'clover-local[hub]')"
        ) from None
    from huggingface_hub.utils import logging as hf_logging

    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # no "Retrying in 2s" line per retry: the outcome is one line
    try:
        yield huggingface_hub
    except RepositoryNotFoundError:
        raise error(f"{repo_id}: no such Hugging Face repository (or it is gated: log in first)") from None
    except (LocalEntryNotFoundError, HfHubHTTPError, OSError) as e:
        raise error(f"{repo_id}: download failed ({_first_line(e)})") from None
    except Exception as e:  # the HTTP client's own errors (httpx, requests): offline, DNS, TLS
        if not type(e).__module__.startswith(HTTP_CLIENTS):
            raise
        raise error(
            f"{repo_id}: download failed, network error ({_first_line(e)}); check the connection"
        ) from None
    finally:
        hf_logging.set_verbosity(verbosity)


def _first_line(e: Exception) -> str:
    return (str(e).splitlines() or [type(e).__name__])[0]
