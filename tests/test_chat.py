"""`clover chat` in a real terminal (pexpect): what a person sees over several turns, thinking on
and off, multiline input, /save and /load, Ctrl-C during an answer, Ctrl-D, and --visual.

Every expected answer is computed with `Clover.create_chat_completion` on the same conversation,
so the terminal must show exactly the text the API returns. The model is the generated checkpoint on
the numpy reference and, with the patched llama.cpp installed, its F32 GGUF on llama.cpp."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pexpect
import pytest
from rich.control import strip_control_codes

from clover_local import llama
from clover_local.api import Clover

CLOVER = str(Path(sys.executable).with_name("clover"))
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
STATS = re.compile(r"\[(\d+) tokens, (\d+) passes")
PROMPT = ">>> "


@pytest.fixture(scope="module")
def api(tiny_checkpoint: Path) -> Clover:
    return Clover.from_checkpoint(tiny_checkpoint)


@pytest.fixture(scope="module", params=["reference", pytest.param("gguf", marks=pytest.mark.llama)])
def model_args(request, tiny_checkpoint: Path, tmp_path_factory) -> list[str]:
    """`clover chat` arguments naming the model: the checkpoint on the reference, or its F32 GGUF."""
    if request.param == "reference":
        return [str(tiny_checkpoint), "--backend", "reference"]
    missing = llama.unavailable()
    if missing is not None:
        pytest.skip(missing)
    gguf = tmp_path_factory.mktemp("gguf") / "tiny-f32.gguf"
    subprocess.run([CLOVER, "convert", str(tiny_checkpoint), "-o", str(gguf), "--outtype", "f32"], check=True)
    return [str(gguf)]


def spawn(model_args: list[str], *args: str) -> pexpect.spawn:
    child = pexpect.spawn(
        CLOVER,
        ["chat", *model_args, *args],
        encoding="utf-8",
        timeout=60,
        dimensions=(50, 200),
        env={**os.environ, "TERM": "xterm-256color"},
    )
    child.expect_exact(PROMPT)
    return child


def screen(text: str) -> str:
    """What the terminal shows as text: no escape sequences, plain newlines."""
    return ANSI.sub("", text).replace("\r\n", "\n")


def visible(s: str) -> str:
    return strip_control_codes(s)


def answer(child: pexpect.spawn, message: str) -> tuple[str, int, int]:
    """Send a message; (everything printed up to the statistics line, tokens, passes)."""
    for i, line in enumerate(message.split("\n")):
        child.sendline(line)
        if i < message.count("\n"):
            child.expect_exact("... ")
    child.expect(STATS)
    shown, tokens, passes = child.before, int(child.match.group(1)), int(child.match.group(2))
    child.expect_exact(PROMPT)
    return shown, tokens, passes


def expected(api: Clover, messages: list[dict[str, Any]], thinking: bool, max_tokens: int) -> dict[str, Any]:
    return api.create_chat_completion(messages, max_tokens=max_tokens, thinking=thinking)


def test_two_turns_thinking_multiline_save_and_load(api, model_args, tmp_path):
    child = spawn(model_args, "-n", "16", "--system", "Be brief.")
    system = {"role": "system", "content": "Be brief."}
    shown, tokens, passes = answer(child, "Hello")
    first = expected(api, [system, {"role": "user", "content": "Hello"}], True, 16)
    reasoning = first["choices"][0]["message"]["reasoning_content"]
    assert (tokens, passes) == (first["usage"]["completion_tokens"], first["clover"]["passes"])
    assert visible(reasoning) in screen(shown)
    assert "\x1b[2m" in shown  # the reasoning is dimmed

    child.sendline("/think off")
    child.expect_exact("thinking off")
    child.expect_exact(PROMPT)
    messages = [
        system,
        {"role": "user", "content": "Hello"},
        {
            "role": "assistant",
            "content": first["choices"][0]["message"]["content"],
            "reasoning_content": reasoning,
        },
        {"role": "user", "content": "What is\n2 + 2?"},
    ]
    second = expected(api, messages, False, 16)
    shown, tokens, _ = answer(child, "What is\\\n2 + 2?")  # a trailing backslash continues the line
    content = second["choices"][0]["message"]["content"]
    assert "reasoning_content" not in second["choices"][0]["message"]
    assert tokens == second["usage"]["completion_tokens"] and visible(content) in screen(shown)

    saved = tmp_path / "conversation.json"
    child.sendline(f"/save {saved}")
    child.expect_exact("saved 2 turns")
    child.expect_exact(PROMPT)
    messages.append({"role": "assistant", "content": content})
    assert json.loads(saved.read_text()) == {"thinking": False, "messages": messages}

    child.sendline("/reset")
    child.expect_exact("conversation reset")
    child.sendline("/think on")
    child.expect_exact(PROMPT)
    child.sendline(f"/load {saved}")
    child.expect_exact("loaded 2 turns")
    child.expect_exact(PROMPT)
    third = expected(api, [*messages, {"role": "user", "content": "Thanks"}], False, 16)  # thinking as saved
    shown, tokens, _ = answer(child, '"""\nThanks\n"""')  # a """ block
    assert visible(third["choices"][0]["message"]["content"]) in screen(shown)

    child.sendeof()
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0


