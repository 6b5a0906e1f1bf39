"""The bad-input campaign: malformed checkpoints, GGUFs and chat templates, run through the real CLIs.

Each `Case` edits a fresh copy of a generated checkpoint (or of its GGUF), runs `clover-convert`,
`clover info` or `clover generate` in a subprocess (time- and memory-limited) and classifies what
happened:

- clean: the expected exit status, stderr one `error:` line without a traceback, no file of the
  workspace written, changed or lost, no byte of a file outside the checkpoint echoed;
- crash: a traceback, an abort or another signal, a hang (timeout), or a message of several lines;
- silent-wrong: exit 0 where a refusal was due, or a file written, changed or lost, or a leak.

`tests/test_bad_input.py` asserts every case is clean (and names the expected field);
`python -m clover_local.testing.bad_inputs` prints the counts recorded in docs/reliability.md.
"""

from __future__ import annotations

import hashlib
import json
import os
import resource
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

TIMEOUT_S = 60.0
MEMORY_LIMIT = 4 << 30  # address space of a case's process: 'a'*10**10 must not take the machine
CANARY = b"root:*:20000:0:99999:7:::SECRET-CANARY\n"
INDEX = "model.safetensors.index.json"


@dataclass
class Workspace:
    """One case's files: `ckpt` (a checkpoint copy), `model` (a GGUF copy), `out` (empty) and a
    `secret` file outside the checkpoint whose bytes must never be read or echoed."""

    root: Path
    ckpt: Path
    model: Path
    out: Path
    secret: Path

    @property
    def target(self) -> Path:
        return self.out / "m.gguf"


Edit = Callable[[Workspace], None]


@dataclass(frozen=True)
class Case:
    name: str
    tool: str  # convert | info | generate
    edit: Edit
    message: str  # a piece of the expected error line (the file, field or path it names)
    args: tuple[str, ...] = ()  # extra arguments; {target} {ckpt} {out} are filled in
    expect: int = 1  # exit status
    creates: tuple[str, ...] = ()  # workspace files a clean run writes (relative to root)
    send: int | None = None  # signal sent once the output's temporary file appears


@dataclass(frozen=True)
class Outcome:
    case: str
    verdict: str  # clean | crash | silent-wrong
    detail: str
    returncode: int | None
    stderr: str

    @property
    def clean(self) -> bool:
        return self.verdict == "clean"


# -- editing helpers ------------------------------------------------------------------------------


def shards(ckpt: Path) -> list[Path]:
    return sorted(ckpt.glob("*.safetensors"))


def raw_header(shard: Path) -> tuple[bytes, bytes]:
    """(header JSON bytes, data bytes) of a safetensors file."""
    blob = shard.read_bytes()
    n = int.from_bytes(blob[:8], "little")
    return blob[8 : 8 + n], blob[8 + n :]


def write_header(shard: Path, header: bytes, data: bytes | None = None) -> None:
    rest = raw_header(shard)[1] if data is None else data
    shard.write_bytes(len(header).to_bytes(8, "little") + header + rest)


def edit_header(change: Callable[[dict], object]) -> Edit:
    """Rewrite the first shard's header JSON (`change` edits it in place or returns a replacement)."""

    def edit(ws: Workspace) -> None:
        shard = shards(ws.ckpt)[0]
        header = json.loads(raw_header(shard)[0])
        new = change(header)
        write_header(shard, json.dumps(header if new is None else new).encode())

    return edit


def first_tensor(h: dict) -> dict:
    return h[next(k for k in h if k != "__metadata__")]


def drop_field(name: str) -> Callable[[dict], None]:
    def drop(h: dict) -> None:
        del first_tensor(h)[name]

    return drop


def negative_offsets(h: dict) -> None:
    """The first tensor's range moved before the data block: it would read the JSON header."""
    t = first_tensor(h)
    a, b = t["data_offsets"]
    t["data_offsets"] = [a - b + a - 8, a - 8] if a == 0 else [-(b - a), 0]


def overlapping_offsets(h: dict) -> None:
    """Two tensors of one size made to share a byte range (the other's range becomes a gap)."""
    keys = [k for k in h if k != "__metadata__"]
    size = {k: h[k]["data_offsets"][1] - h[k]["data_offsets"][0] for k in keys}
    a, b = next((a, b) for a in keys for b in keys if a < b and size[a] == size[b])
    h[b]["data_offsets"] = list(h[a]["data_offsets"])


