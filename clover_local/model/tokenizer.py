"""Tokenizer and chat template of a checkpoint: HF `tokenizers` plus jinja2, no transformers needed.

The chat template is rendered the way transformers renders it (sandboxed jinja2, trim_blocks,
lstrip_blocks, `raise_exception`, `tojson`), so prompts are byte-identical to the publisher's.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from jinja2.exceptions import TemplateError
from tokenizers import Tokenizer

from . import json_fields as jf
from .template_sandbox import BoundedSandbox, bounded_filter, render

THINK_START, THINK_END = "<think>", "</think>"


class ChatTemplateError(ValueError):
    """The chat template is missing or rejected the messages."""


def _raise_exception(message: str) -> None:
    raise TemplateError(message)


def _tojson(
    x: Any, ensure_ascii: bool = False, indent: int | None = None, separators=None, sort_keys=False
) -> str:
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


class ChatTemplating:
    """Chat prompts from `chat_template` + `special`, for any tokenizer that has `encode`."""

    chat_template: str | None
    special: dict[str, Any]

    def encode(self, text: str) -> list[int]:
        raise NotImplementedError

    def render_chat(
        self,
        messages: Sequence[dict[str, Any]],
        enable_thinking: bool = True,
        add_generation_prompt: bool = True,
    ) -> str:
        """The prompt text of a conversation, ready for the assistant's turn."""
        return render_chat_template(
            self.chat_template, messages, enable_thinking, add_generation_prompt, self.special
        )

    def encode_chat(self, messages: Sequence[dict[str, Any]], enable_thinking: bool = True) -> list[int]:
        return self.encode(self.render_chat(messages, enable_thinking=enable_thinking))


class CloverTokenizer(ChatTemplating):
    """`tokenizer.json` + the chat template of `tokenizer_config.json` (or `chat_template.jinja`)."""

    def __init__(self, tokenizer: Tokenizer, chat_template: str | None, special: dict[str, Any]):
        self.tokenizer = tokenizer
        self.chat_template = chat_template
        self.special = special  # bos/eos/pad token strings of tokenizer_config.json

    @classmethod
    def from_dir(cls, path: str | Path) -> CloverTokenizer:
        path = Path(path)
        if not (path / "tokenizer.json").is_file():
            raise FileNotFoundError(f"{path}: no tokenizer.json")
        cfg_path = path / "tokenizer_config.json"
        cfg = jf.read_object(cfg_path) if cfg_path.is_file() else {}
        template = cfg.get("chat_template")
        if isinstance(template, list):  # named templates: [{"name": "default", "template": ...}, ...]
            named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
            template = named.get("default")
        if not isinstance(template, str) and (path / "chat_template.jinja").is_file():
            template = (path / "chat_template.jinja").read_bytes().decode("utf-8", "replace")
        special = {k: cfg.get(k) for k in ("bos_token", "eos_token", "pad_token")}
        try:
            tokenizer = Tokenizer.from_file(str(path / "tokenizer.json"))
        except Exception as e:  # the library's message quotes the file: name only the failure
            raise jf.ConfigError(
                f"tokenizer.json: the tokenizers library cannot read it ({type(e).__name__})"
            ) from None
        return cls(tokenizer, template if isinstance(template, str) else None, special)

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str) -> list[int]:
        """Token ids of text; special tokens written in the text are recognised, none is added."""
        return self.tokenizer.encode(text, add_special_tokens=False).ids

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def token_id(self, token: str) -> int | None:
        return self.tokenizer.token_to_id(token)


def render_chat_template(
    template: str | None,
    messages: Sequence[dict[str, Any]],
    enable_thinking: bool = True,
    add_generation_prompt: bool = True,
    special: dict[str, Any] | None = None,
) -> str:
    """Render a chat template as transformers does; shared by the HF and the GGUF tokenizers."""
    if not template:
        raise ChatTemplateError("the model has no chat template (tokenizer_config.json chat_template)")
    env = BoundedSandbox(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = bounded_filter(_tojson)
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    try:
        return render(
            env,
            template,
            messages=list(messages),
            add_generation_prompt=add_generation_prompt,
            enable_thinking=enable_thinking,
            **(special or {}),
        )
    except Exception as e:  # any failure of a template from a model file is the template's: one line
        what = str(e).strip().splitlines()[0][:300] if str(e).strip() else type(e).__name__
        raise ChatTemplateError(f"chat template: {what}") from None
