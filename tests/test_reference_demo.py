"""The traced demo and the tokenizer / chat template it uses."""

from __future__ import annotations

import pytest

from clover_local import reference_demo as demo
from clover_local.model.tokenizer import ChatTemplateError, CloverTokenizer

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


def test_demo_prints_every_pass_and_block(tiny_checkpoint, capsys):
    assert (
        demo.main(["--checkpoint", str(tiny_checkpoint), "--max-new-tokens", "12", "--block-size", "8"]) == 0
    )
    out = capsys.readouterr().out
    assert "block 0 pass  0" in out and "block 1:" in out
    assert "12 tokens in" in out and "finish: length" in out


def test_chat_template_renders_the_thinking_switch(tiny_checkpoint):
    tok = CloverTokenizer.from_dir(tiny_checkpoint)
    on, off = tok.render_chat(QUESTION), tok.render_chat(QUESTION, enable_thinking=False)
    assert on.endswith("<|im_start|>assistant\n<think>\n")
    assert off.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    ids = tok.encode_chat(QUESTION)
    assert tok.decode(ids) == on
    assert ids[0] == tok.token_id("<|im_start|>") and tok.token_id("<think>") in ids


def test_chat_template_errors_are_clear(tiny_checkpoint):
    tok = CloverTokenizer.from_dir(tiny_checkpoint)
    with pytest.raises(ChatTemplateError, match="System message must be at the beginning"):
        tok.render_chat([*QUESTION, {"role": "system", "content": "late"}])


@pytest.mark.reference
def test_chat_template_matches_transformers(tiny_checkpoint):
    transformers = pytest.importorskip("transformers")
    hf = transformers.PreTrainedTokenizerFast(
        tokenizer_file=str(tiny_checkpoint / "tokenizer.json"),
        chat_template=CloverTokenizer.from_dir(tiny_checkpoint).chat_template,
    )
    tok = CloverTokenizer.from_dir(tiny_checkpoint)
    conversation = [
        {"role": "system", "content": "Be brief."},
        *QUESTION,
        {"role": "assistant", "content": "<think>\nhm\n</think>\n\nParis."},
        *QUESTION,
    ]
    for thinking in (True, False):
        expected = hf.apply_chat_template(
            conversation, tokenize=False, add_generation_prompt=True, enable_thinking=thinking
        )
        assert tok.render_chat(conversation, enable_thinking=thinking) == expected


def test_demo_generates_a_tiny_checkpoint_when_none_is_given(capsys):
    assert demo.main(["--max-new-tokens", "4", "--block-size", "4", "--no-think"]) == 0
    out = capsys.readouterr().out
    assert "4 tokens in" in out and "<think>\\n\\n</think>" in out
