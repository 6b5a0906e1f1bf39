"""The `clover` command as a user runs it (real subprocesses): `generate` equals the reference's
generation loop token for token and pass for pass, `bench` reports its measures, bad input ends
in one `error:` line, and Hugging Face model specs resolve to the right files."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from gguf import GGUFWriter

from clover_local import llama
from clover_local.loops import diffusion_loop, last_result
from clover_local.model.config import CheckpointConfig
from clover_local.model.gguf_info import ModelFileError
from clover_local.model.location import HubFile, parse_spec, pick_files
from clover_local.model.tokenizer import THINK_END, THINK_START, CloverTokenizer
from clover_local.policy import DecodingSettings
from clover_local.reference.backend import NumpyBackend
from clover_local.reference.model import ReferenceModel

CLOVER = str(Path(sys.executable).with_name("clover"))
PROMPT = "What is the capital of France?"
# penalties and ramps as options, and the policy's names for the same values
OPTIONS = {
    "--presence-penalty": 0.5,
    "--repeat-penalty": 1.3,
    "--stop-ramp-start": 0.2,
    "--stop-ramp-max": 3.0,
    "--think-ramp-start": 0.0,
    "--think-ramp-max": 40.0,
}
SETTINGS = {
    "presence_penalty": 0.5,
    "repetition_penalty": 1.3,
    "stop_ramp_start": 0.2,
    "stop_ramp_max": 3.0,
    "think_ramp_start": 0.0,
    "think_ramp_max": 40.0,
}


def clover(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([CLOVER, *args], capture_output=True, text=True, input=stdin, timeout=300)


def reference_run(ckpt: Path, ids: list[int], **kw: object):
    ck = CheckpointConfig.from_dir(ckpt)
    tok = CloverTokenizer.from_dir(ckpt)
    s = DecodingSettings.from_defaults(
        ck.generation,
        ck.model.mask_token_id,
        think_start_id=tok.token_id(THINK_START),
        think_end_id=tok.token_id(THINK_END),
        **kw,
    )
    return last_result(diffusion_loop(NumpyBackend(ReferenceModel.from_checkpoint(ckpt)), ids, s)), s


def one_error_line(res: subprocess.CompletedProcess[str], code: int = 1) -> str:
    """The error line; a model that loaded said its memory estimate first (one `memory` line)."""
    lines = [line for line in res.stderr.strip().splitlines() if not line.startswith("memory (")]
    assert res.returncode == code and len(lines) == 1 and lines[0].startswith("error: "), res.stderr
    assert "Traceback" not in res.stderr and res.stdout == ""
    return lines[0]


def test_generate_json_is_the_reference_trace_with_penalties_and_ramps(tiny_checkpoint):
    opts = [x for k, v in OPTIONS.items() for x in (k, str(v))]
    res = clover(
        "generate", str(tiny_checkpoint), "--backend", "reference", "-p", PROMPT, "-n", "48", *opts, "--json"
    )
    assert res.returncode == 0, res.stderr
    got = json.loads(res.stdout)
    tok = CloverTokenizer.from_dir(tiny_checkpoint)
    want, s = reference_run(
        tiny_checkpoint, tok.encode_chat([{"role": "user", "content": PROMPT}]), max_new_tokens=48, **SETTINGS
    )
    assert got["clover"]["tokens"] == list(want.tokens)
    assert got["clover"]["passes_per_block"] == list(want.passes_per_block)
    assert got["clover"]["tokens_per_pass"] == list(want.tokens_per_pass)
    assert got["clover"]["passes"] == len(want.tokens_per_pass) and got["finish_reason"] == want.finish_reason
    text = tok.decode([t for t in want.tokens if t not in s.stop_token_ids], skip_special_tokens=True)
    reasoning, _, content = text.partition(THINK_END)
    assert (got["reasoning_content"], got["content"]) == (reasoning.rstrip(), content.lstrip("\n"))

    plain = clover(
        "generate", str(tiny_checkpoint), "--backend", "reference", "-p", PROMPT, "-n", "48", *opts
    )
    assert plain.returncode == 0 and plain.stdout == got["content"] + "\n"  # the answer on stdout


def test_generate_raw_prompt_from_a_file(tiny_checkpoint, tmp_path):
    prompt = tmp_path / "prompt.txt"
    prompt.write_text("The capital of France is")
    res = clover(
        "generate", str(tiny_checkpoint), "--backend", "reference", "--raw", "-f", str(prompt), "-n", "20"
    )
    tok = CloverTokenizer.from_dir(tiny_checkpoint)
    want, s = reference_run(tiny_checkpoint, tok.encode("The capital of France is"), max_new_tokens=20)
    text = tok.decode([t for t in want.tokens if t not in s.stop_token_ids], skip_special_tokens=True)
    assert res.returncode == 0 and res.stdout == text + "\n"


def test_bench_reports_every_measure(tiny_checkpoint):
    sizes = ["--prompt-tokens", "40", "--prompt-tokens", "70", "--gen-tokens", "32", "--repeats", "1"]
    res = clover("bench", str(tiny_checkpoint), "--backend", "reference", *sizes, "--json", "--simulate")
    assert res.returncode == 0, res.stderr
    b = json.loads(res.stdout)
    assert b["prompt_tokens"] == 40 and b["block_size"] == 32
    assert set(b["prompt_processing"]) == {"40", "70"}
    sim = b["simulation"]
    assert "simulation" in sim["label"] and set(sim["e2e_tok_s_by_k"]) == {"1", "2", "4", "8", "16"}
    assert sim["diffusion_runs"]["4"]["tokens_per_pass"] == 4
    assert set(sim["spec_tok_s_by_accept"]) == {"0", "1", "2", "4", "8"}
    for key in (
        "prefill_ms",
        "preview_ms",
        "commit_ms",
        "ar_step_ms",
        "prompt_tokens_per_s",
        "ar_tokens_per_s",
    ):
        assert b[key] > 0
    g = b["generation"]
    assert g["tokens"] <= 32 and g["passes"] >= g["blocks"] >= 1 and g["tokens_per_pass"] > 0


def write_foreign_gguf(path: Path) -> Path:
    w = GGUFWriter(str(path), "llama")
    w.add_block_count(1)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_bad_models_end_in_one_error_line(tiny_checkpoint, tmp_path):
    text_file = tmp_path / "notes.txt"
    text_file.write_text("not a model")
    cases = {
        str(tmp_path / "missing.gguf"): "missing.gguf: file not found",
        str(text_file): "notes.txt: not a GGUF file",
        str(
            write_foreign_gguf(tmp_path / "llama.gguf")
        ): "not a Clover model (architecture 'llama', expected 'clover-moe')",
        str(
            tiny_checkpoint
        ): "is a checkpoint directory; convert it (clover convert) or run it on the numpy reference",
        "owner/name": "file not found (for a Hugging Face repository, name the GGUF",
    }
    for model, message in cases.items():
        assert message in one_error_line(clover("generate", model, "-p", "hi"))
    assert "runs a checkpoint directory" in one_error_line(
        clover("chat", str(text_file), "--backend", "reference")
    )
    debug = clover("--debug", "generate", str(tmp_path / "missing.gguf"), "-p", "hi")
    assert debug.returncode == 1 and "Traceback" in debug.stderr
    assert (
        one_error_line(clover("generate", str(text_file)), code=2)
        == "error: give the prompt with either -p TEXT or -f FILE"
    )


def test_requests_that_cannot_fit_are_refused_with_the_numbers(tiny_checkpoint):
    tok = CloverTokenizer.from_dir(tiny_checkpoint)
    long_prompt = "The quick brown fox jumps over the lazy dog. " * 30
    n = len(tok.encode_chat([{"role": "user", "content": long_prompt}]))
    res = clover(
        "generate",
        str(tiny_checkpoint),
        "--backend",
        "reference",
        "-f",
        "-",
        "-n",
        "64",
        "--n-ctx",
        "256",
        stdin=long_prompt,
    )
    line = one_error_line(res)
    assert f"request too long: prompt {n} tokens + 64 for 64 new tokens in blocks of 32 = {n + 64}" in line
    assert "the context of 256 tokens" in line
    res = clover("generate", str(tiny_checkpoint), "--backend", "reference", "-p", "hi", "--n-ctx", "200000")
    assert "n_ctx 200000 exceeds the model's limit of 131072 tokens" in one_error_line(res)


def test_a_clover_gguf_runs_on_the_llama_engine_or_says_what_is_missing(tiny_checkpoint, tmp_path):
    gguf = tmp_path / "tiny-f32.gguf"
    conv = clover("convert", str(tiny_checkpoint), "-o", str(gguf), "--outtype", "f32")
    assert conv.returncode == 0, conv.stderr
    res = clover("generate", str(gguf), "-p", PROMPT, "-n", "32", "--json")
    missing = llama.unavailable()
    if missing is not None:
        assert "run `make install`" in one_error_line(res)
        return
    assert res.returncode == 0, res.stderr
    tok = CloverTokenizer.from_dir(tiny_checkpoint)
    want, _ = reference_run(
        tiny_checkpoint, tok.encode_chat([{"role": "user", "content": PROMPT}]), max_new_tokens=32
    )
    assert json.loads(res.stdout)["clover"]["tokens"] == list(want.tokens)


# -- Hugging Face model specs (resolution only: no network) -------------------------------------

FILES = [
    "README.md",
    "Clover-35B-A3B-Q4_K_M.gguf",
    "Clover-35B-A3B-Q8_0-00001-of-00002.gguf",
    "Clover-35B-A3B-Q8_0-00002-of-00002.gguf",
    "Clover-35B-A3B-Q4_K_S.gguf",
    "imatrix.dat",
]


def test_model_specs_name_a_local_path_or_a_hub_file(tmp_path):
    local = tmp_path / "model.gguf"
    local.write_bytes(b"GGUF")
    assert parse_spec(str(local)) == local
    assert parse_spec(str(tmp_path / "typo.gguf")) == tmp_path / "typo.gguf"  # reported later: file not found
    assert parse_spec("owner/Clover-GGUF:Q4_K_M") == HubFile("owner/Clover-GGUF", "Q4_K_M")
    assert parse_spec("owner/Clover-GGUF", file="*Q8_0*") == HubFile("owner/Clover-GGUF", "*Q8_0*")
    with pytest.raises(ModelFileError, match="give the file pattern once"):
        parse_spec("owner/Clover-GGUF:Q4_K_M", file="*Q8_0*")
    with pytest.raises(ModelFileError, match="not of a local path"):
        parse_spec(str(local), file="*Q8_0*")


def test_hub_file_patterns_pick_one_model():
    assert pick_files(FILES, "Q4_K_M") == ["Clover-35B-A3B-Q4_K_M.gguf"]
    assert pick_files(FILES, "q4_k_s") == ["Clover-35B-A3B-Q4_K_S.gguf"]
    assert pick_files(FILES, "*Q8_0*.gguf") == [  # a split file: every part, the first one first
        "Clover-35B-A3B-Q8_0-00001-of-00002.gguf",
        "Clover-35B-A3B-Q8_0-00002-of-00002.gguf",
    ]
    with pytest.raises(ModelFileError, match="matches several files"):
        pick_files(FILES, "Q4_K")
    with pytest.raises(
        ModelFileError, match="no GGUF matches 'IQ2_XS'; the repository has: Clover-35B-A3B-Q4_K_M.gguf"
    ):
        pick_files(FILES, "IQ2_XS")


@pytest.mark.skipif(llama.unavailable() is not None, reason=llama.unavailable() or "")
def test_speculative_draft_options_keep_the_ar_output(gguf_factory):
    """`--mode speculative` with any draft controls writes what `--mode ar` writes."""
    _, gguf = gguf_factory("tiny")
    common = ["generate", str(gguf), "-p", PROMPT, "-n", "24", "--json"]
    ar = clover(*common, "--mode", "ar")
    assert ar.returncode == 0, ar.stderr
    want = json.loads(ar.stdout)["clover"]["tokens"]
    for draft in (
        ["--draft-len", "3", "--fixed-draft"],
        ["--draft-threshold", "0.5", "--refinements", "1"],
        ["--first-draft", "2"],
    ):
        res = clover(*common, "--mode", "speculative", *draft)
        assert res.returncode == 0, res.stderr
        assert json.loads(res.stdout)["clover"]["tokens"] == want, draft
    bad = clover(*common, "--mode", "speculative", "--draft-len", "99")
    assert "draft_len 99 outside 0..31" in one_error_line(bad)
    bad = clover(*common, "--mode", "speculative", "--first-draft", "-1")
    assert "first_draft must be >= 0" in one_error_line(bad) and bad.returncode != 0


@pytest.mark.skipif(llama.unavailable() is not None, reason=llama.unavailable() or "")
def test_generate_samples_with_a_temperature_reproducibly_on_both_backends(gguf_factory):
    """`--temperature` (with the cuts and a seed) samples in the default diffusion mode: the same
    seed writes the same answer, on the GGUF and on the reference alike; another seed another one."""
    ckpt, gguf = gguf_factory("tiny")
    sampled = ["-p", PROMPT, "-n", "24", "--json", "--temperature", "1.5", "--top-k", "50", "--min-p", "0.01"]

    def run(model: Path, *extra: str) -> dict:
        res = clover("generate", str(model), *sampled, *extra)
        assert res.returncode == 0, res.stderr
        return json.loads(res.stdout)["clover"]

    first, again = run(gguf, "--seed", "7"), run(gguf, "--seed", "7")
    assert first["sampling"] == "temperature 1.5, top_k 50, min_p 0.01, seed 7"
    assert first["tokens"] == again["tokens"] != run(gguf, "--seed", "8")["tokens"]
    assert run(ckpt, "--backend", "reference", "--seed", "7")["tokens"] == first["tokens"]
    greedy = clover("generate", str(gguf), "-p", PROMPT, "-n", "24", "--json")
    assert json.loads(greedy.stdout)["clover"]["tokens"] != first["tokens"]


def test_a_model_without_attention_layers_is_refused_not_aborted(tmp_path):
    """llama.cpp's hybrid memory asserts (aborting the process) on a model whose layers are all GDN."""
    from clover_local.testing.make_checkpoint import write_checkpoint

    ckpt = write_checkpoint(tmp_path / "two-layers", "tiny", layers=2)  # layers 0 and 1: both GDN
    gguf = tmp_path / "two-layers.gguf"
    assert clover("convert", str(ckpt), "-o", str(gguf), "--outtype", "f32").returncode == 0
    message = one_error_line(clover("generate", str(gguf), "-p", "hi"))
    assert "no full-attention layer" in message and "--layers 4" in message


