"""What a GGUF file holds, read from its header alone (no weights loaded): `clover info`."""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from . import gguf_names as gn


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


def _field_value(f: Any) -> Any:
    """Decode a GGUFReader field into a plain Python value (string, number, list)."""
    from gguf import GGUFValueType

    if not f.types:
        return None
    if f.types[0] == GGUFValueType.ARRAY:
        if len(f.types) > 1 and f.types[1] == GGUFValueType.STRING:
            return [bytes(f.parts[i]).decode("utf-8", "replace") for i in f.data]
        return [f.parts[i].tolist()[0] for i in f.data]
    if f.types[0] == GGUFValueType.STRING:
        return bytes(f.parts[f.data[0]]).decode("utf-8", "replace")
    part = f.parts[f.data[0]]
    if part.dtype == np.float32:  # the shortest decimal of the stored f32: 0.95, not 0.949999988
        return float(str(part[0]))
    return part.tolist()[0]


def open_gguf(path: str | Path) -> Any:
    """A `gguf.GGUFReader`, or a one-line `ModelFileError` for a missing or non-GGUF file."""
    from gguf import GGUFReader

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
        return GGUFReader(p, "r")
    except (ValueError, OSError) as e:
        raise ModelFileError(f"{p}: unreadable GGUF ({e})") from None


def read_info(path: str | Path) -> ModelInfo:
    reader = open_gguf(path)
    meta = {
        name: _field_value(f) for name, f in reader.fields.items() if not name.startswith("tokenizer.ggml.t")
    }
    arch = meta.get("general.architecture", "")
    if arch != gn.ARCH:
        raise ModelFileError(
            f"{path}: not a Clover model (architecture {arch or 'unknown'!r}, expected {gn.ARCH!r})"
        )
    names = {t.name for t in reader.tensors}
    mix = Counter(t.tensor_type.name for t in reader.tensors)
    n_params = int(sum(int(np.prod(t.shape)) for t in reader.tensors))
    n_layers = int(meta.get(gn.BLOCK_COUNT, 0))
    gdn = [i for i in range(n_layers) if f"blk.{i}.{gn.SSM_CONV1D}" in names]
    missing = [f"blk.{i}.{s}" for i in gdn for s in gn.DIFFUSION_TENSORS if f"blk.{i}.{s}" not in names]
    prefix = gn.ARCH + "."
    hyper = {k[len(prefix) :]: v for k, v in meta.items() if k.startswith(prefix) and ".diffusion." not in k}
    diffusion = {
        k[len(gn.key("diffusion.")) :]: v for k, v in meta.items() if k.startswith(gn.key("diffusion."))
    }
    tokens = reader.fields.get("tokenizer.ggml.tokens")
    ft = meta.get("general.file_type")
    return ModelInfo(
        path=str(path),
        file_size=Path(path).stat().st_size,
        architecture=arch,
        name=str(meta.get("general.name", "")),
        n_tensors=len(reader.tensors),
        n_params=n_params,
        file_type=_file_type_name(ft),
        quant_mix=dict(mix.most_common()),
        hyperparameters=hyper,
        diffusion=diffusion,
        has_diffusion_tensors=bool(gdn) and not missing,
        gdn_layers=len(gdn),
        vocab_size=len(tokens.data) if tokens is not None else 0,
        mask_token_id=meta.get(gn.MASK_TOKEN_ID),
        missing_diffusion_tensors=missing[:8],
    )


def _file_type_name(ft: Any) -> str:
    from gguf import LlamaFileType

    try:
        return LlamaFileType(int(ft)).name.removeprefix("ALL_").removeprefix("MOSTLY_")
    except (TypeError, ValueError):
        return "unknown"