def edit_json(name: str, change: Callable[[dict], object]) -> Edit:
    def edit(ws: Workspace) -> None:
        path = ws.ckpt / name
        value = json.loads(path.read_text()) if path.is_file() else {}
        new = change(value)
        path.write_text(json.dumps(value if new is None else new))

    return edit


def set_json(name: str, **values: object) -> Edit:
    return edit_json(name, lambda d: d.update(values))


def write_file(name: str, data: bytes) -> Edit:
    return lambda ws: (ws.ckpt / name).write_bytes(data)


def point_index(make_target: Callable[[Workspace], str]) -> Edit:
    """The index maps every tensor of the last shard to another file name."""

    def edit(ws: Workspace) -> None:
        path = ws.ckpt / INDEX
        index = json.loads(path.read_text())
        last = shards(ws.ckpt)[-1].name
        target = make_target(ws)
        index["weight_map"] = {k: target if v == last else v for k, v in index["weight_map"].items()}
        path.write_text(json.dumps(index))

    return edit


def shard_moved_up(ws: Workspace) -> str:
    last = shards(ws.ckpt)[-1]
    shutil.move(last, ws.root / last.name)
    return f"../{last.name}"


def shard_symlinked_out(ws: Workspace) -> None:
    last = shards(ws.ckpt)[-1]
    shutil.move(last, ws.root / last.name)
    last.symlink_to(ws.root / last.name)


def secret_symlinked(ws: Workspace) -> None:
    last = shards(ws.ckpt)[-1]
    last.unlink()
    last.symlink_to(ws.secret)


def gguf_bytes(change: Callable[[bytes], bytes]) -> Edit:
    def edit(ws: Workspace) -> None:
        ws.model.write_bytes(change(ws.model.read_bytes()))

    return edit


def gguf_value(key: str, value: float) -> Edit:
    """Overwrite one scalar key/value in place (gguf-py's own way, as gguf_set_metadata does)."""

    def edit(ws: Workspace) -> None:
        from gguf import GGUFReader

        reader = GGUFReader(ws.model, "r+")
        f = reader.fields[key]
        f.parts[f.data[0]][0] = value
        reader.data.flush()
        del reader

    return edit


def gguf_template(template: str) -> Edit:
    """Convert the checkpoint again with `template` as its chat template."""

    def edit(ws: Workspace) -> None:
        from clover_convert.pipeline import Options, convert, prepare

        path = ws.ckpt / "tokenizer_config.json"
        path.write_text(json.dumps({**json.loads(path.read_text()), "chat_template": template}))
        ws.model.unlink()
        convert(prepare(Options(str(ws.ckpt), outfile=ws.model, outtype="f32", threads=1)), threads=1)

    return edit


def mkfifo_target(ws: Workspace) -> None:
    os.mkfifo(ws.target)


def user_tmp(ws: Workspace) -> None:
    ws.out.joinpath("m.gguf.tmp").write_bytes(b"the user's own file")


def u64_at(offset: int, value: int) -> Callable[[bytes], bytes]:
    return lambda b: b[:offset] + value.to_bytes(8, "little") + b[offset + 8 :]


def nothing(ws: Workspace) -> None:
    pass


# -- the table --------------------------------------------------------------------------------------

_C, _I, _G = "convert", "info", "generate"
BIG = 2**31

