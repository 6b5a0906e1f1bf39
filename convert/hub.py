"""Where the checkpoint comes from: a local directory, or a Hugging Face repo id to download.

Downloads go to the normal Hugging Face cache (`huggingface_hub.snapshot_download`), imported
only when needed so local conversions never touch the network or need the package.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from .errors import ConvertError

REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
PATTERNS = ["*.json", "*.safetensors", "*.jinja", "*.txt", "README.md"]


@dataclass(frozen=True)
class Source:
    path: Path
    url: str | None = None  # the Hub page, recorded as general.source.url


def is_repo_id(spec: str) -> bool:
    """`owner/name` that is not an existing local path."""
    return bool(REPO_ID.match(spec)) and not Path(spec).exists()


def resolve(spec: str) -> Source:
    """A local checkpoint directory, downloading `spec` from the Hub if it is a repo id."""
    path = Path(spec).expanduser()
    if path.is_dir():
        return Source(path)
    if path.exists():
        raise ConvertError(f"{spec} is a file; give the checkpoint directory")
    if not is_repo_id(spec):
        raise ConvertError(f"{spec}: no such directory (and not a Hugging Face repo id like owner/name)")
    return Source(_download(spec), url=f"https://huggingface.co/{spec}")


def _download(repo_id: str) -> Path:
    try:
        from huggingface_hub import snapshot_download
        from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError, RepositoryNotFoundError
    except ImportError:
        raise ConvertError(
            f"{repo_id} looks like a Hugging Face repo id; downloading needs huggingface_hub "
            "(pip install 'clover-local[hub]')"
        ) from None
    try:
        return Path(snapshot_download(repo_id, allow_patterns=PATTERNS))
    except RepositoryNotFoundError:
        raise ConvertError(
            f"{repo_id}: no such Hugging Face repository (or it is gated: log in first)"
        ) from None
    except (LocalEntryNotFoundError, HfHubHTTPError, OSError) as e:
        raise ConvertError(f"{repo_id}: download failed ({str(e).splitlines()[0]})") from None
