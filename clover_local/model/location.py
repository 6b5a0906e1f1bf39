"""Where a model comes from: a local GGUF (or checkpoint directory), or a GGUF on the Hugging Face Hub.

`clover chat owner/name:Q4_K_M` picks the repository's GGUF whose name matches the pattern and
downloads it into the normal Hugging Face cache (huggingface_hub, imported only when needed). A
split GGUF (`...-00001-of-00003.gguf`) is downloaded whole and opened by its first part, which is
what llama.cpp loads.
"""

from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass
from pathlib import Path

from .gguf_info import ModelFileError
from .hub import hub, is_repo_id

SPLIT = re.compile(r"-(\d{5})-of-(\d{5})\.gguf$")


@dataclass(frozen=True)
class HubFile:
    repo_id: str
    pattern: str


def parse_spec(spec: str, file: str | None = None) -> Path | HubFile:
    """A local path, or a Hub repository with a file pattern (`owner/name:PATTERN` or `--file`)."""
    path = Path(spec).expanduser()
    repo, _, pattern = spec.partition(":")
    if path.exists() or not is_repo_id(repo):
        if file is not None:
            raise ModelFileError(
                f"{spec}: --file picks a file of a Hugging Face repository, not of a local path"
            )
        return path  # a missing one is reported by the loader ("file not found")
    if pattern and file:
        raise ModelFileError(f"{spec}: give the file pattern once, as owner/name:PATTERN or with --file")
    pattern = pattern or file or ""
    if not pattern:
        raise ModelFileError(
            f"{spec}: file not found (for a Hugging Face repository, name the GGUF: "
            f"{repo}:Q4_K_M or --file '*Q4_K_M*.gguf')"
        )
    return HubFile(repo, pattern)


def pick_files(files: list[str], pattern: str) -> list[str]:
    """The repository files of one model matching `pattern`; the first one is what llama.cpp opens.

    A pattern with glob characters is matched as a glob (case-insensitive); a plain one, like a
    quantization name, must occur in the name of a `.gguf` file. All parts of a split file match
    together; anything else matching twice is ambiguous.
    """
    ggufs = [f for f in files if f.lower().endswith(".gguf")]
    if any(c in pattern for c in "*?["):
        hits = [f for f in ggufs if fnmatch.fnmatch(f.lower(), pattern.lower())]
    else:
        hits = [f for f in ggufs if pattern.lower() in Path(f).name.lower()]
    if not hits:
        listing = ", ".join(Path(f).name for f in ggufs[:12]) or "none"
        raise ModelFileError(f"no GGUF matches {pattern!r}; the repository has: {listing}")
    models = sorted({SPLIT.sub(".gguf", f) for f in hits})
    if len(models) > 1:
        raise ModelFileError(
            f"{pattern!r} matches several files ({', '.join(models)}); give a longer pattern"
        )
    return sorted(hits)


def resolve(spec: str, file: str | None = None) -> Path:
    """A local path for the model, downloading it from the Hub first when `spec` names a repository."""
    where = parse_spec(spec, file)
    if isinstance(where, Path):
        return where
    with hub(where.repo_id, ModelFileError) as hf:
        names = pick_files(hf.list_repo_files(where.repo_id), where.pattern)
        paths = [hf.hf_hub_download(where.repo_id, name) for name in names]
    return Path(paths[0])