CASES: list[Case] = [
    # shard headers
    Case("header is a list", _C, edit_header(lambda h: []), "model-00001-of-00003.safetensors"),
    Case("header is a number", _C, edit_header(lambda h: 42), "model-00001-of-00003.safetensors"),
    Case("header entry a string", _C, edit_header(lambda h: {**h, "x": "abc"}), "x"),
    Case(
        "header entry without dtype",
        _C,
        edit_header(drop_field("dtype")),
        "dtype",
    ),
    Case(
        "header entry without data_offsets",
        _C,
        edit_header(drop_field("data_offsets")),
        "data_offsets",
    ),
    Case(
        "header entry with 3 offsets",
        _C,
        edit_header(lambda h: first_tensor(h)["data_offsets"].append(0)),
        "data_offsets",
    ),
    Case(
        "header entry with string offsets",
        _C,
        edit_header(lambda h: first_tensor(h).update(data_offsets=["0", "8"])),
        "data_offsets",
    ),
    Case("negative data_offsets", _C, edit_header(negative_offsets), "data_offsets"),
    Case("overlapping data_offsets", _C, edit_header(overlapping_offsets), "overlap"),
    Case(
        "header length beyond the file",
        _C,
        lambda ws: shards(ws.ckpt)[0].write_bytes(
            (2**40).to_bytes(8, "little") + shards(ws.ckpt)[0].read_bytes()[8:]
        ),
        "header",
    ),
    Case(
        "header not UTF-8",
        _C,
        lambda ws: write_header(shards(ws.ckpt)[0], b'{"\xff\xfe": 1}'),
        "header",
    ),
    # config.json / generation_config.json
    Case("config.json a list", _C, edit_json("config.json", lambda c: [c]), "config.json"),
    Case("config.json not UTF-8", _C, write_file("config.json", b'{"a": "\xff"}'), "config.json"),
    Case("hidden_size a string", _C, set_json("config.json", hidden_size="abc"), "hidden_size"),
    Case("text_config a string", _C, set_json("config.json", text_config="abc"), "text_config"),
    Case("rope_parameters a list", _C, set_json("config.json", rope_parameters=[1]), "rope_parameters"),
    Case("num_hidden_layers -4", _C, set_json("config.json", num_hidden_layers=-4), "num_hidden_layers"),
    Case("num_experts_per_tok 0", _C, set_json("config.json", num_experts_per_tok=0), "num_experts_per_tok"),
    Case(
        "num_experts_per_tok 9 of 8",
        _C,
        set_json("config.json", num_experts_per_tok=9),
        "num_experts_per_tok",
    ),
    Case("rms_norm_eps -1", _C, set_json("config.json", rms_norm_eps=-1), "rms_norm_eps"),
    Case(
        "partial_rotary_factor 3.0",
        _C,
        edit_json("config.json", lambda c: c["rope_parameters"].update(partial_rotary_factor=3.0)),
        "partial_rotary_factor",
    ),
    Case(
        "generation_config.json a list",
        _C,
        edit_json("generation_config.json", lambda g: [g]),
        "generation_config.json",
    ),
    Case("block_size -32", _C, set_json("generation_config.json", block_size=-32), "block_size"),
    Case("block_size 0", _C, set_json("generation_config.json", block_size=0), "block_size"),
    Case("threshold a string", _C, set_json("generation_config.json", threshold="high"), "threshold"),
    # tokenizer files
    Case("tokenizer.json a list", _C, edit_json("tokenizer.json", lambda t: [t]), "tokenizer.json"),
    Case(
        "tokenizer.json without vocab",
        _C,
        edit_json("tokenizer.json", lambda t: t["model"].__delitem__("vocab")),
        "vocab",
    ),
    Case(
        "tokenizer_config.json a list",
        _C,
        edit_json("tokenizer_config.json", lambda t: [t]),
        "tokenizer_config.json",
    ),
    # the shard index
    Case("index a string", _C, edit_json(INDEX, lambda i: "abc"), INDEX),
    Case("index weight_map a list", _C, edit_json(INDEX, lambda i: {"weight_map": [1]}), "weight_map"),
    Case("index shard ../", _C, point_index(shard_moved_up), "outside"),
    Case("index shard absolute path", _C, point_index(lambda ws: str(ws.secret)), "outside"),
    Case("shard symlinked out", _C, shard_symlinked_out, "outside"),
    Case("shard symlinked to a secret", _C, secret_symlinked, "outside"),
    # the output
    Case(
        "output is an input shard",
        _C,
        nothing,
        "is an input",
        ("-o", "{ckpt}/model-00001-of-00003.safetensors", "--force"),
    ),
    Case("output is config.json", _C, nothing, "is an input", ("-o", "{ckpt}/config.json", "--force")),
    Case("output is the index", _C, nothing, "is an input", ("-o", "{ckpt}/" + INDEX, "--force")),
    Case("output is a FIFO", _C, mkfifo_target, "not a regular file", ("--force",)),
    Case("output is a directory", _C, nothing, "not a regular file", ("-o", "{out}", "--force")),
    Case("user's OUT.tmp kept", _C, user_tmp, "", expect=0, creates=("out/m.gguf",)),
    Case("SIGTERM while writing", _C, nothing, "interrupted", expect=128 + 15, send=signal.SIGTERM),
    Case("SIGHUP while writing", _C, nothing, "interrupted", expect=128 + 1, send=signal.SIGHUP),
    Case("SIGINT while writing", _C, nothing, "interrupted", expect=130, send=signal.SIGINT),
]

