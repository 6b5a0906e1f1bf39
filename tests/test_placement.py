"""llama.cpp's placement options and the memory estimate.

Every option reaches llama.cpp (read back from its own log of the load: tensor buffer overrides,
load mode, flash attention, cache types), weight placement changes no token of an F32 model, and
the estimate is within 10% of the buffers llama.cpp allocates on the generated models. The rules
without a GPU (layer assignment, overrides, advice) are checked against llama.cpp's as written in
its source (`llama-model.cpp`, `common/arg.cpp`)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from clover_local import llama
from clover_local.memory import (
    CPU,
    MemoryFitError,
    ModelShape,
    allocated,
    estimate,
    layer_devices,
    plan,
    summary,
)
from clover_local.placement import EXPERTS_REGEX, Placement, PlacementError

CLOVER = str(Path(sys.executable).with_name("clover"))
needs_llama = pytest.mark.skipif(llama.unavailable() is not None, reason=llama.unavailable() or "")


def clover(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([CLOVER, *args], capture_output=True, text=True, timeout=300)


# -- options --------------------------------------------------------------------------------------


def test_options_are_checked_as_llama_cpp_checks_them():
    with pytest.raises(PlacementError, match="--cache-type-k 'q3_k'"):
        Placement(cache_type_k="q3_k")
    with pytest.raises(PlacementError, match="needs flash attention"):
        Placement(cache_type_v="q8_0", flash_attn="off")
    Placement(cache_type_k="q8_0", flash_attn="off")  # a quantized K alone runs without it
    with pytest.raises(PlacementError, match="PATTERN=BUFFER"):
        Placement(override_tensor=("exps",))
    with pytest.raises(PlacementError, match="bad pattern"):
        Placement(override_tensor=("(exps=CPU",))
    with pytest.raises(PlacementError, match="--n-cpu-moe"):
        Placement(n_cpu_moe=-1)


def test_overrides_follow_llama_cpp_order_and_patterns():
    p = Placement(override_tensor="blk\\.3\\.ffn_up_exps=CUDA0,output=CPU", cpu_moe=True, n_cpu_moe=2)
    assert p.overrides()[:3] == [
        ("blk\\.3\\.ffn_up_exps", "CUDA0"),
        ("output", "CPU"),
        (EXPERTS_REGEX, "CPU"),
    ]
    assert p.buffer_for("blk.3.ffn_up_exps.weight") == "CUDA0"  # the user's rule comes first
    assert p.buffer_for("blk.7.ffn_gate_exps.weight") == "CPU"
    assert p.buffer_for("blk.7.ffn_gate_shexp.weight") is None  # the shared expert stays
    first = Placement(n_cpu_moe=2)
    assert [first.buffer_for(f"blk.{i}.ffn_down_exps.weight") for i in (0, 1, 2, 12)] == [
        "CPU",
        "CPU",
        None,
        None,
    ]


def test_llama_cpp_python_argument_names():
    p = Placement.from_llama_kwargs(flash_attn=True, type_k=8, type_v="q4_0", use_mmap=False)
    assert (p.flash_attn, p.cache_type_k, p.cache_type_v, p.use_mmap) == ("on", "q8_0", "q4_0", False)
    assert Placement.from_llama_kwargs(flash_attn=None).flash_attn == "auto"
    assert p.options() == ["-fa on", "-ctk q8_0", "-ctv q4_0", "--no-mmap"]


# -- where llama.cpp puts layers and tensors ------------------------------------------------------


def test_layers_go_to_the_gpu_from_the_end_as_llama_cpp_assigns_them():
    # i_gpu_start = n_layer + 1 - ngl: ngl 1 offloads the output head only
    assert layer_devices(4, 1, ["G"], [1]) == [CPU, CPU, CPU, CPU, "G"]
    assert layer_devices(4, 3, ["G"], [1]) == [CPU, CPU, "G", "G", "G"]
    assert layer_devices(4, -1, ["G"], [1]) == ["G"] * 5
    assert layer_devices(4, -1, [], []) == [CPU] * 5
    # two GPUs split in proportion to free memory (upper_bound of the layer's fraction)
    assert layer_devices(3, -1, ["A", "B"], [3, 1]) == ["A", "A", "A", "B"]


def shape(**kw) -> ModelShape:
    tensors = {
        "token_embd.weight": 100,
        "output.weight": 100,
        "output_norm.weight": 1,
        **{f"blk.{i}.ffn_{p}_exps.weight": 1000 for i in range(4) for p in ("gate", "up", "down")},
        **{f"blk.{i}.attn_norm.weight": 10 for i in range(4)},
    }
    base = dict(
        tensors=tensors,
        n_layer=4,
        attention_layers=(3,),
        gdn_layers=(0, 1, 2),
        kv_row=(512, 512),
        recurrent_row=(100, 1000),
        block_size=32,
    )
    return ModelShape(**{**base, **kw})


def test_estimate_per_device_and_the_advice_when_it_does_not_fit():
    gib = 2**30
    plain = estimate(shape(), Placement(), -1, 1000, gpus=[("GPU0", gib)], ram_free=gib)
    gpu, cpu = plain.device("GPU0"), plain.device(CPU)
    assert (cpu.weights, gpu.weights) == (100, 100 + 1 + 12000 + 40)
    assert gpu.kv == 1024 * 512 * 2 * 2  # context padded to 1024 cells, K and V in f16
    assert gpu.recurrent == 3 * 1100 * 4
    spec = estimate(shape(), Placement(), -1, 1000, snapshots=32, gpus=[("GPU0", gib)])
    assert spec.device("GPU0").recurrent == 33 * gpu.recurrent
    moe = estimate(shape(), Placement(cpu_moe=True, cache_type_k="q8_0"), -1, 1000, gpus=[("GPU0", gib)])
    assert moe.device(CPU).weights == 100 + 12000 and moe.device("GPU0").weights == 141
    assert moe.device("GPU0").kv == 1024 * 512 * (34 / 32 + 2)
    small = estimate(shape(), Placement(), -1, 1000, gpus=[("GPU0", 5000)], ram_free=gib)
    assert not small.fits
    line = summary(small, Placement(), -1)
    assert (
        line.startswith("the model does not fit: GPU0 needs") and "--cpu-moe" in line and "-ctk q8_0" in line
    )


# -- on llama.cpp ---------------------------------------------------------------------------------


def load_log(gguf: Path, *opts: str) -> tuple[str, list[int]]:
    """llama.cpp's log of a real `clover generate` and the tokens it wrote."""
    res = clover(
        "generate", str(gguf), "-p", "The quick brown fox", "-n", "16", "--raw", "--json", "--verbose",
        "--mode", "diffusion", *opts,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr[-2000:]
    return res.stderr, json.loads(res.stdout)["clover"]["tokens"]


@needs_llama
@pytest.mark.llama
def test_experts_in_system_ram_default_to_the_ar_mode(llama_gguf):
    from clover_local.api import Clover

    for kw, mode in (
        ({}, "diffusion"),
        ({"cpu_moe": True}, "ar"),
        ({"n_cpu_moe": 1}, "ar"),
        ({"override_tensor": "exps=CPU"}, "ar"),
        ({"cpu_moe": True, "mode": "diffusion"}, "diffusion"),
    ):
        with Clover(llama_gguf, n_ctx=256, **kw) as llm:
            assert llm.mode == mode, kw
    res = clover("generate", str(llama_gguf), "-p", "Hi", "-n", "4", "--cpu-moe", "--json")
    assert res.returncode == 0, res.stderr[-1000:]
    assert json.loads(res.stdout)["clover"]["mode"] == "ar"


@needs_llama
@pytest.mark.llama
def test_every_option_reaches_llama_cpp_and_weight_placement_changes_no_token(gguf_factory):
    _, gguf = gguf_factory("small")
    plain_log, plain = load_log(gguf)
    assert "buffer type overridden" not in plain_log
    overridden = re.compile(r"tensor (\S+) \(.*\) buffer type overridden to CPU")

    log, tokens = load_log(gguf, "--cpu-moe", "--no-mmap", "--mlock")
    assert sorted(set(overridden.findall(log))) == sorted(
        f"blk.{i}.ffn_{p}_exps.weight" for i in range(8) for p in ("gate", "up", "down")
    )
    assert "load_mode = mlock" in log and tokens == plain

    log, tokens = load_log(gguf, "--n-cpu-moe", "2", "-ot", "blk\\.7\\.ffn_up_exps=CPU", "--no-mmap")
    assert sorted(set(overridden.findall(log))) == sorted(
        ["blk.7.ffn_up_exps.weight"]
        + [f"blk.{i}.ffn_{p}_exps.weight" for i in range(2) for p in ("gate", "up", "down")]
    )
    assert "load_mode = none" in log and tokens == plain

    log, _ = load_log(gguf, "-fa", "on", "-ctk", "q8_0", "-ctv", "q4_0")
    assert "flash_attn            = enabled" in log and "K (q8_0)" in log and "V (q4_0)" in log
    log, _ = load_log(gguf, "-fa", "off", "-ctk", "f32", "-ctv", "f32")
    assert "flash_attn            = disabled" in log and "K (f32)" in log and "V (f32)" in log


@needs_llama
def test_op_offload_goes_into_the_context_params():
    from clover_local.llama.placement import Params

    assert Params(Placement(op_offload=False), 0, 256, 32, 0).context.op_offload is False
    assert Params(Placement(), 0, 256, 32, 0).context.op_offload is True


@needs_llama
@pytest.mark.llama
@pytest.mark.parametrize(
    ("preset", "opts"),
    [
        ("tiny", ()),
        ("small", ("--mode", "speculative", "-c", "4096")),
        ("small", ("-ctk", "q8_0", "-ctv", "q4_0", "-fa", "on", "-c", "20000")),
        ("tiny-qwen-vocab", ("--mode", "ar", "-fa", "off", "-c", "2048")),
    ],
)
def test_estimate_is_within_10_percent_of_what_llama_cpp_allocates(gguf_factory, preset, opts):
    _, gguf = gguf_factory(preset)
    log, _ = load_log(gguf, *opts)
    got = allocated(log)[CPU]
    o = dict(zip(opts[::2], opts[1::2], strict=True))
    placement = Placement(
        flash_attn=o.get("-fa", "auto"), cache_type_k=o.get("-ctk", "f16"), cache_type_v=o.get("-ctv", "f16")
    )
    est = plan(gguf, placement, -1, int(o.get("-c", 8192)), speculative=o.get("--mode") == "speculative")
    cpu = est.device(CPU)
    for kind in ("weights", "kv", "recurrent", "compute"):
        assert got[kind] == pytest.approx(getattr(cpu, kind), rel=0.1, abs=2**14), (kind, got, est.line())
    assert est.line().rsplit(" of ", 1)[0] in log  # the line the command printed before loading


@needs_llama
@pytest.mark.llama
def test_a_model_that_cannot_fit_ends_in_one_line_before_loading(gguf_factory, monkeypatch):
    from clover_local import Clover, memory

    _, gguf = gguf_factory("tiny")
    monkeypatch.setattr(memory, "ram_available", lambda: 2**20)  # 1 MiB of RAM left
    seen = []
    with pytest.raises(MemoryFitError, match=r"^the model does not fit: CPU needs .* free; try ") as e:
        Clover(gguf, n_ctx=2048, use_mmap=False, on_memory=seen.append)
    assert "a smaller --n-ctx (now 2048)" in str(e.value) and "\n" not in str(e.value)
    assert seen and not seen[0].fits
    # mapped weights may page: with mmap the same budget is judged on the rest only
    assert not memory.plan(gguf, Placement(), 0, 2048).fits


@needs_llama
def test_info_shows_the_estimate_for_a_context_and_mode(gguf_factory):
    _, gguf = gguf_factory("tiny")
    runs = {}
    for mode in ("diffusion", "speculative"):
        res = clover("info", str(gguf), "-c", "4096", "--mode", mode, "-ctk", "q8_0", "--json")
        assert res.returncode == 0, res.stderr
        runs[mode] = json.loads(res.stdout)["memory"]
    plain, spec = runs["diffusion"], runs["speculative"]
    assert plain["n_ctx"] == 4096 and (plain["snapshots"], spec["snapshots"]) == (0, 32)
    cpu, cpu_spec = plain["devices"][CPU], spec["devices"][CPU]
    shape_ = ModelShape.read(gguf)
    k, v = shape_.kv_row
    assert cpu["kv"] == len(shape_.attention_layers) * 4096 * (k * 34 / 32 + v * 2)
    assert cpu_spec["recurrent"] == 33 * cpu["recurrent"] > 0
    assert cpu["compute"] > 0 and plain["fits"]
    # patch 0401's graph slots: four schedulers of their own, each at most a 64-row reservation
    assert 0 < cpu["graphs"] <= 4 * cpu["compute"]
    assert cpu["total"] == sum(cpu[k] for k in ("weights", "kv", "recurrent", "compute", "graphs"))
    table = clover("info", str(gguf), "-c", "4096")
    assert "memory" in table.stdout and "context 4096" in table.stdout


@needs_llama
def test_the_estimate_has_no_graph_slots_when_they_are_off(gguf_factory, monkeypatch):
    from clover_local import memory

    _, gguf = gguf_factory("tiny")
    on = memory.plan(gguf, Placement(), 0, 2048).device(CPU)
    monkeypatch.setenv("LLAMA_GRAPH_CACHE", "0")
    off = memory.plan(gguf, Placement(), 0, 2048).device(CPU)
    assert on.graphs > 0 and off.graphs == 0 and on.compute == off.compute
    assert "graph slots" in on.line() and "graph slots" not in off.line()
