"""Tokenizer files of generated checkpoints: `tokenizer.json` and `tokenizer_config.json`.

Both vocabularies are byte-level BPE with the exact split regex of llama.cpp's `qwen35`
pre-tokenizer, so a GGUF made from these files tokenizes in llama.cpp exactly as HF `tokenizers`
does here. `tiny` is a few hundred tokens learnt by a small deterministic BPE trainer (our own,
so merges never change with the `tokenizers` version); `qwen` is the Qwen vocabulary and merges
shipped as llama.cpp's `ggml-vocab-qwen35.gguf` test vocabulary in the pinned source release.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from tokenizers import Regex, pre_tokenizers

# llama.cpp src/llama-vocab.cpp, LLAMA_VOCAB_PRE_TYPE_QWEN35, "original regex from tokenizer.json"
QWEN35_SPLIT_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}"
    r"| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
QWEN_VOCAB_MEMBER = "vendor/llama.cpp/models/ggml-vocab-qwen35.gguf"

# (content, special) in id order after the BPE vocabulary, as in Qwen's tokenizers;
# `<think>`/`</think>` are ordinary added tokens (special false) there, so they survive decoding.
ADDED_TOKENS: tuple[tuple[str, bool], ...] = (
    ("<|endoftext|>", True),
    ("<|im_start|>", True),
    ("<|im_end|>", True),
    ("<think>", False),
    ("</think>", False),
    ("<|mask|>", True),
)

# Qwen3.6-style: thinking is on unless `enable_thinking` is false; earlier assistant turns lose
# their reasoning; a system message may only come first.
CHAT_TEMPLATE = """\
{%- for message in messages %}
    {%- if message.role == 'system' %}
        {%- if not loop.first %}
            {{- raise_exception('System message must be at the beginning.') }}
        {%- endif %}
        {{- '<|im_start|>system\\n' + message.content + '<|im_end|>\\n' }}
    {%- elif message.role == 'user' %}
        {{- '<|im_start|>user\\n' + message.content + '<|im_end|>\\n' }}
    {%- elif message.role == 'assistant' %}
        {%- set content = message.content %}
        {%- if '</think>' in content %}
            {%- set content = content.split('</think>')[-1].lstrip('\\n') %}
        {%- endif %}
        {{- '<|im_start|>assistant\\n' + content + '<|im_end|>\\n' }}
    {%- else %}
        {{- raise_exception('Unexpected message role: ' + message.role) }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
    {%- if enable_thinking is defined and enable_thinking is false %}
        {{- '<think>\\n\\n</think>\\n\\n' }}
    {%- else %}
        {{- '<think>\\n' }}
    {%- endif %}
{%- endif %}
"""

# Embedded training text of the tiny vocabulary: English prose, chat words and some Python.
TINY_CORPUS = """\
The quick brown fox jumps over the lazy dog. A block diffusion model writes a whole block of
tokens at once: it starts from masks and fills the positions it is sure about, then looks again.
Once the block is resolved, it is committed and becomes the prefix of the next block. The model
thinks before it answers, and the answer should be short, clear and correct. Hello, world!
What is the capital of France? The capital of France is Paris. How many days are in a week?
There are seven days in a week. Please write a function that returns the sum of two numbers.
Numbers: 0 1 2 3 4 5 6 7 8 9 10 42 100 2024 3.14159. Questions, answers; lists: one, two, three.

def add(a: int, b: int) -> int:
    \"\"\"Return the sum of a and b.\"\"\"
    return a + b


class Counter:
    def __init__(self) -> None:
        self.count = 0

    def step(self, n: int = 1) -> int:
        for _ in range(n):
            self.count += 1
        return self.count


if __name__ == "__main__":
    print(add(2, 3), Counter().step(4))
    values = [x * x for x in range(10) if x % 2 == 0]
    print({"values": values, "ok": True})
"""
TINY_MERGES = 218  # 256 bytes + 218 merges + 6 added tokens = 480 tokens


@dataclass(frozen=True)
class Vocabulary:
    """A byte-level BPE vocabulary: base tokens, merges, and the added tokens' ids."""

    vocab: dict[str, int]
    merges: list[tuple[str, str]]

    @property
    def added(self) -> dict[str, int]:
        """Added token -> id, placed right after the base vocabulary."""
        return {tok: len(self.vocab) + i for i, (tok, _) in enumerate(ADDED_TOKENS)}

    @property
    def size(self) -> int:
        return len(self.vocab) + len(ADDED_TOKENS)


@cache
def byte_alphabet() -> tuple[str, ...]:
    """GPT-2's byte -> printable character map, in the order Qwen's ids 0..255 use."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
    bs += list(range(ord("®"), ord("ÿ") + 1))
    chars, extra = {b: chr(b) for b in bs}, 0
    for b in range(256):
        if b not in chars:
            chars[b] = chr(256 + extra)
            extra += 1
    return tuple(chars[b] for b in bs + [b for b in range(256) if b not in bs])


def pre_tokenizer() -> pre_tokenizers.PreTokenizer:
    return pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN35_SPLIT_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
        ]
    )


def train_bpe(text: str, n_merges: int) -> Vocabulary:
    """Learn merges greedily: most frequent adjacent pair, ties to the smallest pair (deterministic)."""
    words = Counter(piece for piece, _ in pre_tokenizer().pre_tokenize_str(text))
    seqs = {w: list(w) for w in words}
    vocab = {ch: i for i, ch in enumerate(byte_alphabet())}
    merges: list[tuple[str, str]] = []
    while len(merges) < n_merges:
        pairs: Counter[tuple[str, str]] = Counter()
        for w, seq in seqs.items():
            for pair in zip(seq, seq[1:], strict=False):
                pairs[pair] += words[w]
        if not pairs:
            break
        best = min(pairs, key=lambda p: (-pairs[p], p))
        merges.append(best)
        vocab[best[0] + best[1]] = len(vocab)
        seqs = {w: _merge(seq, best) for w, seq in seqs.items()}
    return Vocabulary(vocab, merges)


def _merge(seq: list[str], pair: tuple[str, str]) -> list[str]:
    out: list[str] = []
    i = 0
    while i < len(seq):
        if i + 1 < len(seq) and (seq[i], seq[i + 1]) == pair:
            out.append(seq[i] + seq[i + 1])
            i += 2
        else:
            out.append(seq[i])
            i += 1
    return out


def qwen_vocabulary() -> Vocabulary:
    """The Qwen BPE vocabulary (normal tokens only) and merges from llama.cpp's test GGUF."""
    from clover_patches.source import read_member

    kv = read_gguf_arrays(
        read_member(QWEN_VOCAB_MEMBER),
        ("tokenizer.ggml.tokens", "tokenizer.ggml.token_type", "tokenizer.ggml.merges"),
    )
    normal = 1  # llama.cpp LLAMA_TOKEN_TYPE_NORMAL
    tokens, types = kv["tokenizer.ggml.tokens"], kv["tokenizer.ggml.token_type"]
    vocab = {tok: i for i, (tok, t) in enumerate(zip(tokens, types, strict=True)) if t == normal}
    if sorted(vocab.values()) != list(range(len(vocab))):
        raise ValueError(f"{QWEN_VOCAB_MEMBER}: normal tokens are not the ids 0..{len(vocab) - 1}")
    merges = [tuple(m.split(" ", 1)) for m in kv["tokenizer.ggml.merges"]]
    return Vocabulary(vocab, merges)  # type: ignore[arg-type]


def read_gguf_arrays(data: bytes, keys: tuple[str, ...]) -> dict[str, list]:
    """The named string/integer array values of a GGUF file held in memory."""
    from ..model.gguf_header import parse

    metadata = parse(data, decode=keys).metadata
    missing = [k for k in keys if k not in metadata]
    if missing:
        raise ValueError(f"GGUF file lacks {', '.join(missing)}")
    return {k: metadata[k] for k in keys}


def tokenizer_json(v: Vocabulary) -> dict[str, Any]:
    """`tokenizer.json` laid out as Qwen's (no normalizer, qwen35 split + byte level, BPE)."""
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}
    added = [
        {
            "id": v.added[tok],
            "content": tok,
            "single_word": False,
            "lstrip": False,
            "rstrip": False,
            "normalized": False,
            "special": special,
        }
        for tok, special in ADDED_TOKENS
    ]
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": None,
        "pre_tokenizer": {
            "type": "Sequence",
            "pretokenizers": [
                {
                    "type": "Split",
                    "pattern": {"Regex": QWEN35_SPLIT_REGEX},
                    "behavior": "Isolated",
                    "invert": False,
                },
                byte_level,
            ],
        },
        "post_processor": byte_level,
        "decoder": byte_level,
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": None,
            "continuing_subword_prefix": "",
            "end_of_word_suffix": "",
            "fuse_unk": False,
            "byte_fallback": False,
            "ignore_merges": False,
            "vocab": v.vocab,
            "merges": [list(m) for m in v.merges],
        },
    }


