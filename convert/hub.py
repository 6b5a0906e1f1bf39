"""Where the checkpoint comes from: a local directory, or a Hugging Face repo id to download.

Downloads go to the normal Hugging Face cache (`huggingface_hub.snapshot_download`, through
`clover_local.model.hub`), so local conversions never touch the network or need the package.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from clover_local.model.hub import hub, is_repo_id

from .errors import ConvertError

PATTERNS = ["*.json", "*.safetensors", "*.jinja", "*.txt", "README.md"]


@dataclass(frozen=True)
class Source:
    path: Path
    url: str | None = None  # the Hub page, recorded as general.source.url


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
    with hub(repo_id, ConvertError) as hf:
        return Path(hf.snapshot_download(repo_id, allow_patterns=PATTERNS))
