"""Patch 0105's narrow MMQ kernel without a GPU: `bench/device/narrow_on_cpu/check.sh` cuts mmq-narrow.cu
(its launch, the activations' conversion, the kernel) and mmid.cu's ids helper out of the patched tree and
runs them on host threads, mma.sync, halves and cp.async emulated (a copy lands only when its thread waits for
it), against ggml's CPU backend on dense and expert graphs, in five settings of its measurement switches (the
last: the ids as a block coreset's, patch 0122's path). CI has no GPU, so this is the only place CI runs that
code."""

from __future__ import annotations

import re

import pytest
from host_checks import needs_gxx, run_check, summaries

pytestmark = needs_gxx


@pytest.fixture(scope="module")
def check_output() -> str:
    return run_check("narrow_on_cpu/check.sh")


def test_every_setting_runs_cases_and_none_fails(check_output):
    summary = summaries(check_output)
    assert len(summary) == 5 and all(n > 0 and f == 0 for n, f in summary), check_output


def test_the_defaults_take_halves_at_the_model_s_projections(check_output):
    # patch 0119: dense matmuls of 9-32 columns below 65536 rows in halves, the z projection's shape (Q6_K
    # 4096 x 2048, 32 columns) among them: rounded to halves, so not the CPU's own dot products
    defaults = check_output.split("-- ")[1]
    for shape in (r"m=1024,n=16,k=2048", r"m=4096,n=32,k=2048"):
        nmse = re.search(r"type_a=q6_K,type_b=f32," + shape + r",.*: NMSE against the CPU (\S+)", defaults)
        assert nmse and 1e-10 < float(nmse.group(1)) < 5e-4, defaults


def test_int8_makes_the_cpu_s_dot_products(check_output):
    # the int8 setting at the z projection's shape: q8_K activations, the sums in integers, as ggml's CPU does
    int8 = check_output.split("-- ")[3]
    nmse = re.search(r"type_a=q6_K,type_b=f32,m=4096,n=32,k=2048,.*: NMSE against the CPU (\S+)", int8)
    assert nmse and float(nmse.group(1)) < 1e-10, int8


def test_the_experts_run_on_a_coreset_and_with_their_glu(check_output):
    # the routed experts at the 35B-A3B's shapes on a coreset of 8 of 256 (int8 gate and up, halves down),
    # and the gate, up and SwiGLU in one launch, in the defaults
    defaults = check_output.split("-- ")[1]
    passed = r": NMSE against the CPU [0-9.e-]+\n"
    for case in (
        r"type_a=q4_K,type_b=f32,n_mats=256,n_used=8,b=1,m=512,n=32,k=2048,.*n_active=8",
        r"type_a=q6_K,type_b=f32,n_mats=256,n_used=8,b=0,m=2048,n=32,k=512,.*n_active=8",
        r"gate, up and SwiGLU, Q4_K 512 x 2048, 32 tokens over 8 experts",
    ):
        assert re.search(case + passed, defaults), defaults


def test_the_pipeline_stages_halves_where_they_fit_and_int8_at_k_2048(check_output):
    # patches 0123 and 0124: where tokens spread over the experts, MUL_MAT_ID copies its weights to shared
    # memory (Q6_K from K 512, Q4_K and Q5_K from K 1024). Beside the stages the activations stay in halves
    # where two CTAs an SM hold both (K 512 and 1024 at tiles of 16) and go to int8 (q8_K: the CPU's own dot
    # products) where they do not (K 2048: the Q4_K gate). The NMSE tells the activations' format, not the
    # copies: whether the copies are right is what the check's cases against the CPU assert, each with its
    # cp.async landing late.
    defaults = check_output.split("-- ")[1]
    for case, exact in (
        (r"type_a=q4_K,type_b=f32,n_mats=256,n_used=8,b=1,m=512,n=32,k=2048,", True),
        (r"type_a=q5_K,type_b=f32,n_mats=64,n_used=8,b=1,m=256,n=12,k=1024,", False),
        (r"type_a=q6_K,type_b=f32,n_mats=256,n_used=8,b=0,m=2048,n=32,k=512,", False),
    ):
        nmse = re.search(case + r".*: NMSE against the CPU (\S+)", defaults)
        assert nmse and (float(nmse.group(1)) < 1e-10) == exact, defaults
