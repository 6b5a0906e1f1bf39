"""Bad input, as a hostile user would give it (issue 14): every case of the campaign table ends in
the expected exit status and one `error:` line naming the file, field or path, with no traceback,
no hang, no file written, changed or lost, and no byte of a file outside the checkpoint echoed.

The table lives in `clover_local.testing.bad_inputs` (`python -m clover_local.testing.bad_inputs`
prints the counts recorded in docs/reliability.md). Runtime cases run the patched llama.cpp.
"""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path

import pytest
from clover_convert import writer
from clover_convert.cli import app
from typer.testing import CliRunner

from clover_local.api import Clover
from clover_local.guard import ClosedError
from clover_local.model.checkpoint import Checkpoint, CheckpointError, shard_path
from clover_local.model.tokenizer import ChatTemplateError, render_chat_template
from clover_local.testing import bad_inputs as bi


@pytest.fixture(scope="module")
def bases(tmp_path_factory) -> tuple[Path, Path]:
    return bi.prepare_bases(tmp_path_factory.mktemp("bad-input-base"))


@pytest.mark.llama
@pytest.mark.parametrize("case", bi.CASES, ids=lambda c: c.name)
def test_bad_input_case(case: bi.Case, bases: tuple[Path, Path], tmp_path: Path) -> None:
    outcome = bi.run_case(case, *bases, tmp_path)
    assert outcome.clean, f"{outcome.verdict}: {outcome.detail}\n{outcome.stderr}"
    assert case.message in outcome.stderr, outcome.stderr


def test_classify_counts_what_goes_wrong(tmp_path: Path) -> None:
    """The campaign's judge: a traceback is a crash; exit 0 on bad input, a lost file or an
    echoed secret is silent-wrong; one error line and no change is clean."""
    ws = bi.Workspace(tmp_path, tmp_path / "c", tmp_path / "m", tmp_path / "o", tmp_path / "s")
    case = bi.Case("x", "convert", bi.nothing, "")
    same = {"a": "1"}
    assert bi.classify(case, ws, same, same, 1, "error: bad\n").verdict == "clean"
    assert bi.classify(case, ws, same, same, 1, "Traceback (most recent call last):\n").verdict == "crash"
    assert bi.classify(case, ws, same, same, -6, "").verdict == "crash"
    assert bi.classify(case, ws, same, same, 1, "error: a\nerror: b\n").verdict == "crash"
    assert bi.classify(case, ws, same, same, 0, "").verdict == "silent-wrong"
    assert bi.classify(case, ws, same, {}, 1, "error: bad\n").verdict == "silent-wrong"
    leak = f"error: length {int.from_bytes(bi.CANARY[:8], 'little')}\n"
    assert bi.classify(case, ws, same, same, 1, leak).verdict == "silent-wrong"


def test_shard_names_stay_inside(tiny_checkpoint: Path, tmp_path: Path) -> None:
    for name in ("/etc/passwd", "../x.safetensors", "a/../../x", "", "a\\b", 3):
        with pytest.raises(CheckpointError, match="outside the checkpoint"):
            shard_path(tiny_checkpoint, name)
    # a Hugging Face cache snapshot links its files to ../../blobs: inside the repository's folder
    repo = tmp_path / "models--o--n"
    (repo / "blobs").mkdir(parents=True)
    snap = repo / "snapshots" / "abc"
    snap.mkdir(parents=True)
    for f in tiny_checkpoint.iterdir():
        (repo / "blobs" / f.name).write_bytes(f.read_bytes())
        (snap / f.name).symlink_to(Path("../../blobs") / f.name)
    assert Checkpoint(snap).names() == Checkpoint(tiny_checkpoint).names()


