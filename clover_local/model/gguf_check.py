"""A GGUF's hyperparameters checked before llama.cpp loads it, and every part of a split file.

llama.cpp aborts, hangs or divides by zero on valid-but-absurd values (`expert_count` 0, a NaN
norm epsilon, a rotary dimension count of 0). The structure is checked by the one header walk
(`gguf_header`, every length, count and offset bounded); here its metadata is range-checked
against `hparam_limits`, and the other parts of a split file are walked too. It runs before
`llama_model_load`, for the runtime and for `clover info`; a failure is one line naming the key.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from . import gguf_names as gn
from .gguf_header import Header, HeaderError, StringArray, read_header
from .hparam_limits import LIMITS, ROPE_SECTIONS, check_values, rope_sections_violation

SPLIT = re.compile(r"-(\d{5})-of-(\d{5})\.gguf$")


class GGUFError(ValueError):
    """The file holds a value llama.cpp cannot run, or a part of a split file is missing or broken."""


def check_gguf(path: Path, header: Header) -> None:
    """The other parts of a split file (walked as the first one was), then the Clover
    hyperparameters of `header`, the first part's."""
    meta = header.metadata
    parts = int(meta.get("split.count", 1) or 1)
    if parts > 1 and SPLIT.search(path.name):
        for i in range(2, parts + 1):
            part = path.with_name(SPLIT.sub(f"-{i:05d}-of-{parts:05d}.gguf", path.name))
            if not part.is_file():
                raise GGUFError(f"{part}: missing part {i} of {parts} of a split GGUF")
            try:
                read_header(part)
            except (HeaderError, OSError) as e:
                raise GGUFError(f"{part}: unreadable GGUF ({e})") from None
    if meta.get("general.architecture") == gn.ARCH:
        check_hparams(path.name, meta)


def check_hparams(name: str, meta: dict[str, Any]) -> None:
    """Every `hparam_limits` row present in the file, the mask and end-of-generation ids."""
    values = {k: (None if isinstance(v, list | StringArray) else v) for k, v in meta.items()}
    bad = check_values(values, LIMITS, by_key=True)
    if bad:
        lim, value, why = bad
        raise GGUFError(f"{name}: {lim.key} is {value}: {why}")
    sections = meta.get(ROPE_SECTIONS)
    if isinstance(sections, list):
        why = rope_sections_violation(sections, meta.get(gn.key("attention.key_length")))
        if why:
            raise GGUFError(f"{name}: {ROPE_SECTIONS} is {sections}: {why}")
    vocab = meta.get("tokenizer.ggml.tokens")
    for key in (gn.MASK_TOKEN_ID, "tokenizer.ggml.eos_token_id"):
        tid = meta.get(key)
        if isinstance(vocab, StringArray) and isinstance(tid, int) and not 0 <= tid < len(vocab):
            raise GGUFError(f"{name}: {key} is {tid}: not a token of the {len(vocab)}-token vocabulary")
