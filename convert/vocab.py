"""The tokenizer section of the GGUF: Qwen byte-level BPE, as upstream's `_set_vocab_gpt2` writes it.

Read straight from `tokenizer.json` / `tokenizer_config.json` (no transformers): tokens in id order
padded to the embedding rows with `[PADi]` (UNUSED), added special tokens CONTROL, other added
tokens USER_DEFINED, merges, the `qwen35` pre-tokenizer, eos = `<|im_end|>` and padding =
`<|endoftext|>` as Qwen instruct files have them, the chat template, and Clover's mask token.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gguf import GGUFWriter, TokenType

from clover_local.model import gguf_names as gn
from clover_local.model import json_fields as jf
from clover_local.model.config import CloverConfig

from .errors import ConvertError

PRE_TOKENIZER = "qwen35"
_CONTROL, _USER = TokenType.CONTROL, TokenType.USER_DEFINED
EOS_TOKEN = "<|im_end|>"
PAD_TOKEN = "<|endoftext|>"


@dataclass(frozen=True)
class Vocab:
    tokens: list[str]
    types: list[int]
    merges: list[str]
    eos_id: int
    pad_id: int | None
    bos_id: int | None
    add_bos: bool
    add_eos: bool
    chat_template: str | None
    mask_id: int


def looks_special(text: str) -> bool:
    """upstream `does_token_look_special` for the forms a Qwen vocabulary has."""
    return text.startswith("<|") and text.endswith("|>")


def load_vocab(path: Path, cfg: CloverConfig, raw_config: dict[str, Any]) -> Vocab:
    """Read the tokenizer of a checkpoint directory, sized to the model's embedding rows."""
    tok = _json(path / "tokenizer.json", required=True)
    tok_cfg = _json(path / "tokenizer_config.json", required=False)
    model = jf.get_object(tok, "model", "tokenizer.json")
    if model.get("type") != "BPE":
        raise ConvertError(
            f"tokenizer.json: model type {model.get('type')!r}, expected BPE (Qwen byte-level)"
        )
    n = cfg.vocab_size
    tokens: list[str | None] = [None] * n
    types = [int(TokenType.UNUSED)] * n
    by_text: dict[str, int] = {}

    def put(i: int, text: str, ttype: TokenType) -> None:
        if not 0 <= i < n:
            raise ConvertError(f"tokenizer.json: token {text!r} has id {i}, beyond the embedding's {n} rows")
        tokens[i], types[i], by_text[text] = text, int(ttype), i

    vocab = jf.get_object(model, "vocab", "tokenizer.json model")
    if not vocab:
        raise ConvertError("tokenizer.json: model.vocab is missing or empty")
    for text in vocab:
        put(jf.get_int(vocab, text, "tokenizer.json model.vocab"), text, TokenType.NORMAL)
    for added in jf.get_list(tok, "added_tokens", "tokenizer.json", dict, []):
        content = added.get("content")
        if not isinstance(content, str):
            raise ConvertError("tokenizer.json: an added token has no content string")
        special = added.get("special") is True or looks_special(content)
        put(jf.get_int(added, "id", "tokenizer.json added_tokens"), content, _CONTROL if special else _USER)
    merges = model.get("merges") or []
    if not isinstance(merges, list) or not all(_is_merge(m) for m in merges):
        raise ConvertError("tokenizer.json: model.merges must be a list of 'a b' strings or [a, b] pairs")
    padded = [t if t is not None else f"[PAD{i}]" for i, t in enumerate(tokens)]

    eos = _special_id(by_text, EOS_TOKEN, tok_cfg.get("eos_token"))
    if eos is None:
        raise ConvertError(f"tokenizer has no {EOS_TOKEN} token and tokenizer_config.json names no eos_token")
    mask = cfg.mask_token_id
    if mask is None or not 0 <= mask < n:
        raise ConvertError(f"mask token id {mask} is not a token of the {n}-row vocabulary")
    return Vocab(
        tokens=padded,
        types=types,
        merges=[m if isinstance(m, str) else " ".join(m) for m in merges],
        eos_id=eos,
        pad_id=_special_id(by_text, PAD_TOKEN, tok_cfg.get("pad_token")),
        bos_id=jf.get_opt_int(raw_config, "bos_token_id", "config.json"),
        add_bos=jf.get_bool(tok_cfg, "add_bos_token", "tokenizer_config.json", False),
        add_eos=jf.get_bool(tok_cfg, "add_eos_token", "tokenizer_config.json", False),
        chat_template=_chat_template(path, tok_cfg),
        mask_id=mask,
    )


def add_vocab(w: GGUFWriter, v: Vocab) -> None:
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(PRE_TOKENIZER)
    w.add_token_list(v.tokens)
    w.add_token_types(v.types)
    w.add_token_merges(v.merges)
    w.add_eos_token_id(v.eos_id)
    if v.pad_id is not None:
        w.add_pad_token_id(v.pad_id)
    if v.bos_id is not None:
        w.add_bos_token_id(v.bos_id)
    w.add_add_bos_token(v.add_bos)
    w.add_add_eos_token(v.add_eos)
    w.add_uint32(gn.MASK_TOKEN_ID, v.mask_id)
    if v.chat_template:
        w.add_chat_template(v.chat_template)


def _special_id(by_text: dict[str, int], preferred: str, configured: Any) -> int | None:
    """Id of the preferred token, else of the one tokenizer_config.json names."""
    if preferred in by_text:
        return by_text[preferred]
    text = configured.get("content") if isinstance(configured, dict) else configured
    return by_text.get(text) if isinstance(text, str) else None


def _chat_template(path: Path, tok_cfg: dict[str, Any]) -> str | None:
    """The default chat template: `chat_template.jinja`, else tokenizer_config.json's."""
    jinja = path / "chat_template.jinja"
    if jinja.is_file():
        try:
            return jinja.read_bytes().decode("utf-8")
        except UnicodeDecodeError:
            raise ConvertError(f"{jinja.name}: not UTF-8 text") from None
    tpl = tok_cfg.get("chat_template")
    if isinstance(tpl, list):  # [{"name": "default", "template": ...}, ...]
        named = [t for t in tpl if isinstance(t, dict) and t.get("name") == "default"]
        tpl = named[0].get("template") if named else None
    return tpl if isinstance(tpl, str) else None


def _is_merge(m: Any) -> bool:
    return isinstance(m, str) or (isinstance(m, list) and len(m) == 2 and all(isinstance(x, str) for x in m))


def _json(path: Path, required: bool) -> dict[str, Any]:
    if not path.is_file():
        if required:
            raise ConvertError(
                f"{path.parent}: no {path.name} (the converter needs the Qwen tokenizer files)"
            )
        return {}
    return jf.read_object(path)
