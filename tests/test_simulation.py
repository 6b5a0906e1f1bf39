"""The labelled acceptance simulations run the real loops with exactly the acceptance they claim."""

from __future__ import annotations

import numpy as np
import pytest

from clover_local import loops, simulation, speculative
from clover_local.backend import GREEDY, Sampler
from clover_local.model.config import CheckpointConfig
from clover_local.policy import DecodingSettings
from clover_local.reference.backend import NumpyBackend
from clover_local.reference.model import ReferenceModel

PROMPT = [475, 84, 82, 269, 198, 432, 295, 266, 392, 281]


@pytest.fixture(scope="module")
def backend(tiny_checkpoint) -> NumpyBackend:
    return NumpyBackend(ReferenceModel.from_checkpoint(tiny_checkpoint, dtype=np.float32))


@pytest.fixture(scope="module")
def mask_id(tiny_checkpoint) -> int:
    return CheckpointConfig.from_dir(tiny_checkpoint).model.mask_token_id


@pytest.mark.parametrize("shift", [1, 0])
@pytest.mark.parametrize("k", [1, 2, 3, 8])
def test_diffusion_resolves_exactly_k_per_pass(backend, mask_id, k, shift):
    s = DecodingSettings(mask_token_id=mask_id, block_size=8, max_new_tokens=24, logit_shift=shift)
    fill = simulation.FixedFill(backend, k, s)
    result = loops.complete(fill, PROMPT, s)
    assert len(result.tokens) == 24
    per_block = [k] * (8 // k) + ([8 % k] if 8 % k else [])
    assert list(result.tokens_per_pass) == per_block * 3
    run = simulation.diffusion(backend, PROMPT, s, k)
    assert run["passes"] == len(per_block) * 3 and run["tokens"] == 24


@pytest.mark.parametrize("a", [0, 1, 2, 5])
def test_speculative_accepts_exactly_a_when_more_are_drafted(backend, mask_id, a):
    s = DecodingSettings(mask_token_id=mask_id, block_size=8, max_new_tokens=80)
    events = list(
        speculative.speculative_loop(
            simulation.FixedAccept(backend, a), PROMPT, s, speculative.SpeculativeSettings()
        )
    )
    iterations = [e for e in events if isinstance(e, speculative.IterationEvent)]
    assert all(e.accepted == min(a, len(e.draft)) for e in iterations)
    assert sum(len(e.tokens) for e in iterations) == 80
    run = simulation.self_speculative(backend, PROMPT, s, a)
    assert run["tokens"] == 80
    if a == 0:  # drafting stops: nearly every iteration is a plain AR step
        assert run["mean_draft_length"] < 0.3
    else:  # the draft length settles at a: most iterations yield a + 1 tokens (the first
        # iteration is the shadow check's plain step)
        assert run["tokens_per_pass"] > 0.7 * (a + 1)


def test_simulations_refuse_what_they_cannot_fix(backend, mask_id):
    s = DecodingSettings(mask_token_id=mask_id, block_size=8, threshold=0.0)
    with pytest.raises(ValueError, match="threshold"):
        simulation.FixedFill(backend, 2, s)
    with pytest.raises(ValueError, match="greedy"):
        simulation.FixedAccept(backend, 1).verify_and_draft([1], None, [], Sampler(1.0))


def test_draftless_iterations_run_the_ar_step(backend, mask_id):
    """Once drafts stop paying (a = 0), iterations are the `ar` loop's commit, not a verification:
    only the first pass and the probes verify."""
    calls = {"commit": 0, "verify_and_draft": 0}

    class Counting(simulation.FixedAccept):
        def commit(self, tokens, adj, draw=None):
            calls["commit"] += 1
            return super().commit(tokens, adj, draw)

        def verify_and_draft(self, tokens, adjs, preview, sampler=GREEDY, routing=None):
            calls["verify_and_draft"] += 1
            return super().verify_and_draft(tokens, adjs, preview, sampler, routing)

    s = DecodingSettings(mask_token_id=mask_id, block_size=8, max_new_tokens=120)
    result = loops.last_result(
        speculative.speculative_loop(Counting(backend, 0), PROMPT, s, speculative.SpeculativeSettings())
    )
    assert len(result.tokens) == 120
    assert calls["commit"] > 100 and calls["verify_and_draft"] < 10, calls