def test_disk_full_names_the_output(tiny_checkpoint: Path, tmp_path: Path, monkeypatch) -> None:
    def full(*args: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(writer, "_write_tensor", full)
    target = tmp_path / "m.gguf"
    res = CliRunner().invoke(app, [str(tiny_checkpoint), "-o", str(target)])
    assert res.exit_code == 1
    assert res.output == f"error: cannot write {target}: No space left on device\n"
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("template", "message"),
    [
        ("{% include 'x' %}", "cannot include, import or extend"),
        ("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}", "took more"),
        ("{{ 'ab' * 20000000 }}", "more than"),
        ("{{ ('a' * 10000000)|replace('', 'xxxx') }}", "more than"),
        ("{{ 10 ** 100000 }}", "4096 bits"),
        ("{{ ''.__class__.__mro__ }}", "unsafe"),
    ],
)
def test_template_bounds(template: str, message: str) -> None:
    with pytest.raises(ChatTemplateError, match=message) as e:
        render_chat_template(template, [{"role": "user", "content": "hi"}])
    assert str(e.value).startswith("chat template: ") and "\n" not in str(e.value)


@pytest.mark.llama
def test_clover_is_safe_to_share_and_to_close(bases: tuple[Path, Path]) -> None:
    """Two threads on one Clover get the answers each would get alone; after close every call
    raises ClosedError instead of aborting the process."""
    clover = Clover(bases[1], n_ctx=256)
    alone = [clover.create_completion(p, max_tokens=16)["choices"][0]["text"] for p in ("a b", "c d e")]
    answers: dict[int, list[str]] = {0: [], 1: []}

    def ask(i: int, prompt: str) -> None:
        for _ in range(3):
            answers[i].append(clover.create_completion(prompt, max_tokens=16)["choices"][0]["text"])

    threads = [threading.Thread(target=ask, args=(i, p)) for i, p in enumerate(("a b", "c d e"))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert answers == {0: [alone[0]] * 3, 1: [alone[1]] * 3}
    stream = clover.create_completion("a b", max_tokens=16, stream=True)
    clover.close()
    clover.close()  # idempotent
    with pytest.raises(ClosedError, match="closed"):
        next(stream)
    with pytest.raises(ClosedError):
        clover.create_completion("a b", max_tokens=4)
    with pytest.raises(ClosedError):
        clover.tokenize(b"a b")


@pytest.mark.llama
def test_ggml_abort_leaves_no_forked_debugger() -> None:
    """The runtime's process sets GGML_NO_BACKTRACE: an abort ends at once, without gdb attached."""
    code = """
import ctypes, os, llama_cpp
import clover_local.llama.engine
print(os.environ.get("GGML_NO_BACKTRACE"), flush=True)
lib = ctypes.CDLL(os.path.join(os.path.dirname(llama_cpp.__file__), "lib", "libggml-base.so"))
lib.ggml_abort(b"x.c", 1, b"deliberate abort")
"""
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert res.stdout.strip() == "1"
    assert res.returncode == -6 and "deliberate abort" in res.stderr
    assert "gdb" not in res.stderr.lower() and "backtrace" not in res.stderr.lower()


@pytest.mark.parametrize(
    ("sections", "why"),
    [
        ([0, 0, 0, 0], "must have one of its first three sections > 0"),
        ([1000, 1000, 1000, 0], "must add up to at most the head dimension, 32"),
    ],
)
def test_rotary_sections_llama_cpp_aborts_on_are_refused(gguf_factory, tmp_path, sections, why) -> None:
    """Rotary sections that ggml's rope asserts on: one line naming the key, before llama.cpp."""
    from gguf import GGUFReader

    from clover_local.model.gguf_check import GGUFError, check_gguf
    from clover_local.model.gguf_header import read_header

    path = tmp_path / "m.gguf"
    path.write_bytes(gguf_factory("tiny")[1].read_bytes())
    reader = GGUFReader(path, "r+")
    field = reader.fields["clover-moe.rope.dimension_sections"]
    for i, value in zip(field.data, sections, strict=True):
        field.parts[i][0] = value
    reader.data.flush()
    del reader
    with pytest.raises(GGUFError) as e:
        check_gguf(path, read_header(path))
    assert str(e.value) == f"m.gguf: clover-moe.rope.dimension_sections is {sections}: {why}"