_GGUF_BROKEN: list[tuple[str, Edit, str]] = [
    ("GGUF magic only", gguf_bytes(lambda b: b[:4]), "truncated"),
    ("GGUF truncated at 24 bytes", gguf_bytes(lambda b: b[:24]), "truncated"),
    ("GGUF truncated at 40 bytes", gguf_bytes(lambda b: b[:40]), "truncated"),
    ("GGUF truncated at half", gguf_bytes(lambda b: b[: len(b) // 2]), "truncated"),
    ("GGUF version 99", gguf_bytes(lambda b: b[:4] + (99).to_bytes(4, "little") + b[8:]), "version"),
    ("GGUF tensor_count 2^63", gguf_bytes(u64_at(8, 2**63)), "tensor"),
    ("GGUF kv_count 2^63", gguf_bytes(u64_at(16, 2**63)), "key"),
    ("expert_count 0", gguf_value("clover-moe.expert_count", 0), "expert_count"),
    ("expert_count 2^31", gguf_value("clover-moe.expert_count", BIG), "expert_count"),
    ("expert_used_count 0", gguf_value("clover-moe.expert_used_count", 0), "expert_used_count"),
    ("expert_used_count 2^31", gguf_value("clover-moe.expert_used_count", BIG), "expert_used_count"),
    ("rms epsilon -1", gguf_value("clover-moe.attention.layer_norm_rms_epsilon", -1.0), "epsilon"),
    ("rms epsilon NaN", gguf_value("clover-moe.attention.layer_norm_rms_epsilon", np.nan), "epsilon"),
    ("rope.dimension_count 0", gguf_value("clover-moe.rope.dimension_count", 0), "dimension_count"),
    ("diffusion.block_size 0", gguf_value("clover-moe.diffusion.block_size", 0), "block_size"),
    ("block_count 2^31", gguf_value("clover-moe.block_count", BIG), "block_count"),
    ("mask token beyond the vocabulary", gguf_value("tokenizer.ggml.mask_token_id", BIG), "mask"),
]
for _name, _edit, _message in _GGUF_BROKEN:
    CASES.append(Case(f"info: {_name}", _I, _edit, _message))
    CASES.append(Case(f"generate: {_name}", _G, _edit, _message))

_TEMPLATES: list[tuple[str, str, str]] = [
    ("include", "{% include 'x.jinja' %}", "include"),
    ("import", "{% import 'x.jinja' as x %}", "import"),
    ("extends", "{% extends 'x.jinja' %}", "extend"),
    ("range(10**9)", "{% for i in range(10**9) %}{% endfor %}", "larger than"),
    (
        "three nested range(100000)",
        "{% for i in range(100000) %}{% for j in range(100000) %}{% for k in range(100000) %}"
        "{% endfor %}{% endfor %}{% endfor %}",
        "took more than",
    ),
    ("'a'*10**10", "{{ 'a' * 10**10 }}", "more than"),
    ("'%999999999s'", "{{ '%999999999s' % 'a' }}", "format width"),
    ("center(10**9)", "{{ 'a'|center(10**9) }}", "larger than"),
    ("syntax error", "{% if %}", "chat template"),
    ("__class__", "{{ ''.__class__.__mro__ }}", "chat template"),
    ("recursion", "{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}", "chat template"),
]
for _name, _template, _message in _TEMPLATES:
    CASES.append(Case(f"template: {_name}", _G, gguf_template(_template), _message))


# -- running --------------------------------------------------------------------------------------


def prepare_bases(root: Path) -> tuple[Path, Path]:
    """The generated tiny checkpoint and its F32 GGUF that every case starts from."""
    from clover_convert.pipeline import Options, convert, prepare

    from .make_checkpoint import write_checkpoint

    ckpt = write_checkpoint(root / "checkpoint", "tiny")
    gguf = root / "tiny-F32.gguf"
    convert(prepare(Options(str(ckpt), outfile=gguf, outtype="f32", threads=1)), threads=1)
    return ckpt, gguf


def workspace(root: Path, ckpt: Path, gguf: Path) -> Workspace:
    ws = Workspace(root, root / "ckpt", root / "model.gguf", root / "out", root / "secret.txt")
    shutil.copytree(ckpt, ws.ckpt)
    shutil.copyfile(gguf, ws.model)
    ws.out.mkdir()
    ws.secret.write_bytes(CANARY)
    return ws


def command(case: Case, ws: Workspace) -> list[str]:
    fill = {"target": str(ws.target), "ckpt": str(ws.ckpt), "out": str(ws.out)}
    args = [a.format(**fill) for a in case.args]
    if case.tool == "convert":
        out = [] if "-o" in args else ["-o", str(ws.target)]
        size = ["--split-max-size", "20M", "--outtype", "f32"] if case.send else []  # seconds of writing
        return [sys.executable, "-m", "clover_convert.cli", str(ws.ckpt), *out, *size, *args]
    cli = [sys.executable, "-m", "clover_local.cli"]
    if case.tool == "info":
        return [*cli, "info", str(ws.model), *args]
    return [*cli, "generate", str(ws.model), "-p", "hi", "-n", "4", *args]


def snapshot(root: Path) -> dict[str, str]:
    """Every file under root: a hash for regular files, the kind for anything else."""
    out: dict[str, str] = {}
    for dirpath, dirs, files in os.walk(root):
        for name in dirs + files:
            p = Path(dirpath) / name
            rel = str(p.relative_to(root))
            if p.is_symlink():
                out[rel] = "link:" + os.readlink(p)
            elif p.is_file():
                out[rel] = hashlib.sha1(p.read_bytes()).hexdigest()
            else:
                out[rel] = "dir" if p.is_dir() else "special"
    return out


def _limit_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))


def _child_setup() -> None:
    """Memory limit, and SIGINT back to its default: a campaign started in the background has
    it ignored, and Python would then never raise KeyboardInterrupt in the child."""
    _limit_memory()
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _send_when_writing(proc: subprocess.Popen, ws: Workspace, sig: int) -> None:
    """Send `sig` once a temporary output file exists (the writer is mid-way)."""
    deadline = time.monotonic() + TIMEOUT_S
    while proc.poll() is None and time.monotonic() < deadline:
        if any(ws.out.iterdir()):
            proc.send_signal(sig)
            return
        time.sleep(0.002)


def large_checkpoint(base: Path) -> Path:
    """A checkpoint with a 151936-token vocabulary (80 MB as F32), generated once beside `base`:
    its conversion lasts long enough for a signal to arrive mid-write."""
    from .make_checkpoint import write_checkpoint

    path = base.parent / "checkpoint-large"
    if not (path / "config.json").is_file():
        write_checkpoint(path, "tiny-qwen-vocab")
    return path


def run_case(case: Case, ckpt: Path, gguf: Path, tmp: Path) -> Outcome:
    ws = workspace(tmp, large_checkpoint(ckpt) if case.send else ckpt, gguf)
    try:
        case.edit(ws)
    except Exception as e:  # the campaign's own setup failed: report, never count it as clean
        return Outcome(case.name, "crash", f"setup failed: {e!r}", None, "")
    before = snapshot(tmp)
    env = {**os.environ, "COLUMNS": "500", "NO_COLOR": "1"}
    proc = subprocess.Popen(
        command(case, ws),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
        errors="replace",
        cwd=tmp,
        env=env,
        preexec_fn=_child_setup,
        start_new_session=True,
    )
    if case.send is not None:
        _send_when_writing(proc, ws, case.send)
    try:
        _, stderr = proc.communicate(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        return Outcome(case.name, "crash", f"hang: no exit in {TIMEOUT_S:.0f} s", None, "")
    return classify(case, ws, before, snapshot(tmp), proc.returncode, stderr)


def classify(
    case: Case, ws: Workspace, before: dict[str, str], after: dict[str, str], rc: int, stderr: str
) -> Outcome:
    def outcome(verdict: str, detail: str) -> Outcome:
        return Outcome(case.name, verdict, detail, rc, stderr)

    leaked = CANARY[:8].decode() in stderr or str(int.from_bytes(CANARY[:8], "little")) in stderr
    changed = sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))
    unexpected = [k for k in changed if not (k in case.creates and k not in before)]
    if leaked:
        return outcome("silent-wrong", "echoed bytes of a file outside the checkpoint")
    if unexpected:
        return outcome("silent-wrong", f"files written, changed or lost: {', '.join(unexpected[:4])}")
    if rc == 0 and case.expect != 0:
        return outcome("silent-wrong", "exit 0 on bad input")
    if "Traceback" in stderr:
        return outcome("crash", "traceback: " + stderr.strip().splitlines()[-1][:200])
    if rc < 0:
        return outcome("crash", f"killed by signal {-rc}")
    if rc != case.expect:
        return outcome("crash", f"exit {rc}, expected {case.expect}: {stderr.strip()[-200:]}")
    if case.expect != 0:
        # a model that loaded said its memory estimate first (the one `memory (...)` line)
        lines = [line for line in stderr.strip().splitlines() if not line.startswith("memory (")]
        if len(lines) != 1:
            return outcome("crash", f"{len(lines)} lines on stderr: {stderr.strip()[:300]}")
    return outcome("clean", "")