def test_bench_refuses_a_prompt_length_beyond_the_context(tiny_checkpoint):
    res = clover("bench", str(tiny_checkpoint), "--backend", "reference", "--prompt-tokens", "200000")
    assert res.returncode == 1 and "request too long: prompt 200000 tokens" in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1 and not res.stdout


@pytest.mark.parametrize(
    "args,message",
    [
        (["-t", "100000"], "--threads must be an integer from 1 to 512, got 100000"),
        (["--repeat-penalty", "0"], "--repeat-penalty must be a number > 0, got 0.0"),
        (["--threshold", "nan"], "--threshold must be a number from 0 to 1, got nan"),
        (["--threshold", "2"], "--threshold must be a number from 0 to 1, got 2.0"),
        (["--temperature", "nan"], "--temperature must be a number >= 0, got nan"),
        (["--top-p", "1.5"], "--top-p must be a number from 0 to 1, got 1.5"),
        (["--top-k", "-1"], "--top-k must be an integer >= 0, got -1"),
        (["--coreset-top-p", "-1"], "--coreset-top-p must be a number > 0 and <= 1, got -1.0"),
        (["-c", "-1"], "--n-ctx must be an integer >= 0, got -1"),
        (["-n", "0"], "--max-tokens must be an integer >= 1, got 0"),
        (["-n", "-5"], "--max-tokens must be an integer >= 1, got -5"),
        (["--block-size", "1000"], "--block-size must be an integer from 1 to 256, got 1000"),
        (["-ngl", "-2"], "--n-gpu-layers must be an integer >= -1, got -2"),
    ],
)
def test_out_of_range_options_are_one_usage_line_before_any_work(tiny_checkpoint, args, message):
    for command in (["generate", "-p", "hi"], ["chat"]):
        res = clover(command[0], str(tiny_checkpoint), "--backend", "reference", *command[1:], *args)
        assert one_error_line(res, code=2) == f"error: {message}"


def test_version_help_and_debug_anywhere(tmp_path):
    version = clover("--version")
    assert version.returncode == 0 and version.stdout.startswith("clover-local ")
    assert "llama-cpp-python" in version.stdout
    bare = clover()
    assert bare.returncode == 0 and "Commands:" in bare.stdout
    for args in (["-h"], ["chat", "-h"], ["info", "-h"]):
        res = clover(*args)
        assert res.returncode == 0 and res.stdout.startswith("Usage: clover")
    missing = str(tmp_path / "none.gguf")
    assert one_error_line(clover("info", missing)) == f"error: {missing}: file not found"
    for args in (["--debug", "info", missing], ["info", missing, "--debug"]):
        res = clover(*args)
        assert res.returncode == 1 and "ModelFileError" in res.stderr  # the traceback, not one line
    convert = subprocess.run(
        [Path(CLOVER).with_name("clover-convert"), "-h"], capture_output=True, text=True, timeout=60
    )
    assert convert.returncode == 0 and "-t, --threads" in convert.stdout and "--outtype" in convert.stdout
