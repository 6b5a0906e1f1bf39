"""Every op of the Clover graphs (prefill, preview with coreset, commit) is one that the pinned tree's
Metal and CUDA backends declare they support, read from their `supports_op` sources in the sdist."""

from __future__ import annotations

import os
import re

import numpy as np
import pytest
from clover_convert.pipeline import Options, convert, prepare
from clover_patches import source

from clover_local.backend import Draw, Sampler
from clover_local.llama import unavailable
from clover_local.policy import DecodingSettings, row_adjustments

SKIP = unavailable()
N_GPU_LAYERS = int(
    os.environ.get("CLOVER_TEST_N_GPU_LAYERS", "0")
)  # run on a GPU build (see test_llama_engine)

BACKENDS = {
    "metal": (
        "vendor/llama.cpp/ggml/src/ggml-metal/ggml-metal-device.m",
        "bool ggml_metal_device_supports_op(",
    ),
    "cuda": (
        "vendor/llama.cpp/ggml/src/ggml-cuda/ggml-cuda.cu",
        "static bool ggml_backend_cuda_device_supports_op(",
    ),
}
# node types in our graphs (f16: the default K/V cache);
# weights of any type only enter mul_mat(_id) and get_rows
NODE_TYPES = {"f32", "f16", "i32"}


def function_body(src: str, signature: str) -> str:
    """The brace-delimited body of the function whose definition starts with `signature`."""
    start = src.index("{", src.index(signature))
    depth = 0
    for i in range(start, len(src)):
        depth += {"{": 1, "}": -1}.get(src[i], 0)
        if depth == 0:
            return src[start : i + 1]
    raise ValueError(f"unbalanced braces after {signature}")


def case_code(body: str, label: str) -> str | None:
    """What `case LABEL:` runs: the code after its group of case labels up to the next label of
    the same family (`GGML_OP_`, `GGML_UNARY_OP_`, ...) or `default:`; None when not listed."""
    family = label[: label.rindex("_OP_") + 4]
    m = re.search(rf"case {label}:", body)
    if m is None:
        return None
    rest = body[m.end() :]
    rest = re.sub(rf"^(\s*(//[^\n]*)?\s*case {family}\w+:)*", "", rest)
    end = re.search(rf"case {family}\w+:|default:", rest)
    return rest[: end.start() if end else len(rest)]


def declared(body: str, label: str) -> bool:
    code = case_code(body, label)
    return code is not None and not re.sub(r"//[^\n]*", "", code).strip().startswith("return false")


def test_parser_reads_a_supports_op_switch():
    body = function_body(
        "bool f(x) { switch (op->op) { case GGML_OP_A: case GGML_OP_B: return true;"
        " case GGML_OP_C: return false;"
        " case GGML_OP_UNARY: switch (u) { case GGML_UNARY_OP_SILU: return ok(op); default: return false; }"
        " default: return false; } }",
        "bool f(",
    )
    assert (
        declared(body, "GGML_OP_A") and declared(body, "GGML_OP_B") and declared(body, "GGML_UNARY_OP_SILU")
    )
    assert not declared(body, "GGML_OP_C") and not declared(body, "GGML_OP_D")
    assert not declared(body, "GGML_UNARY_OP_EXP")


@pytest.fixture(scope="module")
def graph_nodes(checkpoint_factory, tmp_path_factory) -> set[tuple[str, str, tuple[str, ...]]]:
    """(op label, node type, source types) of every node of a prefill, a coreset preview, a commit,
    a fused speculative pass (causal rows with per-row adjustments, then a coreset preview) and
    sampled heads (every cut, top_p alone over the whole vocabulary, min_p alone, none)."""
    if SKIP is not None:
        pytest.skip(SKIP)
    from clover_local.llama import capi
    from clover_local.llama.engine import LlamaEngine

    ckpt = checkpoint_factory("tiny")
    out = tmp_path_factory.mktemp("ops") / "tiny.gguf"
    path = convert(prepare(Options(str(ckpt), outfile=out, outtype="f32", threads=1)), threads=1).shards[0]
    nodes: set[tuple[str, str, tuple[str, ...]]] = set()

    def record(t, ask: bool) -> bool:
        if ask:
            node = t.contents
            op = capi.ggml_op_name(node.op).decode()
            label = (
                f"GGML_OP_{op}"
                if op not in ("UNARY", "GLU")
                else f"GGML_{op}_OP_{capi.ggml_op_desc(t).decode()}"
            )
            srcs = tuple(capi.ggml_type_name(s.contents.type).decode() for s in node.src if s)
            nodes.add((label, capi.ggml_type_name(node.type).decode(), srcs))
        return False

    with LlamaEngine(
        path,
        n_ctx=128,
        n_threads=2,
        n_gpu_layers=N_GPU_LAYERS,
        log=N_GPU_LAYERS > 0,
        coreset=True,
        coreset_top_p=0.5,
        eval_callback=record,
        speculative=True,
    ) as eng:
        rng = np.random.default_rng(0)
        eng.causal_logits(rng.integers(0, eng.vocab_size, 9).tolist())
        eng.preview_logits(rng.integers(0, eng.vocab_size, 8).tolist())
        eng.causal_logits(rng.integers(0, eng.vocab_size, 8).tolist())
        s = DecodingSettings(mask_token_id=0, block_size=8, max_new_tokens=8, presence_penalty=1.0)
        rows = rng.integers(0, eng.vocab_size, 4).tolist()
        adjs = row_adjustments(s, eng.vocab_size, [], [], rows)
        eng.verify_and_draft(rows, adjs, rng.integers(0, eng.vocab_size, 8).tolist())
        adj = adjs.last()
        for sampler in (Sampler(0.7, 40, 0.9, 0.05), Sampler(1.0, top_p=0.9), Sampler(1.3, min_p=0.1)):
            eng.preview(rng.integers(0, eng.vocab_size, 8).tolist(), adj, draw=Draw(sampler, rng.random(8)))
        eng.commit([5], adj, Draw(Sampler(0.8), rng.random(1)))
        # a forced coreset size and the chunked expert dispatch
        eng.bench_tuning(coreset_size=3, moe_chunk=3)
        eng.preview_logits(rng.integers(0, eng.vocab_size, 8).tolist())
        eng.causal_logits(rng.integers(0, eng.vocab_size, 8).tolist())
    return nodes


@pytest.mark.llama
@pytest.mark.parametrize("backend", sorted(BACKENDS))
def test_every_graph_op_is_supported_by_the_backend(graph_nodes, backend):
    relpath, signature = BACKENDS[backend]
    body = function_body(source.read_member(relpath).decode(), signature)
    labels = {label for label, _, _ in graph_nodes}
    assert {
        "GGML_OP_SSM_CONV",
        "GGML_OP_ARGSORT",
        "GGML_OP_TOP_K",
        "GGML_OP_CUMSUM",
        "GGML_OP_SET_ROWS",
        "GGML_OP_ARGMAX",
        "GGML_UNARY_OP_STEP",
    } <= labels
    missing = sorted(label for label in labels if not declared(body, label))
    assert not missing, f"{backend} does not declare support for {missing}"


@pytest.mark.llama
def test_graph_nodes_are_f32_f16_or_i32(graph_nodes):
    odd = sorted(n for n in graph_nodes if n[1] not in NODE_TYPES)
    assert not odd, f"nodes with types the backends may not support: {odd}"