@dataclass
class Tally:
    outcomes: list[Outcome] = field(default_factory=list)

    def counts(self) -> dict[str, int]:
        c = Counter(o.verdict for o in self.outcomes)
        return {"tried": len(self.outcomes), **{k: c[k] for k in ("clean", "crash", "silent-wrong")}}


def run_all(cases: list[Case], verbose: bool = True) -> Tally:
    tally = Tally()
    with tempfile.TemporaryDirectory(prefix="clover-bad-input-") as d:
        ckpt, gguf = prepare_bases(Path(d) / "base")
        for i, case in enumerate(cases):
            o = run_case(case, ckpt, gguf, Path(d) / f"case{i}")
            tally.outcomes.append(o)
            if verbose:
                print(f"{o.verdict:12} {case.tool:8} {case.name}: {o.detail or o.stderr.strip()[:160]}")
    return tally


def main() -> None:
    """Run the table (the cases whose name or tool contains argv[1], if given); print the counts.

    `fuzz N [SEED]` runs N mutants of each kind instead.
    """
    pick = sys.argv[1] if len(sys.argv) > 1 else ""
    if pick == "fuzz":
        n, seed = int(sys.argv[2]), int(sys.argv[3]) if len(sys.argv) > 3 else 0
        with tempfile.TemporaryDirectory(prefix="clover-fuzz-") as d:
            ckpt, gguf = prepare_bases(Path(d) / "base")
            for kind, fuzz, base in (("gguf", fuzz_gguf, gguf), ("safetensors", fuzz_safetensors, ckpt)):
                tally = fuzz(base, Path(d), n, seed)
                for o in tally.outcomes:
                    if not o.clean:
                        print(f"{o.verdict:12} {o.case}: {o.detail}")
                refused = sum(o.returncode == 1 for o in tally.outcomes)
                print(json.dumps({kind: {**tally.counts(), "of which refused": refused}}))
        return
    cases = [c for c in CASES if pick in c.name or pick == c.tool]
    tally = run_all(cases)
    by_tool: dict[str, Tally] = {}
    for case, o in zip(cases, tally.outcomes, strict=True):
        by_tool.setdefault(case.tool, Tally()).outcomes.append(o)
    report = {"all": tally.counts(), **{k: t.counts() for k, t in by_tool.items()}}
    print(json.dumps(report, indent=1))


