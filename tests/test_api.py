"""`Clover`: llama-cpp-python's result shapes, the reference loop's exact tokens, streaming, stops,
length checks, cancellation, modes and sampling. The model is a generated checkpoint on the numpy
reference and, with the patched llama.cpp installed, the same checkpoint converted to an F32 GGUF."""

from __future__ import annotations

import dataclasses
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from clover_convert.vocab import add_vocab, load_vocab
from gguf import GGUFWriter
from llama_cpp import Llama, llama_types

from clover_local import llama as llama_runtime
from clover_local.api import Clover, defaults_from_gguf
from clover_local.llama.tokenizer import GgufTokenizer
from clover_local.loops import BlockEvent, PassEvent, Result, ar_loop, diffusion_loop, last_result
from clover_local.model.config import CheckpointConfig
from clover_local.model.gguf_info import read_info
from clover_local.model.tokenizer import THINK_END, THINK_START, CloverTokenizer
from clover_local.policy import DecodingSettings, RequestTooLong
from clover_local.reference.backend import NumpyBackend
from clover_local.reference.model import ReferenceModel
from clover_local.speculative import SpeculativeSettings

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]
# thinking on (the API's default is off); the think ramp forces `</think>` after a few tokens, so
# answers have reasoning and content
RAMPS = {
    "thinking": True,
    "think_ramp_start": 0.0,
    "think_ramp_max": 60.0,
    "presence_penalty": 0.4,
    "repeat_penalty": 1.2,
}


def convert_f32(ckpt: Path, out: Path) -> Path:
    """`clover convert` to an F32 GGUF, as a user runs it."""
    clover_bin = Path(sys.executable).with_name("clover")
    subprocess.run([clover_bin, "convert", str(ckpt), "-o", str(out), "--outtype", "f32"], check=True)
    return out


@pytest.fixture(scope="module")
def tiny_gguf(tiny_checkpoint: Path, tmp_path_factory) -> Path:
    """The checkpoint as an F32 GGUF, when the patched llama.cpp can run it."""
    missing = llama_runtime.unavailable()
    if missing is not None:
        pytest.skip(missing)
    return convert_f32(tiny_checkpoint, tmp_path_factory.mktemp("gguf") / "tiny-f32.gguf")


@pytest.fixture(scope="module", params=["reference", pytest.param("gguf", marks=pytest.mark.llama)])
def runtime(request, tiny_checkpoint: Path) -> Callable[[str], Clover]:
    """`make(mode)`: the checkpoint on the numpy reference, or converted to an F32 GGUF on llama.cpp."""
    if request.param == "reference":
        return lambda mode: Clover.from_checkpoint(tiny_checkpoint, mode=mode)
    gguf = request.getfixturevalue("tiny_gguf")
    return lambda mode: Clover(gguf, mode=mode)


@pytest.fixture(scope="module")
def clover(runtime) -> Clover:
    return runtime("diffusion")


@pytest.fixture(scope="module")
def ar_clover(runtime) -> Clover:
    return runtime("ar")


@pytest.fixture(scope="module")
def tok(tiny_checkpoint: Path) -> CloverTokenizer:
    return CloverTokenizer.from_dir(tiny_checkpoint)


def reference_settings(ckpt: Path, tok: CloverTokenizer, **kw: object) -> DecodingSettings:
    ck = CheckpointConfig.from_dir(ckpt)
    return DecodingSettings.from_defaults(
        ck.generation,
        ck.model.mask_token_id,
        think_start_id=tok.token_id(THINK_START),
        think_end_id=tok.token_id(THINK_END),
        **kw,
    )


def split_reasoning(tok: CloverTokenizer, tokens: list[int], stops: tuple[int, ...]) -> tuple[str, str]:
    """(reasoning, content) as a reader expects them from the raw response text."""
    text = tok.decode([t for t in tokens if t not in stops], skip_special_tokens=True)
    reasoning, _, content = text.partition(THINK_END)
    return reasoning.rstrip(), content.lstrip("\n")


