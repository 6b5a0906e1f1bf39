"""Prompt reuse across requests: which tokens a sequence already holds and what can be kept.

The K/V cache can be cut at any position, the Gated DeltaNet state cannot: it is one state, of
the last position. So a new prompt keeps
- everything held, when it extends what the sequence holds (a continuation, or a chat turn whose
  history is the previous request's prompt and response token for token);
- else the longest held prefix that has a recurrent-state checkpoint (a copy of the GDN state
  taken at that position, as llama-server's context checkpoints): the K/V is cut there and the
  state restored. A chat request has one taken where its history ends (before the template's
  generation prompt), so the next turn, whose template re-renders the previous answer
  differently (the reasoning dropped), keeps the whole previous history;
- else nothing (a full prefill).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

MAX_CHECKPOINTS = 3  # each holds every GDN layer's state (about 63 MB at the real model's size)


@dataclass(frozen=True)
class Checkpoint:
    tokens: tuple[int, ...]  # what the sequence held when it was taken
    state: Any  # a buffer: the recurrent state (llama_state_seq_get_data_ext, partial only)


@dataclass(frozen=True)
class Reuse:
    """What a prefill kept: `kept` tokens, by `how` ("extended", "checkpoint" or "none")."""

    kept: int
    how: str
    checkpoint: Checkpoint | None = None


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


@dataclass
class PromptCache:
    """The tokens a sequence holds (None: unknown, after a failed pass) and its checkpoints."""

    held: list[int] | None = field(default_factory=list)
    checkpoints: list[Checkpoint] = field(default_factory=list)

    def plan(self, prompt: Sequence[int]) -> Reuse:
        """The best reuse for `prompt`; at least one prompt token is always left to run."""
        if not self.held:
            return Reuse(0, "none")
        shared = common_prefix(self.held, prompt)
        if shared == len(self.held) and shared < len(prompt):
            return Reuse(shared, "extended")
        usable = [c for c in self.checkpoints if len(c.tokens) <= shared and len(c.tokens) < len(prompt)]
        usable = [c for c in usable if list(c.tokens) == list(prompt[: len(c.tokens)])]
        if usable:
            best = max(usable, key=lambda c: len(c.tokens))
            return Reuse(len(best.tokens), "checkpoint", best)
        return Reuse(0, "none")

    def wants_checkpoint(self, prompt: Sequence[int], kept: int, at: int) -> bool:
        """Whether a prefill of `prompt`, holding `kept` tokens, takes a checkpoint at `at`:
        inside what it runs, and not one it already has."""
        if not kept < at < len(prompt):
            return False
        return not any(c.tokens == tuple(prompt[:at]) for c in self.checkpoints)

    def add_checkpoint(self, state: Any) -> None:
        assert self.held is not None
        self.checkpoints = [*self.checkpoints[-(MAX_CHECKPOINTS - 1) :], Checkpoint(tuple(self.held), state)]

    def append(self, tokens: Sequence[int]) -> None:
        if self.held is not None:
            self.held.extend(int(t) for t in tokens)

    def cut(self, n: int) -> None:
        if self.held is not None:
            del self.held[n:]