# -- the seeded mutation fuzzer ---------------------------------------------------------------------

INTERESTING = (0, 1, 2, 255, 2**31 - 1, 2**31, 2**32 - 1, 2**63, 2**64 - 1)
FLOATS = (0.0, -1.0, float("nan"), float("inf"), 1e30, -1e-30)


def mutate_safetensors_header(header: bytes, rng: np.random.Generator) -> bytes:
    """One to three random edits of a safetensors header: JSON-level (offsets, dtype, shape,
    fields, types) or raw byte flips."""
    for _ in range(int(rng.integers(1, 4))):
        try:
            h = json.loads(header)
        except ValueError:
            h = None
        op = int(rng.integers(0, 7))
        keys = [k for k in h if k != "__metadata__"] if isinstance(h, dict) else []
        if op == 6 or not keys:
            raw = bytearray(header)
            i = int(rng.integers(0, len(raw)))
            raw[i] = int(rng.integers(0, 256))
            header = bytes(raw)
            continue
        try:
            _edit_entry(h, keys, op, rng)
        except (KeyError, TypeError, IndexError, AttributeError):  # an earlier edit removed a field
            continue
        header = json.dumps(h).encode()
    return header


def _edit_entry(h: dict, keys: list[str], op: int, rng: np.random.Generator) -> None:
    t = h[keys[int(rng.integers(0, len(keys)))]]
    if op == 0:
        i = int(rng.integers(0, 2))
        t["data_offsets"][i] += int(rng.choice([-(2**40), -1000, -8, -1, 1, 8, 1000]))
    elif op == 1:
        other = h[keys[int(rng.integers(0, len(keys)))]]
        t["data_offsets"], other["data_offsets"] = other["data_offsets"], t["data_offsets"]
    elif op == 2:
        t["dtype"] = [str(x) for x in ("F32", "F16", "BF16", "I8", "U64", "X", "")][int(rng.integers(0, 7))]
    elif op == 3 and t["shape"]:
        i = int(rng.integers(0, len(t["shape"])))
        t["shape"][i] = int(rng.choice([0, 1, -1, t["shape"][i] + 1, 2**62]))
    elif op == 4:
        t.pop(["dtype", "shape", "data_offsets"][int(rng.integers(0, 3))])
    else:
        field = ["dtype", "shape", "data_offsets"][int(rng.integers(0, 3))]
        t[field] = [None, "1", 1.5, {}, [1, 2, 3], True][int(rng.integers(0, 6))]


