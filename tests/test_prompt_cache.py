"""Prompt reuse across requests (`prompt_cache`): a continuation runs only its new tokens, the next
chat turn restores the checkpoint where the previous history ended, a different prompt starts
over, and each gives the tokens a fresh model gives."""

from __future__ import annotations

import pytest

from clover_local.api import Clover
from clover_local.prompt_cache import Checkpoint, PromptCache

SYSTEM = {"role": "system", "content": "You answer briefly."}


def test_plan_keeps_what_the_sequence_holds_or_the_longest_matching_checkpoint():
    cache = PromptCache(held=[1, 2, 3, 4, 5])
    assert cache.plan([1, 2, 3, 4, 5, 6]).how == "extended"
    assert cache.plan([1, 2, 3, 4, 5, 6]).kept == 5
    assert cache.plan([1, 2, 9]).how == "none"  # diverges, no checkpoint
    cache.checkpoints = [Checkpoint((1, 2), b""), Checkpoint((1, 2, 3), b""), Checkpoint((7, 8), b"")]
    plan = cache.plan([1, 2, 3, 9])
    assert (plan.how, plan.kept) == ("checkpoint", 3)
    assert cache.plan([1, 2, 3]).kept == 2  # the same prompt again: one token left to run
    assert PromptCache(held=None).plan([1, 2]).how == "none"  # unknown after a failed pass


@pytest.mark.llama
@pytest.mark.parametrize("mode", ["diffusion", "ar", "speculative"])
def test_chat_turns_keep_the_history_and_answer_as_a_fresh_model(llama_gguf, mode):
    clover = Clover(llama_gguf, n_ctx=4096, mode=mode)
    messages = [SYSTEM, {"role": "user", "content": "Name three colours. " * 20}]
    kept, prompts = [], []
    for turn in range(3):
        got = clover.create_chat_completion(messages, max_tokens=24, thinking=False)
        fresh = Clover(llama_gguf, n_ctx=4096, mode=mode).create_chat_completion(
            messages, max_tokens=24, thinking=False
        )
        assert got["clover"]["tokens"] == fresh["clover"]["tokens"]
        kept.append((got["clover"]["prompt_cache"], got["clover"]["prompt_kept_tokens"]))
        prompts.append(got["usage"]["prompt_tokens"])
        messages = [*messages, got["choices"][0]["message"], {"role": "user", "content": f"More {turn}."}]
    assert kept[0] == ("none", 0)
    for (how, n), previous in zip(
        kept[1:], prompts[:-1], strict=True
    ):  # the previous prompt but its generation prompt
        assert how == "checkpoint" and previous - 16 <= n < previous


@pytest.mark.llama
def test_a_continuation_runs_only_its_new_tokens_and_a_new_prompt_starts_over(llama_gguf):
    clover = Clover(llama_gguf, n_ctx=4096)
    prompt = clover.tokenize(b"Once upon a time there was a clover field")
    first = clover.create_completion(prompt, max_tokens=16)
    held = prompt + first["clover"]["tokens"]
    more = held + clover.tokenize(b" and then")
    second = clover.create_completion(more, max_tokens=16)
    assert (second["clover"]["prompt_cache"], second["clover"]["prompt_kept_tokens"]) == (
        "extended",
        len(held),
    )
    assert (
        second["clover"]["tokens"]
        == Clover(llama_gguf, n_ctx=4096).create_completion(more, max_tokens=16)["clover"]["tokens"]
    )
    other = clover.create_completion(clover.tokenize(b"A different start"), max_tokens=8)
    assert (other["clover"]["prompt_cache"], other["clover"]["prompt_kept_tokens"]) == ("none", 0)
