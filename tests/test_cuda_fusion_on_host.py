"""Patches 0114's, 0116's, 0117's and 0118's CUDA fusions, and 0122's test of the expert matmuls' ids,
without a GPU: `bench/device/fusion_on_cpu/check.sh` cuts each kernel and matcher out of the patched
clover-fusion.cu and runs them on host threads against ggml's CPU backend, on test-backend-ops' graphs and
on the tiny preset's real preview and fused pass with every tensor where the allocator put it. CI has no
GPU, so this is the only place CI runs that code."""

from __future__ import annotations

import re

import pytest
from host_checks import needs_gxx, run_check, summaries

pytestmark = needs_gxx


@pytest.fixture(scope="module")
def check_output() -> str:
    """One run of every check (the patched tree is prepared once)."""
    return run_check("fusion_on_cpu/check.sh", "all")


def test_kernels_match_the_cpu_on_the_test_cases(check_output):
    # the coreset's cases (its rows' kernel picking candidates with Ampere's warp reductions, then with
    # shuffles), the conv's, the block softmax's, the head's: each program ends with its count
    summary = summaries(check_output)
    assert len(summary) == 5 and all(n > 0 and f == 0 for n, f in summary), check_output


def test_the_head_takes_the_model_s_vocabulary_and_a_row_count_past_a_ctas_rows(check_output):
    # 248320 tokens in chunks of 1940 (the 35B-A3B's head); 130 rows: the rows' kernel's last CTA is partial
    for case in ("n_vocab=248320,n_rows=8,chunk=1940", "n_vocab=1024,n_rows=130,chunk=512"):
        assert f"{case}: the construction's 29 nodes from node 3; 0 of" in check_output, check_output


def test_the_block_softmax_takes_the_whole_construction_at_the_model_s_sizes(check_output):
    # 16 key and 32 value heads of 128, 32 rows, the state gathered (a preview) and a view (a fused pass);
    # 0120's 16 warps a CTA and the 8 of its switch, each against the CPU graph
    for gathered in (1, 0):
        for warps in ("", ",warps=8"):
            case = f"d_k=128,d_v=128,n=32,h_k=16,h_v=32,gathered_state={gathered}{warps}: the construction's"
            line = re.search(re.escape(case) + ".*", check_output)
            assert line and "NMSE against the CPU graph" in line[0] and "FAIL" not in line[0], check_output


def test_kernels_match_the_cpu_on_a_real_preview_with_its_allocation(check_output):
    # the tiny preset's 3 GDN and 4 MoE layers in both passes; in the preview the allocator gives the conv's
    # output memory of its inputs, which the kernel must not write over (the first version of 0114 did)
    # (the matchers asked as ggml_cuda_try_fuse asks them: the first construction found stands for its nodes)
    found = (
        "3 conv constructions and 3 block softmaxes (3 expected of each), 4 coresets (4 expected), 0 failed"
    )
    assert check_output.count(found) == 2, check_output
    # the head after the preview's 32 rows and after the fused pass's 64 (its causal rows and its block)
    for rows in (32, 64):
        found_head = rf"\(512 tokens, {rows} rows, chunks of 256\): 0 tokens differ"
        head = r"head: result_token_prob, 30 nodes from node \d+ " + found_head
        assert re.search(head, check_output), check_output
    assert check_output.count("1 heads (1 expected)") == 2, check_output
    conv = "conv: conv_output_silu-0, 8 nodes from node 10 (128 channels, 32 rows, output staged)"
    assert conv in check_output, check_output
    # the block softmax's output gets the conv output's memory too; in the preview its state is gathered
    block_softmax = r"block softmax: .*, 33 nodes from node 20 \(.*state gathered, output staged\)"
    assert re.search(block_softmax, check_output), check_output


def test_every_expert_matmul_of_a_real_pass_reads_its_ids_as_a_coreset_s(check_output):
    # patch 0122: the narrow kernel's tile follows where a MUL_MAT_ID's ids come from. In both passes (the
    # coreset on) all 12 expert matmuls (gate, up, down of 4 MoE layers) take the coreset's top-k, the fused
    # pass's through the CONCAT of its causal rows' unrestricted logits and its block's; each coreset's own
    # top-k of the unrestricted router probabilities must not read as one
    found = "expert matmuls: 12 of 12 with ids from a coreset; coresets' own top-k: 0 of 4 read as from one"
    assert check_output.count(found) == 2, check_output