def mutate_gguf(
    blob: bytes, data_start: int, fields: list[tuple[int, str]], rng: np.random.Generator
) -> bytes:
    """One to three random edits of a GGUF's header and metadata: a scalar key/value set to an
    absurd value, a u32/u64 overwritten, a byte flipped, or a truncation."""
    raw = bytearray(blob)
    for _ in range(int(rng.integers(1, 4))):
        op = int(rng.integers(0, 5))
        if op in (0, 1) and fields:  # a scalar value (offset, struct format) of the original file
            offset, fmt = fields[int(rng.integers(0, len(fields)))]
            pool = FLOATS if fmt in ("<f", "<d") else INTERESTING
            value = pool[int(rng.integers(0, len(pool)))]
            try:
                raw[offset : offset + struct.calcsize(fmt)] = struct.pack(fmt, value)
            except struct.error:
                raw[offset : offset + struct.calcsize(fmt)] = b"\xff" * struct.calcsize(fmt)
        elif op == 2:
            at = int(rng.integers(0, data_start - 8))
            size = int(rng.choice([4, 8]))
            value = INTERESTING[int(rng.integers(0, len(INTERESTING)))] % 2 ** (8 * size)
            raw[at : at + size] = value.to_bytes(size, "little")
        elif op == 3:
            raw[int(rng.integers(0, data_start))] = int(rng.integers(0, 256))
        else:
            del raw[int(rng.integers(0, len(raw))) :]
    return bytes(raw)


def gguf_scalar_fields(path: Path) -> tuple[int, list[tuple[int, str]]]:
    """(data start, [(byte offset, struct format)] of every scalar key/value) of a valid GGUF."""
    from gguf import GGUFReader

    reader = GGUFReader(path)
    out = []
    for f in reader.fields.values():
        part = f.parts[f.data[0]] if f.data else None
        if part is not None and part.dtype.kind in "uif" and len(f.data) == 1:
            fmt = "<" + part.dtype.char.replace("l", "q").replace("L", "Q")
            out.append((int(part.ctypes.data - reader.data.ctypes.data), fmt))
    return reader.data_offset, out


