"""From final tokens to text deltas: incremental detokenization, stop strings, reasoning split.

The decode loop finalises tokens in runs (a block's resolved prefix, then the rest at the commit);
`TextStream` turns the growing token list into the text a reader may already see. It holds back
what could still change: a trailing incomplete UTF-8 character, a tail that may begin a stop
string, and (while reasoning) a tail that may begin `</think>` plus the whitespace before it.
Streaming and non-streaming results are both built from it, so their texts are identical.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from .model.tokenizer import THINK_END

CONTENT, REASONING = "content", "reasoning_content"
Delta = tuple[str, str]  # (field, text)


def _partial_suffix(text: str, needles: Sequence[str]) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of one of `needles`."""
    best = 0
    for needle in needles:
        for n in range(min(len(needle) - 1, len(text)), best, -1):
            if text.endswith(needle[:n]):
                best = n
                break
    return best


class TextStream:
    """Text deltas of a response whose tokens arrive in order and never change.

    `reasoning`: the response starts inside a `<think>` section (the chat prompt opened it), so
    text up to `</think>` is reasoning and the rest is content; without it everything is content.
    After a stop string is found, `stopped` is true and no more text comes.
    """

    def __init__(
        self, decode: Callable[[Sequence[int]], str], stop: Sequence[str] = (), reasoning: bool = False
    ):
        self.decode = decode
        self.stop = [s for s in stop if s]
        self.phase = REASONING if reasoning else CONTENT
        self.stopped = False
        self.n_tokens = 0  # tokens whose text has been looked at
        self.text = {CONTENT: "", REASONING: ""}
        self._raw = ""
        self._done = 0  # characters of the raw text already routed to a field
        self._content_started = False

    def feed(self, tokens: Sequence[int], final: bool = False) -> list[Delta]:
        """Deltas for the response's final tokens so far (`final`: nothing more will come)."""
        if self.stopped or (len(tokens) == self.n_tokens and not final):
            return []
        self.n_tokens = len(tokens)
        raw = self.decode(tokens)
        if not final:
            raw = raw.rstrip("\ufffd")  # an incomplete UTF-8 character may complete with the next token
        self._raw = raw
        hits = [i for i in (raw.find(s, max(0, self._done - len(s))) for s in self.stop) if i >= 0]
        end = len(raw)
        if hits:
            end, final, self.stopped = min(hits), True, True
        elif not final:
            end -= _partial_suffix(raw, self.stop)
        return self._route(end, final)

    def _route(self, end: int, final: bool) -> list[Delta]:
        """Split raw[done:end] between the fields, holding back what is not yet certain."""
        deltas: list[Delta] = []
        end = max(end, self._done)
        if self.phase == REASONING:
            close = self._raw.find(THINK_END, self._done, end)
            if close >= 0:
                deltas += self._emit(REASONING, self._raw[self._done : close].rstrip())
                self._done, self.phase = close + len(THINK_END), CONTENT
            else:
                stop_at = end
                if not final:
                    stop_at = max(self._done, stop_at - _partial_suffix(self._raw[:end], [THINK_END]))
                    seg = self._raw[self._done : stop_at]
                    stop_at = self._done + len(seg.rstrip())  # whitespace right before `</think>` is dropped
                deltas += self._emit(REASONING, self._raw[self._done : stop_at])
                self._done = stop_at
                return deltas
        seg = self._raw[self._done : end]
        if not self._content_started:  # the template puts blank lines between `</think>` and the answer
            seg = seg.lstrip("\n")
            self._content_started = bool(seg)
        deltas += self._emit(CONTENT, seg)
        self._done = end
        return deltas

    def _emit(self, field: str, text: str) -> list[Delta]:
        if not text:
            return []
        self.text[field] += text
        return [(field, text)]