def tokenizer_config(v: Vocabulary, max_length: int) -> dict[str, Any]:
    """`tokenizer_config.json` in the Qwen style, with the chat template and the mask token."""
    return {
        "add_bos_token": False,
        "add_prefix_space": False,
        "added_tokens_decoder": {
            str(v.added[tok]): {
                "content": tok,
                "lstrip": False,
                "normalized": False,
                "rstrip": False,
                "single_word": False,
                "special": special,
            }
            for tok, special in ADDED_TOKENS
        },
        "additional_special_tokens": ["<|im_start|>", "<|im_end|>", "<|mask|>"],
        "bos_token": None,
        "chat_template": CHAT_TEMPLATE,
        "clean_up_tokenization_spaces": False,
        "eos_token": "<|im_end|>",
        "errors": "replace",
        "mask_token": "<|mask|>",
        "model_max_length": max_length,
        "pad_token": "<|endoftext|>",
        "split_special_tokens": False,
        "tokenizer_class": "Qwen2Tokenizer",
        "unk_token": None,
    }


@cache
def vocabulary(kind: str) -> Vocabulary:
    """`tiny` (trained here) or `qwen` (llama.cpp's Qwen test vocabulary); cached per process."""
    if kind == "tiny":
        return train_bpe(TINY_CORPUS, TINY_MERGES)
    if kind == "qwen":
        return qwen_vocabulary()
    raise ValueError(f"unknown tokenizer kind {kind!r} (tiny or qwen)")


def write_tokenizer(out_dir: Path, kind: str, max_length: int) -> Vocabulary:
    """Write `tokenizer.json` and `tokenizer_config.json`; returns the vocabulary (for its ids)."""
    v = vocabulary(kind)
    (out_dir / "tokenizer.json").write_text(
        json.dumps(tokenizer_json(v), ensure_ascii=False), encoding="utf-8"
    )
    (out_dir / "tokenizer_config.json").write_text(
        json.dumps(tokenizer_config(v, max_length), indent=2, ensure_ascii=False) + "\n", encoding="utf-8"
    )
    return v