def run_forked(argv: list[str], main: Callable[[list[str]], object], cwd: Path) -> tuple[int | None, str]:
    """Run a CLI entry point in a forked child (time- and memory-limited): (exit status or -signal,
    stderr); None on a hang. Forking skips the interpreter start-up a subprocess would pay."""
    err_path = cwd / ".stderr"
    pid = os.fork()
    if pid == 0:  # the child: never returns
        code = 70
        try:
            os.chdir(cwd)
            _limit_memory()
            fd = os.open(err_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
            os.dup2(fd, 2)
            os.dup2(os.open(os.devnull, os.O_WRONLY), 1)
            sys.stderr = os.fdopen(2, "w", buffering=1)
            sys.stdout = open(os.devnull, "w")  # noqa: SIM115
            try:
                main(argv)
                code = 0
            except SystemExit as e:
                code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        except BaseException:
            import traceback

            traceback.print_exc()
        finally:
            sys.stderr.flush()
            os._exit(code)
    deadline = time.monotonic() + TIMEOUT_S
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            return None, ""
        time.sleep(0.005)
    stderr = err_path.read_text(errors="replace")
    err_path.unlink()
    return os.waitstatus_to_exitcode(status), stderr


def _clover_main(argv: list[str]) -> None:
    from clover_local.cli import app

    app(argv, prog_name="clover")


def _convert_main(argv: list[str]) -> None:
    from clover_convert.cli import app

    app(argv, prog_name="clover-convert")


def fuzz_verdict(rc: int | None, stderr: str, rejected_by_oracle: bool = False) -> tuple[str, str]:
    """clean: exit 0, or exit 1 with one error line; silent-wrong: exit 0 where the oracle (the
    safetensors library) rejects the input; crash: anything else."""
    if rc is None:
        return "crash", "hang"
    if "Traceback" in stderr:
        return "crash", stderr.strip().splitlines()[-1][:200]
    if rc == 0:
        return ("silent-wrong", "accepted what safetensors rejects") if rejected_by_oracle else ("clean", "")
    if rc == 1 and len(stderr.strip().splitlines()) == 1:
        return "clean", stderr.strip()
    return "crash", f"exit {rc}: {stderr.strip()[-300:]}"


def fuzz_safetensors(ckpt: Path, tmp: Path, n: int, seed: int) -> Tally:
    """Mutated headers of the first shard, converted; the safetensors library is the oracle."""
    from safetensors import safe_open

    rng = np.random.default_rng(seed)
    tally = Tally()
    for i in range(n):
        work = tmp / f"st{i}"
        shutil.copytree(ckpt, work / "ckpt")
        (work / "out").mkdir()
        shard = shards(work / "ckpt")[0]
        header, data = raw_header(shard)
        write_header(shard, mutate_safetensors_header(header, rng), data)
        try:
            with safe_open(str(shard), "numpy"):
                rejected = False
        except Exception:
            rejected = True
        rc, stderr = run_forked([str(work / "ckpt"), "-o", str(work / "out" / "m.gguf")], _convert_main, work)
        verdict, detail = fuzz_verdict(rc, stderr, rejected)
        tally.outcomes.append(Outcome(f"safetensors mutant {i}", verdict, detail, rc, stderr))
        shutil.rmtree(work)
    return tally


def fuzz_gguf(gguf: Path, tmp: Path, n: int, seed: int) -> Tally:
    """Mutated GGUF headers and metadata, run through `clover generate`."""
    rng = np.random.default_rng(seed)
    data_start, fields = gguf_scalar_fields(gguf)
    blob = gguf.read_bytes()
    tally = Tally()
    for i in range(n):
        work = tmp / f"gg{i}"
        work.mkdir()
        model = work / "m.gguf"
        model.write_bytes(mutate_gguf(blob, data_start, fields, rng))
        rc, stderr = run_forked(["generate", str(model), "-p", "hi", "-n", "4"], _clover_main, work)
        verdict, detail = fuzz_verdict(rc, stderr)
        tally.outcomes.append(Outcome(f"gguf mutant {i}", verdict, detail, rc, stderr))
        shutil.rmtree(work)
    return tally


if __name__ == "__main__":
    main()