def test_a_pasted_block_is_one_message_and_command_edges_are_one_line(api, model_args, tmp_path):
    child = spawn(model_args, "-n", "8", "--no-think")
    child.send("\x1b[200~Line one.\nLine two.\x1b[201~\r")  # a terminal's bracketed paste
    child.expect(STATS)
    tokens = int(child.match.group(1))
    child.expect_exact(PROMPT)
    want = expected(api, [{"role": "user", "content": "Line one.\nLine two."}], False, 8)
    assert tokens == want["usage"]["completion_tokens"]
    for command, reply in [
        ("/think", "thinking on"),
        ("/load nope.json", "nope.json: No such file or directory"),
        ("/load", "/load needs a file"),
        ("/set temperature nan", "/set temperature must be a number >= 0, got nan"),
        ("/set block_size 0", "/set block_size must be an integer from 1 to 256, got 0"),
    ]:
        child.sendline(command)
        child.expect_exact(reply)  # after a red "error:" for the last four
        child.expect_exact(PROMPT)
    saved = tmp_path / "conversation.json"
    child.sendline(f"/save {saved}")
    child.expect_exact("saved 1 turns")
    child.expect_exact(PROMPT)
    user = [m for m in json.loads(saved.read_text())["messages"] if m["role"] == "user"]
    assert user == [{"role": "user", "content": "Line one.\nLine two."}]
    child.sendeof()
    child.expect(pexpect.EOF)


def test_ctrl_c_stops_the_answer_and_the_next_question_is_answered(api, model_args):
    child = spawn(model_args)
    child.sendline("/set max_tokens 4000")
    child.expect_exact("max_tokens = 4000")
    child.expect_exact(PROMPT)
    child.sendline("Hello")
    child.expect_exact("\x1b[2m")  # the reasoning has started streaming
    child.sendintr()
    child.expect_exact("(stopped)")
    child.expect_exact(PROMPT)
    assert not STATS.search(child.before)

    child.sendline("/set max_tokens 16")
    child.expect_exact(PROMPT)
    # the stopped turn was dropped: this is the conversation's first question again
    want = expected(api, [{"role": "user", "content": "Hello"}], True, 16)
    shown, tokens, passes = answer(child, "Hello")
    assert (tokens, passes) == (want["usage"]["completion_tokens"], want["clover"]["passes"])
    assert visible(want["choices"][0]["message"]["reasoning_content"]) in screen(shown)

    child.sendintr()  # at the prompt: a hint, not an exit
    child.expect_exact("Use Ctrl-D or /exit to quit.")
    child.sendline("/exit")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0


def test_visual_mode_ends_with_the_answer(api, model_args):
    child = spawn(model_args, "-n", "16", "--visual", "--no-think")
    want = expected(api, [{"role": "user", "content": "Hello"}], False, 16)
    shown, tokens, _ = answer(child, "Hello")
    assert tokens == want["usage"]["completion_tokens"]
    assert screen(shown).rstrip("\n").endswith(visible(want["choices"][0]["message"]["content"]).rstrip("\n"))
    assert "░" in shown  # masks were drawn while the block was denoised
    child.sendeof()
    child.expect(pexpect.EOF)


def test_a_history_over_the_context_drops_the_oldest_turns_and_keeps_the_system_prompt(tiny_checkpoint):
    import io

    from rich.console import Console

    from clover_local.chat import ChatSession

    console = Console(file=io.StringIO(), width=200)
    small = Clover.from_checkpoint(tiny_checkpoint, n_ctx=256)
    chat = ChatSession(small, console, system="Be brief.", thinking=False, max_tokens=16)
    for _ in range(5):
        chat.ask("Tell me about clover fields and bees. " * 2)
    shown = console.file.getvalue()
    assert "(context full: dropped the" in shown and "error" not in shown
    assert chat.messages[0] == {"role": "system", "content": "Be brief."}
    assert sum(m["role"] == "user" for m in chat.messages) < 5
