"""What a GGUF file holds, read from its header alone (no weights, no vocabulary strings): `clover info`."""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from . import gguf_header
from . import gguf_names as gn
from .gguf_check import GGUFError, check_gguf
from .gguf_header import Header, HeaderError


class ModelFileError(ValueError):
    """The file is missing, not a GGUF, or not a Clover model; the message is for the user."""


@dataclass
class ModelInfo:
    path: str
    file_size: int
    architecture: str
    name: str
    n_tensors: int
    n_params: int
    file_type: str
    quant_mix: dict[str, int]  # ggml type -> number of tensors
    hyperparameters: dict[str, Any]
    diffusion: dict[str, Any]
    has_diffusion_tensors: bool
    gdn_layers: int
    vocab_size: int
    mask_token_id: int | None
    missing_diffusion_tensors: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def read_header(path: str | Path) -> Header:
    """The GGUF header (`gguf_header`), checked (`gguf_check`: the hyperparameters, a split file's
    other parts), or a one-line `ModelFileError` for a missing, non-GGUF or unrunnable file."""
    p = Path(path)
    if not p.exists():
        raise ModelFileError(f"{p}: file not found")
    if p.is_dir():
        raise ModelFileError(f"{p}: is a directory, expected a .gguf file (convert it with clover-convert)")
    with open(p, "rb") as f:
        magic = f.read(4)
    if magic != b"GGUF":
        raise ModelFileError(f"{p}: not a GGUF file (convert a checkpoint with clover-convert)")
    try:
        header = gguf_header.read_header(p)
    except (HeaderError, OSError) as e:
        raise ModelFileError(f"{p}: unreadable GGUF ({e})") from None
    try:
        check_gguf(p, header)
    except GGUFError as e:
        raise ModelFileError(str(e)) from None
    return header


def read_info(path: str | Path, header: Header | None = None) -> ModelInfo:
    """What the runtime and `clover info` show of a Clover GGUF (`header`: already read)."""
    header = header or read_header(path)
    meta = {k: v for k, v in header.metadata.items() if not k.startswith("tokenizer.ggml.t")}
    arch = meta.get("general.architecture", "")
    if arch != gn.ARCH:
        raise ModelFileError(
            f"{path}: not a Clover model (architecture {arch or 'unknown'!r}, expected {gn.ARCH!r})"
        )
    tensors = header.tensors
    names = {t.name for t in tensors}
    mix = Counter(_type_name(t.type) for t in tensors)
    n_layers = int(meta.get(gn.BLOCK_COUNT, 0))
    from .tensors import gdn_layers, missing_diffusion_tensors  # imports gguf, as this function does

    gdn = gdn_layers(names, n_layers)
    missing = missing_diffusion_tensors(names, gdn)
    prefix = gn.ARCH + "."
    hyper = {k[len(prefix) :]: v for k, v in meta.items() if k.startswith(prefix) and ".diffusion." not in k}
    diffusion = {
        k[len(gn.key("diffusion.")) :]: v for k, v in meta.items() if k.startswith(gn.key("diffusion."))
    }
    tokens = header.metadata.get("tokenizer.ggml.tokens")
    return ModelInfo(
        path=str(path),
        file_size=Path(path).stat().st_size,
        architecture=arch,
        name=str(meta.get("general.name", "")),
        n_tensors=len(tensors),
        n_params=sum(t.n_elements for t in tensors),
        file_type=_file_type_name(meta.get("general.file_type")),
        quant_mix=dict(mix.most_common()),
        hyperparameters=hyper,
        diffusion=diffusion,
        has_diffusion_tensors=bool(gdn) and not missing,
        gdn_layers=len(gdn),
        vocab_size=len(tokens) if tokens is not None else 0,
        mask_token_id=meta.get(gn.MASK_TOKEN_ID),
        missing_diffusion_tensors=missing[:8],
    )


def _type_name(ggml_type: int) -> str:
    from gguf import GGMLQuantizationType

    try:
        return GGMLQuantizationType(ggml_type).name
    except ValueError:
        return f"type{ggml_type}"


def _file_type_name(ft: Any) -> str:
    from gguf import LlamaFileType

    try:
        return LlamaFileType(int(ft)).name.removeprefix("ALL_").removeprefix("MOSTLY_")
    except (TypeError, ValueError):
        return "unknown"
