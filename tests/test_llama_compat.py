"""llama-cpp-python's own README examples run against `Clover` unchanged: only the import and the
model path are swapped. JSON mode, which needs a grammar, is refused with one clear error."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from clover_patches.source import read_member

pytestmark = pytest.mark.llama


def readme_examples() -> dict[str, str]:
    """The README's python blocks that use `Llama`, by the heading above each."""
    text = read_member("README.md").decode("utf-8")
    examples, heading = {}, ""
    for part in re.split(r"(^#+ [^\n]*$|```python\n.*?```)", text, flags=re.M | re.S):
        if part.startswith("#"):
            heading = part.lstrip("# ").strip()
        elif part.startswith("```python") and "Llama(" in part and heading not in examples:
            examples[heading] = part.removeprefix("```python\n").removesuffix("```")
    return examples


def run(example: str, llama_gguf: Path) -> dict[str, object]:
    code = example.replace("from llama_cpp import Llama", "from clover_local.api import Clover as Llama")
    code = re.sub(r'model_path="[^"]*"', f'model_path="{llama_gguf}"', code)
    scope: dict[str, object] = {}
    exec(compile(code, "README example", "exec"), scope)  # noqa: S102 (the README's own code)
    return scope


def test_the_high_level_api_example_completes_with_the_prompt_echoed(llama_gguf, capsys):
    scope = run(readme_examples()["High-level API"], llama_gguf)
    output = scope["output"]
    text = output["choices"][0]["text"]
    assert text.startswith("Q: Name the planets in the solar system? A: ")
    assert "\n" not in text and "Q:" not in text[3:]  # the stop strings cut it
    assert output["usage"]["completion_tokens"] <= 32
    assert str(output) in capsys.readouterr().out


def test_the_chat_completion_example_answers_in_content(llama_gguf):
    example = readme_examples()["Chat Completion"]
    scope = run(
        example.replace("llm.create_chat_completion(", "answer = llm.create_chat_completion(", 1), llama_gguf
    )
    message = scope["answer"]["choices"][0]["message"]
    assert message["role"] == "assistant" and message["content"].strip()


def test_the_json_mode_example_is_refused_in_one_line(llama_gguf):
    with pytest.raises(ValueError, match=r"^response_format 'json_object' needs grammar") as e:
        run(readme_examples()["JSON Mode"], llama_gguf)
    assert "\n" not in str(e.value)