def write_llama_gguf(path: Path, ckpt: Path) -> Path:
    """A one-layer `llama` GGUF with the checkpoint's tokenizer: what unpatched llama.cpp can run."""
    ck = CheckpointConfig.from_dir(ckpt)
    vocab = load_vocab(ckpt, ck.model, ck.raw)
    w = GGUFWriter(str(path), "llama")
    n_embd, n_ff, n_head = 32, 64, 2
    w.add_block_count(1)
    w.add_context_length(512)
    w.add_embedding_length(n_embd)
    w.add_feed_forward_length(n_ff)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_head)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_dimension_count(n_embd // n_head)
    add_vocab(w, vocab)
    rng = np.random.default_rng(0)
    shapes = {"token_embd": (len(vocab.tokens), n_embd), "output": (len(vocab.tokens), n_embd)}
    shapes |= {f"blk.0.{n}": (n_embd, n_embd) for n in ("attn_q", "attn_k", "attn_v", "attn_output")}
    shapes |= {
        "blk.0.ffn_gate": (n_ff, n_embd),
        "blk.0.ffn_up": (n_ff, n_embd),
        "blk.0.ffn_down": (n_embd, n_ff),
    }
    for name, shape in shapes.items():
        w.add_tensor(f"{name}.weight", (0.2 * rng.standard_normal(shape)).astype(np.float32))
    for name in ("output_norm", "blk.0.attn_norm", "blk.0.ffn_norm"):
        w.add_tensor(f"{name}.weight", np.ones(n_embd, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.fixture(scope="module")
def llama(tiny_checkpoint: Path, tmp_path_factory) -> Llama:
    path = write_llama_gguf(tmp_path_factory.mktemp("llama") / "tiny-llama.gguf", tiny_checkpoint)
    return Llama(str(path), n_ctx=256, verbose=False)


# -- exact tokens -------------------------------------------------------------------------------


def test_chat_completion_is_the_reference_loop_token_for_token(clover, tok, tiny_checkpoint):
    res = clover.create_chat_completion(QUESTION, max_tokens=40, **RAMPS)
    s = reference_settings(
        tiny_checkpoint,
        tok,
        max_new_tokens=40,
        think_ramp_start=0.0,
        think_ramp_max=60.0,
        presence_penalty=0.4,
        repetition_penalty=1.2,
    )
    ids = tok.encode_chat(QUESTION)
    want = last_result(diffusion_loop(NumpyBackend(ReferenceModel.from_checkpoint(tiny_checkpoint)), ids, s))
    st = res["clover"]
    assert st["tokens"] == list(want.tokens)
    assert st["passes_per_block"] == list(want.passes_per_block)
    assert st["tokens_per_pass"] == list(want.tokens_per_pass)
    reasoning, content = split_reasoning(tok, st["tokens"], s.stop_token_ids)
    assert tok.token_id(THINK_END) in want.tokens  # the ramp closed the reasoning
    message = res["choices"][0]["message"]
    assert (message["reasoning_content"], message["content"]) == (reasoning, content)
    assert res["choices"][0]["finish_reason"] == want.finish_reason
    stops = sum(t in s.stop_token_ids for t in want.tokens)
    assert res["usage"] == {
        "prompt_tokens": len(ids),
        "completion_tokens": len(want.tokens) - stops,
        "total_tokens": len(ids) + len(want.tokens) - stops,
    }


def test_ar_mode_is_the_reference_ar_loop(ar_clover, tok, tiny_checkpoint):
    res = ar_clover.create_completion("The capital of France is", max_tokens=12)
    s = reference_settings(tiny_checkpoint, tok, max_new_tokens=12, block_size=1)
    ids = tok.encode("The capital of France is")
    want = last_result(ar_loop(NumpyBackend(ReferenceModel.from_checkpoint(tiny_checkpoint)), ids, s))
    assert res["clover"]["tokens"] == list(want.tokens)
    assert res["clover"]["tokens_per_pass"] == [1] * len(want.tokens)
    assert res["choices"][0]["text"] == tok.decode(
        [t for t in want.tokens if t not in s.stop_token_ids], skip_special_tokens=True
    )


def test_speculative_mode_gives_the_ar_tokens(ar_clover, tiny_checkpoint):
    spec = Clover.from_checkpoint(tiny_checkpoint, mode="speculative")
    got = spec.create_chat_completion(QUESTION, max_tokens=24, thinking=True)
    want = ar_clover.create_chat_completion(QUESTION, max_tokens=24, thinking=True)
    assert got["clover"]["tokens"] == want["clover"]["tokens"]
    assert got["choices"][0]["message"] == want["choices"][0]["message"]
    assert sum(got["clover"]["tokens_per_pass"]) == len(got["clover"]["tokens"])


# -- shapes -------------------------------------------------------------------------------------


def keys(typed: type) -> set[str]:
    return set(typed.__annotations__)


def test_results_have_llama_cpp_shapes_from_its_types(clover):
    res = clover.create_completion("Hello", max_tokens=8)
    assert set(res) == keys(llama_types.CreateCompletionResponse) | {"clover"}
    assert set(res["choices"][0]) == keys(llama_types.CompletionChoice)
    assert set(res["usage"]) == keys(llama_types.CompletionUsage)
    chat = clover.create_chat_completion(QUESTION, max_tokens=8, thinking=False)
    assert set(chat) == keys(llama_types.CreateChatCompletionResponse) | {"clover"}
    assert set(chat["choices"][0]) == keys(llama_types.ChatCompletionResponseChoice)
    assert set(chat["choices"][0]["message"]) == {"role", "content"}
    for chunk in clover.create_chat_completion(QUESTION, max_tokens=8, stream=True):
        extra = {"usage", "clover"} if chunk["choices"][0]["finish_reason"] else set()
        assert set(chunk) == keys(llama_types.CreateChatCompletionStreamResponse) | extra
        assert set(chunk["choices"][0]) == keys(llama_types.ChatCompletionStreamResponseChoice)


def shape(x: object) -> object:
    """Nested key structure of a result (values dropped)."""
    if isinstance(x, dict):
        return {k: shape(v) for k, v in x.items()}
    if isinstance(x, list):
        return [shape(v) for v in x[:1]]
    return type(x).__name__ if x is None else "value"


def without_extras(x: dict) -> dict:
    return {k: v for k, v in x.items() if k != "clover"}


def test_results_match_what_llama_cpp_returns_for_the_same_calls(ar_clover, llama):
    kw = {"max_tokens": 4, "temperature": 0.0}
    ours, theirs = (
        ar_clover.create_completion("Hello world", **kw),
        llama.create_completion("Hello world", **kw),
    )
    assert shape(without_extras(ours)) == shape(theirs)
    ours = ar_clover.create_chat_completion(QUESTION, thinking=False, **kw)
    assert shape(without_extras(ours)) == shape(llama.create_chat_completion(QUESTION, **kw))
    ours = list(ar_clover.create_chat_completion(QUESTION, stream=True, thinking=False, **kw))
    theirs = list(llama.create_chat_completion(QUESTION, stream=True, **kw))
    assert shape(ours[0]) == shape(theirs[0])  # the role chunk
    assert shape(ours[1]) == shape(theirs[1])  # a content chunk
    last = {k: v for k, v in ours[-1].items() if k not in ("usage", "clover")}
    assert shape(last) == shape(theirs[-1])
    ours = list(ar_clover.create_completion("Hello world", stream=True, **kw))
    theirs = list(llama.create_completion("Hello world", stream=True, **kw))
    assert shape(ours[0]) == shape(theirs[0])
    assert shape({k: v for k, v in ours[-1].items() if k not in ("usage", "clover")}) == shape(theirs[-1])


def test_a_converted_gguf_gives_the_checkpoint_decoding_defaults(tiny_checkpoint, tmp_path):
    got = defaults_from_gguf(read_info(convert_f32(tiny_checkpoint, tmp_path / "tiny.gguf")), ())
    want = CheckpointConfig.from_dir(tiny_checkpoint).generation
    assert dataclasses.replace(got, extra={}) == dataclasses.replace(want, extra={})


@pytest.mark.llama
def test_ar_mode_answers_like_llama_cpp_on_the_same_clover_gguf(tiny_gguf):
    """With the patched wheel `llama_cpp.Llama` itself runs a Clover GGUF left to right: same call,
    same shapes, same greedy text (llama-cpp-python drops bytes that are not UTF-8; we show U+FFFD)."""
    theirs_model = Llama(str(tiny_gguf), n_ctx=512, verbose=False)
    ours_model = Clover(tiny_gguf, n_ctx=512, mode="ar")
    no_ramps = {"stop_ramp_max": 0.0, "think_ramp_max": 0.0}  # llama.cpp's greedy sampler has none
    theirs = theirs_model.create_completion("Hello world", max_tokens=12, temperature=0.0)
    ours = ours_model.create_completion("Hello world", max_tokens=12, **no_ramps)
    assert shape(without_extras(ours)) == shape(theirs)
    assert ours["choices"][0]["text"].replace("\ufffd", "") == theirs["choices"][0]["text"]
    assert ours["usage"] == theirs["usage"]
    theirs = theirs_model.create_chat_completion(QUESTION, max_tokens=12, temperature=0.0)
    ours = ours_model.create_chat_completion(QUESTION, max_tokens=12, thinking=True, **no_ramps)
    message = ours["choices"][0]["message"]
    assert set(message) == set(theirs["choices"][0]["message"]) | {"reasoning_content"}
    # llama-cpp-python does not split the reasoning: its content is our reasoning (no `</think>` here)
    assert (
        message["reasoning_content"].replace("\ufffd", "")
        == theirs["choices"][0]["message"]["content"].rstrip()
    )
    ours_model.close()


def test_gguf_tokenizer_tokenizes_like_the_checkpoint(llama, tok):
    gguf = GgufTokenizer(llama._model.model)
    for text in (
        "Hello, world! The capital of France is Paris.",
        "def add(a, b):\n    return a + b  # ü",
        "<|im_end|>",
    ):
        ids = tok.encode(text)
        assert gguf.encode(text) == ids
        assert gguf.decode(ids) == tok.decode(ids)
        assert gguf.decode(ids, skip_special_tokens=True) == tok.decode(ids, skip_special_tokens=True)
    assert gguf.render_chat(QUESTION, enable_thinking=False) == tok.render_chat(
        QUESTION, enable_thinking=False
    )
    assert gguf.token_id(THINK_END) == tok.token_id(THINK_END)
    assert gguf.token_id("Hello world") is None


# -- streaming ----------------------------------------------------------------------------------


def test_stream_text_equals_the_result_and_arrives_before_the_block_commits(clover):
    full = clover.create_chat_completion(QUESTION, max_tokens=40, **RAMPS)
    log: list[str] = []
    got = {"content": "", "reasoning_content": ""}
    stream = clover.create_chat_completion(
        QUESTION, max_tokens=40, stream=True, on_event=lambda e: log.append(type(e).__name__), **RAMPS
    )
    for chunk in stream:
        for name, text in chunk["choices"][0]["delta"].items():
            if name in got:
                got[name] += text
                log.append("text")
    message = full["choices"][0]["message"]
    assert got == {"content": message["content"], "reasoning_content": message["reasoning_content"]}
    assert chunk["choices"][0]["finish_reason"] == full["choices"][0]["finish_reason"]
    assert "text" in log[: log.index("BlockEvent")]  # a resolved prefix streams before its commit


def test_stop_string_cuts_the_text_inside_a_block(clover):
    full = clover.create_completion("Hello", max_tokens=40)
    text = full["choices"][0]["text"]
    at = next(
        i
        for i in range(3, len(text) - 3)
        if "\ufffd" not in text[i : i + 3] and text.find(text[i : i + 3]) == i
    )
    stop = text[at : at + 3]
    cut = clover.create_completion("Hello", max_tokens=40, stop=[stop])
    assert cut["choices"][0]["text"] == text[:at] and cut["choices"][0]["finish_reason"] == "stop"
    streamed = "".join(
        c["choices"][0]["text"]
        for c in clover.create_completion("Hello", max_tokens=40, stop=stop, stream=True)
    )
    assert streamed == text[:at]
    assert cut["clover"]["passes"] <= full["clover"]["passes"]


# -- limits, cancellation -----------------------------------------------------------------------


class CountingBackend(NumpyBackend):
    """The reference backend, counting the passes it runs (its prefill is a commit)."""

    passes = 0

    def preview(self, block, adj, routing=None):
        self.passes += 1
        return super().preview(block, adj, routing)

    def commit(self, tokens, adj):
        self.passes += 1
        return super().commit(tokens, adj)


def test_over_long_requests_are_rejected_up_front_with_the_numbers(tiny_checkpoint, tok):
    ck = CheckpointConfig.from_dir(tiny_checkpoint)
    backend = CountingBackend(ReferenceModel.from_checkpoint(tiny_checkpoint))
    small = Clover.from_backend(backend, tok, ck.generation, ck.model.mask_token_id, "tiny", n_ctx=128)
    n_prompt = len(tok.encode_chat(QUESTION, enable_thinking=False))
    with pytest.raises(RequestTooLong) as e:
        small.create_chat_completion(QUESTION, max_tokens=200, stream=True)  # raised at the call
    assert f"prompt {n_prompt} tokens + 224 for 200 new tokens" in str(e.value)
    assert "the context of 128 tokens" in str(e.value)
    assert f"max_tokens (-n) to {(128 - n_prompt) // 32 * 32}" in str(e.value)
    with pytest.raises(RequestTooLong, match="the context of 128 tokens"):
        small.create_completion("word " * 200)
    assert backend.passes == 0
    res = small.create_chat_completion(QUESTION)  # no max_tokens: the default budget, cut to fit
    assert res["usage"]["completion_tokens"] <= (128 - n_prompt) // 32 * 32
    with pytest.raises(ValueError, match="exceeds the model's limit of 131072"):
        Clover.from_backend(backend, tok, ck.generation, ck.model.mask_token_id, "tiny", n_ctx=200_000)


def test_closing_a_stream_stops_within_a_pass_and_leaves_the_object_usable(tiny_checkpoint, tok):
    ck = CheckpointConfig.from_dir(tiny_checkpoint)
    backend = CountingBackend(ReferenceModel.from_checkpoint(tiny_checkpoint))
    c = Clover.from_backend(backend, tok, ck.generation, ck.model.mask_token_id, "tiny")
    fresh = Clover.from_checkpoint(tiny_checkpoint).create_completion("Hello", max_tokens=64)
    events: list[object] = []
    stream = c.create_completion("Hello", max_tokens=64, stream=True, on_event=events.append)
    next(stream), next(stream)
    passes = backend.passes
    stream.close()
    assert backend.passes == passes == 1 + len(events)  # the prefill and one pass per event, no more
    assert passes < 1 + fresh["clover"]["passes"] + fresh["clover"]["blocks"]
    assert c.create_completion("Hello", max_tokens=64)["clover"]["tokens"] == fresh["clover"]["tokens"]
    first = c.create_completion("Hello", max_tokens=64, stream=True)
    next(first)
    c.create_completion("Hello", max_tokens=8)
    with pytest.raises(RuntimeError, match="another request started"):
        list(first)


def test_events_reach_the_callback_in_decode_order(clover):
    events: list[object] = []
    res = clover.create_completion("Hello", max_tokens=40, on_event=events.append)
    assert isinstance(events[-1], Result)
    passes = [e for e in events if isinstance(e, PassEvent)]
    blocks = [e for e in events if isinstance(e, BlockEvent)]
    assert [len(e.filled) for e in passes] == res["clover"]["tokens_per_pass"]
    assert [e.passes for e in blocks] == res["clover"]["passes_per_block"]
    assert res["clover"]["preview_ms"] > 0 and res["clover"]["commit_ms"] > 0


# -- sampling, coreset --------------------------------------------------------------------------


def test_sampling_is_seeded_in_ar_mode_and_greedy_in_diffusion_mode(clover, ar_clover):
    greedy = clover.create_completion("Hello", max_tokens=8)
    warm = clover.create_completion("Hello", max_tokens=8, temperature=0.7, top_p=0.95, top_k=40)
    assert warm["clover"]["tokens"] == greedy["clover"]["tokens"]  # llama-cpp-python's defaults pass
    assert warm["clover"]["sampling"] == "greedy (diffusion mode decodes greedily)"
    runs = [
        ar_clover.create_completion("Hello", max_tokens=8, temperature=5.0, seed=s)["clover"]["tokens"]
        for s in (1, 1, 2)
    ]
    greedy = ar_clover.create_completion("Hello", max_tokens=8)["clover"]["tokens"]
    assert runs[0] == runs[1] and (runs[0] != runs[2] or runs[0] != greedy)
    cut = ar_clover.create_completion("Hello", max_tokens=8, temperature=5.0, top_k=40, seed=1)
    assert cut["clover"]["sampling"] == "temperature 5.0 (top_k/top_p/min_p not applied)"


@pytest.mark.parametrize(
    "kw,message",
    [
        ({"temperature": float("nan")}, "temperature must be a number >= 0, got nan"),
        ({"top_p": 1.5}, "top_p must be a number from 0 to 1, got 1.5"),
        ({"threshold": 2.0}, "threshold must be a number from 0 to 1, got 2.0"),
        ({"block_size": 0}, "block_size must be an integer from 1 to 256, got 0"),
        ({"repeat_penalty": 0.0}, "repeat_penalty must be a number > 0, got 0.0"),
        ({"coreset_top_p": -1.0}, "coreset_top_p must be a number > 0 and <= 1, got -1.0"),
        ({"logprobs": 5}, "logprobs are not available"),
        ({"response_format": {"type": "json_object"}}, "response_format 'json_object' needs grammar"),
    ],
)
def test_request_arguments_out_of_range_are_one_value_error(clover, kw, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        clover.create_completion("Hello", max_tokens=8, **kw)


def test_token_ids_outside_the_vocabulary_are_one_value_error(clover):
    """Before any pass: llama.cpp would fail the pass on them, with no word of which one."""
    for ids in ([clover.n_vocab()], [-1], [1, "2"]):
        with pytest.raises(
            ValueError, match=re.escape(f"prompt: token ids must lie in [0, {clover.n_vocab()})")
        ):
            clover.create_completion(ids, max_tokens=8)


def test_speculative_draft_threshold_is_range_checked(runtime):
    spec = runtime("speculative")
    spec.draft = SpeculativeSettings(draft_threshold=float("nan"))
    with pytest.raises(ValueError, match="draft_threshold must be a number from 0 to 1, got nan"):
        spec.create_completion("Hello", max_tokens=8)


def test_llama_cpp_python_arguments_are_accepted(clover, tiny_gguf):
    model = Clover(tiny_gguf, n_ctx=512, seed=1337, n_batch=512, chat_format="chatml", use_mmap=True)
    assert model.n_ctx() == 512
    res = model.create_chat_completion(
        QUESTION,
        max_tokens=8,
        temperature=0.2,
        top_p=0.95,
        top_k=40,
        min_p=0.05,
        seed=3,
        typical_p=1.0,
        response_format={"type": "text"},
        logprobs=False,
        stop=[],
    )
    assert res["choices"][0]["message"]["content"] is not None
    with pytest.raises(TypeError, match="unexpected keyword argument 'n_ctxx'"):
        Clover(tiny_gguf, n_ctxx=512)
    with pytest.raises(TypeError, match=r"create_completion\(\) got an unexpected keyword argument 'bogus'"):
        clover.create_completion("Hello", bogus=1)


def test_coreset_switch_per_request_equals_a_model_loaded_without_it(clover, tiny_checkpoint):
    off = Clover.from_checkpoint(tiny_checkpoint, coreset=False).create_completion("Hello", max_tokens=32)
    assert (
        clover.create_completion("Hello", max_tokens=32, coreset=False)["clover"]["tokens"]
        == off["clover"]["tokens"]
    )
    on = Clover.from_checkpoint(tiny_checkpoint).create_completion("Hello", max_tokens=32)
    assert (
        clover.create_completion("Hello", max_tokens=32, coreset=True)["clover"]["tokens"]
        == on["clover"]["tokens"]
    )
