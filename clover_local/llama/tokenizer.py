"""Tokenization through a loaded GGUF's own vocabulary (llama.cpp), with the file's chat template.

The runtime must tokenize exactly as the weights it runs were converted, so a GGUF model never
needs the checkpoint's `tokenizer.json`: this class offers `CloverTokenizer`'s methods on
llama.cpp's `llama_vocab`, and renders the template stored in `tokenizer.chat_template` with the
same jinja rendering (`tokenizer.ChatTemplating`).
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from typing import Any

from llama_cpp import llama_cpp as ll

from ..model.tokenizer import ChatTemplating


class GgufTokenizer(ChatTemplating):
    """`encode`/`decode`/`token_id`/`render_chat` of a `llama_model *` (kept alive by its owner)."""

    def __init__(self, model: Any):
        self.vocab = ll.llama_model_get_vocab(model)
        template = ll.llama_model_chat_template(model, None)
        self.chat_template = template.decode("utf-8") if template else None
        # the template's bos/eos strings, only for ids the file names (llama.cpp has fallbacks)
        self.special = {
            f"{name}_token": self._text(tid)
            for name, tid in (("bos", ll.llama_vocab_bos(self.vocab)), ("eos", self.eos_id))
            if tid >= 0 and _meta(model, f"tokenizer.ggml.{name}_token_id") is not None
        }

    @property
    def vocab_size(self) -> int:
        return ll.llama_vocab_n_tokens(self.vocab)

    @property
    def eos_id(self) -> int:
        return ll.llama_vocab_eos(self.vocab)

    def end_of_generation_ids(self) -> tuple[int, ...]:
        """eos and eot when the file names them: the stop tokens of a file without Clover keys."""
        ids = (self.eos_id, ll.llama_vocab_eot(self.vocab))
        return tuple(dict.fromkeys(i for i in ids if i >= 0))

    def _text(self, token: int) -> str:
        return ll.llama_vocab_get_text(self.vocab, token).decode("utf-8", "replace")

    def encode(self, text: str) -> list[int]:
        """Token ids of text; special tokens written in the text are recognised, none is added."""
        data = text.encode("utf-8")
        n_max = len(data) + 8
        buf = (ll.llama_token * n_max)()
        n = ll.llama_tokenize(self.vocab, data, len(data), buf, n_max, False, True)
        if n < 0:  # too small: llama.cpp returns minus the size it needs
            n_max = -n
            buf = (ll.llama_token * n_max)()
            n = ll.llama_tokenize(self.vocab, data, len(data), buf, n_max, False, True)
        return list(buf[:n])

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        """Text of ids; bytes that do not form whole UTF-8 characters become U+FFFD, as in HF.

        `skip_special_tokens` drops control tokens (`<|im_end|>`), as HF drops special ones.
        """
        if not ids:
            return ""
        arr = (ll.llama_token * len(ids))(*ids)
        size = 16 * len(ids) + 64
        for _ in range(2):
            buf = ctypes.create_string_buffer(size)
            n = ll.llama_detokenize(self.vocab, arr, len(ids), buf, size, False, not skip_special_tokens)
            if n >= 0:
                return buf.raw[:n].decode("utf-8", "replace")
            size = -n
        raise RuntimeError("llama_detokenize kept asking for a larger buffer")

    def token_id(self, token: str) -> int | None:
        """The id of a token given by its text (e.g. `</think>`), or None if it is not one token."""
        ids = self.encode(token)
        return ids[0] if len(ids) == 1 and self._text(ids[0]) == token else None


def _meta(model: Any, key: str) -> str | None:
    """A metadata value of the model as text, None when absent."""
    buf = ctypes.create_string_buffer(64)
    n = ll.llama_model_meta_val_str(model, key.encode(), buf, len(buf))
    return buf.value.decode("utf-8", "replace") if n >= 0 else None
