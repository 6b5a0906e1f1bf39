"""Patch 0115's stream plan without a GPU: `bench/device/streams_on_cpu/check.sh` cuts the planner out of the
patched ggml-cuda.cu and common.cuh and plans the tiny preset's real preview and fused pass, as a CPU engine
records them, the way the CUDA backend would. CI has no GPU, so this is the only place CI runs that code."""

from __future__ import annotations

import re

import pytest
from host_checks import needs_gxx, run_check

pytestmark = needs_gxx


@pytest.fixture(scope="module")
def plan() -> dict[str, list[tuple[str, str, int]]]:
    """Each pass's regions as (fork, join op, streams), from one run of the check (exit 0: none failed)."""
    out = run_check("streams_on_cpu/check.sh")
    assert "FAIL" not in out, out
    passes: dict[str, list[tuple[str, str, int]]] = {}
    for line in out.splitlines():
        if line.startswith("-- "):
            regions = passes.setdefault(line[3:], [])
        elif m := re.match(r"  (\S+) -> \S+ \((\w+)\): (\d+) streams", line):
            regions.append((m[1], m[2], int(m[3])))
    return passes


def test_every_layer_of_both_passes_runs_its_branches_side_by_side(plan):
    # the tiny preset: 3 GDN layers and 1 attention layer, each followed by a MoE block
    assert set(plan) == {"preview", "fused"}
    for regions in plan.values():
        forks = [f"attn{k}-{i}" for i in range(4) for k in ("_norm", "_post_norm")]
        assert [fork for fork, _, _ in regions] == forks
        assert all(streams >= 2 for _, _, streams in regions), regions


def test_the_moe_block_joins_at_its_output_and_attention_at_flash_attention(plan):
    for regions in plan.values():
        assert [op for fork, op, _ in regions if fork.startswith("attn_post_norm")] == ["ADD"] * 4
        assert regions[6][1:] == ("FLASH_ATTN_EXT", 3)  # q, k and v


def test_the_fused_pass_s_causal_gdn_rows_split_their_projections(plan):
    # qkv, z, alpha and beta of the causal rows, joined at the delta-net op
    assert [r[1:] for r in plan["fused"][0:6:2]] == [("GATED_DELTA_NET", 4)] * 3
