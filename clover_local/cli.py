"""The `clover` command line: chat, generate, serve, bench, convert, info, verify, rpc-server.

Every command reports bad input as one `error:` line with a hint on stderr and a non-zero exit
(1 for bad input, 2 for usage, 130 after Ctrl-C); `--debug` shows the traceback instead.
MODEL is a GGUF path or a Hugging Face GGUF (`owner/name:Q4_K_M`); with `--backend reference` a
checkpoint directory, run on the numpy reference (slow and exact: for checking a conversion).
"""

from __future__ import annotations

import functools
import inspect
import json
import os
import socket
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from enum import Enum
from importlib.metadata import entry_points
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from . import __version__, limits, memory
from .api import MODES, Clover
from .bench import run_bench
from .chat import ChatSession, drain
from .llama.engine import EngineError
from .model import location
from .model.config import CONTEXT_LIMIT, ConfigError
from .model.decoding_parameters import PARAMETERS
from .model.gguf_info import ModelFileError, read_header, read_info
from .model.tokenizer import ChatTemplateError
from .placement import CACHE_TYPES, Placement
from .rpc import DEFAULT_PORT, RpcError
from .speculative import SpeculativeSettings
from .visual import BlockView

HELP = {"help_option_names": ["-h", "--help"]}
app = typer.Typer(
    add_completion=False,
    rich_markup_mode=None,
    context_settings=HELP,
    help="Run the Clover block-diffusion model locally (llama.cpp, quantized weights).",
)
out = Console()
err = Console(stderr=True)
_state = {"debug": False}


def _version(show: bool) -> None:
    if show:
        from importlib.metadata import version

        print(f"clover-local {__version__} (llama-cpp-python {version('llama_cpp_python')})")
        raise typer.Exit()


@app.callback(invoke_without_command=True)
def main(
    ctx: typer.Context,
    debug: Annotated[
        bool, typer.Option("--debug", help="Show tracebacks on errors (accepted anywhere on the line).")
    ] = False,
    version: Annotated[
        bool,
        typer.Option("--version", "-V", callback=_version, is_eager=True, help="Print the version and exit."),
    ] = False,
) -> None:
    _state["debug"] = _state["debug"] or debug
    if ctx.invoked_subcommand is None:  # bare `clover`: the help, as `git` does
        print(ctx.get_help())


def run() -> None:
    """Console-script entry point (`clover`): `--debug` counts wherever it stands (before `--`)."""
    args = sys.argv[1:]
    end = args.index("--") if "--" in args else len(args)
    if "--debug" in args[:end]:
        _state["debug"] = True
        args.remove("--debug")
    app(args=args, prog_name="clover")


def fail(message: str, code: int = 1) -> None:
    """Print one error line (or re-raise under --debug) and exit."""
    if _state["debug"]:
        raise
    err.print(f"[red]error:[/red] {message}", highlight=False, soft_wrap=True)
    raise typer.Exit(code)


# Commands other installed packages add to `clover` (the converter's `convert`, the same as
# `clover-convert`): the runtime depends on no tool built on it.
for _command in entry_points(group="clover_local.commands"):
    app.command(_command.name)(_command.load())


class BackendName(str, Enum):
    llama = "llama"
    reference = "reference"


class ModeName(str, Enum):
    diffusion = "diffusion"
    ar = "ar"
    speculative = "speculative"


assert tuple(m.value for m in ModeName) == MODES


def _option(
    name: str, kind: type, default: Any, *decls: str, help: str, metavar: str | None = None
) -> inspect.Parameter:
    return inspect.Parameter(
        name,
        inspect.Parameter.KEYWORD_ONLY,
        default=default,
        annotation=Annotated[kind, typer.Option(*decls, help=help, metavar=metavar)],
    )


ModelArg = Annotated[
    str, typer.Argument(metavar="MODEL", help="A .gguf file, or a Hugging Face GGUF: owner/name:Q4_K_M.")
]

# Loading options: the keyword arguments of `load_model`.
MODEL_OPTIONS = [
    _option(
        "file", str | None, None, "--file", help="Which GGUF of a Hugging Face repository (name or glob)."
    ),
    _option(
        "backend",
        BackendName,
        BackendName.llama,
        help="llama: the GGUF on llama.cpp; reference: a checkpoint directory on the numpy reference.",
    ),
    _option(
        "mode",
        ModeName | None,
        None,
        help="diffusion (blocks), ar (a token per pass), speculative (previews draft, causal passes "
        "check). Default: diffusion; ar when the routed experts are in system RAM (--cpu-moe, "
        "--n-cpu-moe, -ot exps=CPU).",
    ),
    _option("n_ctx", int, 8192, "--n-ctx", "-c", help="Context size in tokens; 0: the model's 131072."),
    _option(
        "n_gpu_layers",
        int,
        -1,
        "--n-gpu-layers",
        "-ngl",
        help="Layers on the GPU (-1: all; no GPU: ignored).",
    ),
    _option("threads", int | None, None, "--threads", "-t", help="CPU threads (default: llama.cpp's)."),
    _option("verbose", bool, False, "--verbose", help="Show llama.cpp's log."),
    _option(
        "draft_len",
        int | None,
        None,
        "--draft-len",
        help="speculative: most drafted tokens per pass (default: block size - 1).",
    ),
    _option(
        "refinements", int, 0, "--refinements", help="speculative: preview passes refining a draft (0: none)."
    ),
    _option(
        "draft_threshold",
        float,
        0.0,
        "--draft-threshold",
        help="speculative: cut a draft before its first row less confident than this.",
    ),
    _option(
        "adaptive",
        bool,
        True,
        "--adaptive/--fixed-draft",
        help="speculative: adapt the draft length to the recent acceptance (down to plain AR steps).",
    ),
    _option(
        "first_draft",
        int | None,
        None,
        "--first-draft",
        help="speculative, adaptive: the first draft's length, doubled while every token is kept "
        "(default: --draft-len).",
    ),
]


class FlashAttnName(str, Enum):
    on = "on"
    off = "off"
    auto = "auto"


CacheType = Enum("CacheType", {t: t for t in CACHE_TYPES}, type=str)  # type: ignore[misc]

# Placement options (llama.cpp's names and meanings): keyword arguments of `Clover(...)` via `load_model`.
PLACEMENT_OPTIONS = [
    _option(
        "cpu_moe", bool, False, "--cpu-moe", "-cmoe", help="Keep all routed-expert weights in system RAM."
    ),
    _option(
        "n_cpu_moe",
        int,
        0,
        "--n-cpu-moe",
        "-ncmoe",
        help="Keep the routed-expert weights of the first N layers in system RAM.",
    ),
    _option(
        "override_tensor",
        list[str] | None,
        None,
        "--override-tensor",
        "-ot",
        help="PATTERN=BUFFER[,...]: tensors whose name matches the regex go to that buffer type "
        "(CPU, CUDA0, ...); repeatable, first match wins.",
        metavar="PATTERN=BUFFER",
    ),
    _option("flash_attn", FlashAttnName, FlashAttnName.auto, "--flash-attn", "-fa", help="Flash attention."),
    _option("cache_type_k", CacheType, CacheType.f16, "--cache-type-k", "-ctk", help="KV cache type for K."),
    _option(
        "cache_type_v",
        CacheType,
        CacheType.f16,
        "--cache-type-v",
        "-ctv",
        help="KV cache type for V (quantized types need flash attention).",
    ),
    _option(
        "no_mmap", bool, False, "--no-mmap", help="Read the weights into memory instead of mapping the file."
    ),
    _option("mlock", bool, False, "--mlock", help="Keep the weights in RAM (no swapping out)."),
    _option(
        "no_op_offload",
        bool,
        False,
        "--no-op-offload",
        help="Batches use the weights kept in system RAM on the CPU, instead of copying them to the GPU.",
    ),
    _option(
        "rpc",
        str | None,
        None,
        "--rpc",
        help="HOST:PORT[,...]: RPC servers (clover rpc-server) whose devices take layers before the "
        "local GPUs (-ngl counts them all). No authentication: trusted networks only.",
        metavar="HOST:PORT,...",
    ),
]


def placement_kwargs(
    cpu_moe: bool = False,
    n_cpu_moe: int = 0,
    override_tensor: list[str] | None = None,
    flash_attn: FlashAttnName = FlashAttnName.auto,
    cache_type_k: Enum = CacheType.f16,
    cache_type_v: Enum = CacheType.f16,
    no_mmap: bool = False,
    mlock: bool = False,
    no_op_offload: bool = False,
    rpc: str | None = None,
) -> dict[str, Any]:
    """The placement options as `Clover(...)` keyword arguments (llama-cpp-python's names)."""
    return {
        "cpu_moe": cpu_moe,
        "n_cpu_moe": n_cpu_moe,
        "override_tensor": tuple(override_tensor or ()),
        "flash_attn": flash_attn.value,
        "type_k": cache_type_k.value,
        "type_v": cache_type_v.value,
        "use_mmap": not no_mmap,
        "use_mlock": mlock,
        "op_offload": not no_op_offload,
        "rpc_servers": rpc,
    }


KV_OPTION_NAMES = ("flash_attn", "cache_type_k", "cache_type_v")
# where the weights live (`clover verify` fixes flash attention and the cache types itself)
WEIGHT_OPTIONS = [o for o in PLACEMENT_OPTIONS if o.name not in KV_OPTION_NAMES]

# bench runs every mode the file allows, side by side: no --mode
BENCH_OPTIONS = [p for p in MODEL_OPTIONS if p.name != "mode"]

# `clover info`: the loading options the memory estimate depends on
INFO_OPTIONS = [o for o in MODEL_OPTIONS if o.name in ("mode", "n_ctx", "n_gpu_layers")]

# Decoding options: keyword arguments of `create_*_completion` (None: the model's default).
# the decoding parameters' options come from their table; default: the model's (its GGUF keys)
DECODING_OPTIONS = [
    *(
        _option(p.request, p.type | None, None, *p.cli_flags, help=f"{p.help} Default: the model's.")
        for p in PARAMETERS
        if p.request is not None
    ),
    _option("stop", list[str] | None, None, "--stop", help="Stop string (repeatable)."),
    _option("temperature", float | None, None, help="Sampling temperature, every mode; 0: greedy (default)."),
    _option("top_k", int | None, None, help="Sample from the k most likely tokens only; 0: all (default)."),
    _option(
        "top_p", float | None, None, help="Then the fewest whose probability reaches p; 1: all (default)."
    ),
    _option(
        "min_p", float | None, None, help="Then those at least p times as likely as the top one; 0: all."
    ),
    _option("seed", int | None, None, help="Sampling seed (default: a fresh one per request)."),
]


def with_options(*groups: list[inspect.Parameter]) -> Callable[[Callable[..., None]], Callable[..., None]]:
    """Give a command the shared option groups; they reach it as one dict per group (`options`).

    Typer reads a command's signature, so the wrapper's signature is the command's own
    parameters followed by the groups' options: declared once, listed in every `--help`.
    """

    def wrap(command: Callable[..., None]) -> Callable[..., None]:
        own = inspect.signature(command, eval_str=True).parameters.values()
        names = [[p.name for p in group] for group in groups]

        @functools.wraps(command)
        def run(**kw: Any) -> None:
            options = [{n: kw.pop(n) for n in group} for group in names]
            command(**kw, options=options)

        run.__signature__ = inspect.Signature([p for p in own if p.name != "options"] + [*sum(groups, [])])
        return run

    return wrap


def check_options(*groups: dict[str, Any]) -> None:
    """Every option's range (`limits`), before any work: one line naming the flag, exit code 2."""
    try:
        for group in groups:
            limits.check_all(group, flags=True)
            n = group.get("max_tokens")
            if n is not None and n < 1:  # the API's "<= 0: the default" is not a flag value
                raise limits.OptionError(f"--max-tokens must be an integer >= 1, got {n}")
    except limits.OptionError as e:
        fail(str(e), code=2)


@app.command()
@with_options(INFO_OPTIONS, PLACEMENT_OPTIONS)
def info(
    model: Annotated[Path, typer.Argument(metavar="MODEL", help="A Clover .gguf file.")],
    as_json: Annotated[bool, typer.Option("--json", help="Print the metadata as JSON.")] = False,
    *,
    options: list[dict[str, Any]],
) -> None:
    """Show a GGUF's metadata (architecture, sizes, quant mix, diffusion keys and tensors) and the
    memory it needs per device for a context (-c), a mode and a placement, without loading it."""
    loading, placing = options
    check_options(loading, placing)
    try:
        header = read_header(model)
        meta = read_info(model, header)
    except ModelFileError as e:
        fail(str(e))
    with user_errors():
        n_ctx = loading["n_ctx"] if loading["n_ctx"] > 0 else CONTEXT_LIMIT
        placement = Placement.from_llama_kwargs(**placement_kwargs(**placing))
        speculative = loading["mode"] is ModeName.speculative
        shape = memory.ModelShape.of(header)
        mem = memory.plan(model, placement, loading["n_gpu_layers"], n_ctx, speculative, shape=shape)
    if as_json:
        print(json.dumps({**meta.to_dict(), "memory": mem.to_dict()}, indent=2))
        return
    t = Table(show_header=False, box=None)
    t.add_row("file", f"{meta.path} ({meta.file_size / 2**20:.1f} MiB)")
    t.add_row("architecture", meta.architecture)
    t.add_row("name", meta.name)
    t.add_row("file type", meta.file_type)
    t.add_row("parameters", f"{meta.n_params / 1e6:.1f} M in {meta.n_tensors} tensors")
    t.add_row("quant mix", ", ".join(f"{k} x{v}" for k, v in meta.quant_mix.items()))
    hp = meta.hyperparameters
    t.add_row(
        "trunk",
        f"{hp.get('block_count')} layers ({meta.gdn_layers} GDN), hidden {hp.get('embedding_length')}, "
        f"{hp.get('expert_count')} experts top-{hp.get('expert_used_count')}, "
        f"context {hp.get('context_length')}",
    )
    t.add_row("vocab", f"{meta.vocab_size} tokens, mask token {meta.mask_token_id}")
    if meta.has_diffusion_tensors:
        t.add_row("block diffusion", "yes: " + ", ".join(f"{k}={v}" for k, v in meta.diffusion.items()))
    else:
        t.add_row("block diffusion", "[yellow]no[/yellow] (left-to-right only: --ar-only or upstream file)")
    t.add_row("memory", mem.line().removeprefix("memory "))
    if not mem.fits:
        t.add_row("", "[red]" + memory.summary(mem, placement, loading["n_gpu_layers"]) + "[/red]")
    out.print(t)


OOM_OPTIONS = "--cpu-moe, -ctk q8_0 -ctv q8_0, a lower --n-ctx or --n-gpu-layers, or a smaller quant"


@app.command()
@with_options(WEIGHT_OPTIONS)
def verify(
    model: Annotated[Path, typer.Argument(metavar="MODEL", help="The converted .gguf file to check.")],
    reference: Annotated[
        Path, typer.Option("--reference", "-r", help="The checkpoint directory it was converted from.")
    ],
    prompt: Annotated[str, typer.Option("--prompt", "-p", help="Prompt to run through both.")] = (
        "The quick brown fox"
    ),
    max_tokens: Annotated[int, typer.Option("--max-tokens", "-n", help="Tokens of greedy generation.")] = 32,
    n_gpu_layers: Annotated[int, typer.Option("--n-gpu-layers", "-ngl", help="Layers on the GPU.")] = 0,
    threads: Annotated[int | None, typer.Option("--threads", "-t", help="CPU threads.")] = None,
    no_repack: Annotated[
        bool,
        typer.Option(
            "--no-repack",
            "-nr",
            help="CPU weights in plain buffers (no AMX / repacked layouts), as llama.cpp's.",
        ),
    ] = False,
    reference_cache: Annotated[
        Path | None,
        typer.Option(
            "--reference-cache",
            help="An .npz that keeps the reference's results: checks of other files or backends of"
            " the same checkpoint, prompt and token count reuse them instead of recomputing.",
        ),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as JSON.")] = False,
    *,
    options: list[dict[str, Any]],
) -> None:
    """Check a conversion: the runtime against the numpy reference on the same prompt.

    Runs the causal pass over the prompt, one preview pass on a partially masked block, the commit
    and a short greedy block-diffusion generation. Each pass is judged by the KL divergence of the
    two softmax distributions, top-1 agreement on rows with a clear reference argmax and top-5
    overlap, with tolerances per file type and for CPU or GPU; rows routed to other experts than
    the reference are counted. Exits 1 past the tolerance. The placement options move weights;
    the check always keeps K/V in F32 and flash attention off.
    """
    from .conversion_check import check_conversion

    (placing,) = options
    check_options({"max_tokens": max_tokens, "n_gpu_layers": n_gpu_layers, "threads": threads}, placing)
    with user_errors():
        read_info(model)
        report = check_conversion(
            model,
            reference,
            prompt,
            max_new_tokens=max_tokens,
            n_gpu_layers=n_gpu_layers,
            n_threads=threads,
            placement=Placement.from_llama_kwargs(**placement_kwargs(**placing)),
            extra_buffer_types=not no_repack,
            reference_cache=reference_cache,
        )
    if as_json:
        print(json.dumps(report.to_dict(), indent=2))
    else:
        t = Table(title=f"clover verify: {model} ({report.file_type}, {report.backend}) vs {reference}")
        cols = (
            "pass",
            "rel. KL mean",
            "rel. KL p99",
            "KL mean",
            "top-1 clear rows",
            "top-5",
            "other experts",
        )
        for col in cols:
            t.add_column(col, justify="right" if col != "pass" else "left")
        for name in ("causal", "preview", "commit"):
            d = getattr(report, name)
            t.add_row(
                f"{name} ({d.rows} rows)",
                f"{d.rel_kl_mean:.2g}",
                f"{d.rel_kl_p99:.2g}",
                f"{d.kl_mean:.2g}",
                f"{d.top1_clear:.0%} of {d.clear_rows}",
                f"{d.top5:.0%}",
                f"{d.routing_flip_rows} rows",
            )
        out.print(t)
        n_ref = len(report.reference_generated)
        judged = (
            "" if report.tolerance and report.tolerance.generation is not None else " (reported, not judged)"
        )
        out.print(f"greedy generation: {report.token_agreement:.1%} of {n_ref} tokens agree{judged}")
        if report.speculative_identical is not None:
            div = report.speculative_divergence
            if report.speculative_identical:
                same = "identical to"
            elif div and div["near_tie"]:
                same = (
                    f"parts at token {div['token']} on a near-tie (one-row logit margin "
                    f"{div['margin']:.3f} within the GPU's {div['bound']:.3f}) from"
                )
            else:
                same = "[red]differs from[/red]"
            out.print(f"speculative decoding: {same} left-to-right decoding on this file")
        if tensors := report.checks.get("tensors"):
            worst, bad = tensors["worst"], len(tensors["failed"])
            out.print(
                f"tensors: {tensors['checked']} compared with the checkpoint, {bad} out of bounds"
                + (f"; worst {worst['name']} ({worst['type']}) {worst['error']:.2%} off" if worst else "")
            )
        verdict = {True: "[green]PASS[/green]", False: "[red]FAIL[/red]", None: "no tolerance for this type"}
        out.print(f"{verdict[report.passed]}" + "".join(f"\n  {f}" for f in report.failures))
    if report.passed is False:
        raise typer.Exit(1)


@contextmanager
def user_errors() -> Iterator[None]:
    """Turn the errors a user can fix into one `error:` line (tracebacks only under --debug)."""
    try:
        yield
    except (ModelFileError, ConfigError, ChatTemplateError, ValueError, FileNotFoundError) as e:
        fail(str(e))
    except RpcError as e:
        fail(str(e))
    except EngineError as e:
        hint = f" (out of memory? try {OOM_OPTIONS})"
        fail(str(e) + (hint if str(e).startswith("could not") else ""))
    except MemoryError:
        fail(f"out of memory: try {OOM_OPTIONS}")
    except KeyboardInterrupt:
        err.print("interrupted", style="yellow")
        raise typer.Exit(130) from None


def load_model(
    model: str,
    file: str | None,
    backend: BackendName,
    mode: ModeName | None,
    n_ctx: int,
    n_gpu_layers: int,
    threads: int | None,
    verbose: bool,
    draft_len: int | None = None,
    refinements: int = 0,
    draft_threshold: float = 0.0,
    adaptive: bool = True,
    first_draft: int | None = None,
    placement: dict[str, Any] | None = None,
) -> Clover:
    """Resolve MODEL (downloading a Hub GGUF) and load it on the chosen backend; `placement`:
    `placement_kwargs` (llama.cpp's options). The memory estimate goes to stderr before loading."""
    path = location.resolve(model, file)
    if backend is BackendName.reference:
        if not path.is_dir():
            raise ModelFileError(
                f"{path}: --backend reference runs a checkpoint directory (config.json + safetensors); "
                "a GGUF runs on the default backend"
            )
        clover = Clover.from_checkpoint(path, n_ctx=n_ctx, mode=mode.value if mode else "diffusion")
    elif path.is_dir():
        raise ModelFileError(
            f"{path}: is a checkpoint directory; convert it (clover convert) or run it on the numpy "
            "reference with --backend reference"
        )
    else:
        clover = Clover(
            path,
            n_ctx=n_ctx,
            n_gpu_layers=n_gpu_layers,
            n_threads=threads,
            verbose=verbose,
            mode=mode.value if mode else None,
            on_memory=lambda m: err.print(m.line(), style="dim", highlight=False, soft_wrap=True),
            **(placement or {}),
        )
    clover.draft = SpeculativeSettings(
        draft_len=draft_len,
        refinements=refinements,
        draft_threshold=draft_threshold,
        adaptive=adaptive,
        first_draft=first_draft,
    )
    return clover


def loaded_line(clover: Clover, loading: dict[str, Any]) -> str:
    """One line on what runs: model, file type, context, backend, mode."""
    if loading["backend"] is BackendName.reference:
        backend = "numpy reference"
    else:
        from llama_cpp import llama_cpp as ll

        gpu = ll.llama_supports_gpu_offload() and loading["n_gpu_layers"] != 0
        backend = "llama.cpp " + ("GPU" if gpu else "CPU")
        servers = clover.backend.placement.rpc_servers
        if servers and loading["n_gpu_layers"] != 0:
            backend += " + RPC " + ", ".join(servers)
    kind = f", {clover.file_type}" if clover.file_type else ""
    return f"{Path(clover.model_path).name}{kind}, context {clover.n_ctx()}, {backend}, {clover.mode} mode"


def _request(decoding: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in decoding.items() if v not in (None, [])}


SystemOpt = Annotated[str | None, typer.Option("--system", "-s", help="System prompt.")]
ThinkOpt = Annotated[bool, typer.Option("--think/--no-think", help="Thinking mode of the chat template.")]
VisualOpt = Annotated[bool, typer.Option("--visual", help="Show each block being denoised in place.")]


@app.command()
@with_options(MODEL_OPTIONS, PLACEMENT_OPTIONS, DECODING_OPTIONS)
def chat(
    model: ModelArg,
    system: SystemOpt = None,
    think: ThinkOpt = True,
    visual: VisualOpt = False,
    *,
    options: list[dict[str, Any]],
) -> None:
    """Talk to the model: multi-turn, streamed as blocks resolve; /help lists the commands."""
    loading, placing, decoding = options
    check_options(loading, placing, decoding)
    with user_errors(), err.status(f"loading {model}", spinner="dots"):
        clover = load_model(model, **loading, placement=placement_kwargs(**placing))
    err.print(loaded_line(clover, loading), style="dim", highlight=False)
    with clover, user_errors():
        ChatSession(clover, out, system=system, thinking=think, visual=visual, **_request(decoding)).run()


@app.command()
@with_options(MODEL_OPTIONS, PLACEMENT_OPTIONS, DECODING_OPTIONS)
def generate(
    model: ModelArg,
    prompt: Annotated[str | None, typer.Option("--prompt", "-p", help="The prompt text.")] = None,
    prompt_file: Annotated[
        Path | None, typer.Option("--file-prompt", "-f", help="Read the prompt from a file ('-': stdin).")
    ] = None,
    raw: Annotated[
        bool, typer.Option("--raw", help="Send the prompt as is, without the chat template.")
    ] = False,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print one JSON object: text, usage and decoding statistics.")
    ] = False,
    system: SystemOpt = None,
    think: ThinkOpt = True,
    visual: VisualOpt = False,
    *,
    options: list[dict[str, Any]],
) -> None:
    """Answer one prompt non-interactively: the answer on stdout, reasoning (dimmed) on stderr."""
    if (prompt is None) == (prompt_file is None):
        fail("give the prompt with either -p TEXT or -f FILE", code=2)
    loading, placing, decoding = options
    check_options(loading, placing, decoding)
    with user_errors():
        text = prompt if prompt is not None else _read_prompt(prompt_file)
        clover = load_model(model, **loading, placement=placement_kwargs(**placing))
    opts = _request(decoding)
    with clover, user_errors():
        view = BlockView(clover._text, clover.mask_token_id, err, reasoning=think and not raw)
        show = visual and not as_json
        if show:
            opts["on_event"] = view.update
        if raw:
            stream = clover.create_completion(text, stream=True, **opts)
        else:
            messages = [{"role": "system", "content": system}] if system else []
            messages.append({"role": "user", "content": text})
            stream = clover.create_chat_completion(messages, stream=True, thinking=think, **opts)
        with view if show else nullcontext():
            fields, final = drain(stream, None if as_json or show else _echo)
    if as_json:
        reply = {**fields, "finish_reason": final["choices"][0]["finish_reason"]}
        print(json.dumps({**reply, "usage": final["usage"], "clover": final["clover"]}, indent=2))
        return
    if show:
        for name, delta in fields.items():
            _echo(name, delta)
    print(flush=True)


def _read_prompt(path: Path | None) -> str:
    if path is None or str(path) == "-":
        return sys.stdin.read()
    if not path.is_file():
        raise ModelFileError(f"{path}: prompt file not found")
    return path.read_text(encoding="utf-8")


def _echo(name: str, delta: str) -> None:
    """The answer to stdout, the reasoning dimmed to stderr (so `> file` keeps only the answer)."""
    if name == "content":
        sys.stdout.write(delta)
        sys.stdout.flush()
    elif delta:
        err.print(delta, end="", style="dim", markup=False, highlight=False, soft_wrap=True)


@app.command()
@with_options(MODEL_OPTIONS, PLACEMENT_OPTIONS, DECODING_OPTIONS)
def serve(
    model: ModelArg,
    host: Annotated[str, typer.Option(help="Address to listen on (0.0.0.0: every interface).")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to listen on.")] = 8080,
    api_key: Annotated[
        str | None,
        typer.Option(envvar="CLOVER_API_KEY", help="Require `Authorization: Bearer KEY` on /v1 requests."),
    ] = None,
    alias: Annotated[
        str | None, typer.Option(help="Model name in /v1/models (default: the file's name).")
    ] = None,
    max_queued: Annotated[
        int, typer.Option(min=0, help="Requests waiting behind the running one before a 429.")
    ] = 16,
    *,
    options: list[dict[str, Any]],
) -> None:
    """Serve the model over OpenAI's HTTP API (/v1/chat/completions, ...) with a chat page at /.

    The decoding options set the defaults of every request; a request's own fields override them.
    Needs the server extra: pip install 'clover-local[server]'.
    """
    try:
        from .server.app import ServerConfig
        from .server.app import serve as run_server
    except ImportError as e:
        fail(f"clover serve needs the server extra ({e.name} is missing): pip install 'clover-local[server]'")
    loading, placing, decoding = options
    check_options({"port": port}, loading, placing, decoding)
    check_listen(host, port)
    with user_errors():
        clover = load_model(model, **loading, placement=placement_kwargs(**placing))
    if api_key is None and host not in ("127.0.0.1", "localhost", "::1"):
        err.print(
            f"[yellow]warning:[/yellow] listening on {host} without --api-key: "
            "anyone who can reach this machine can use the model"
        )
    name = alias or Path(clover.model_path).name
    config = ServerConfig(name, api_key=api_key, max_queued=max_queued, defaults=_request(decoding))
    with clover, user_errors():
        run_server(clover, config, host, port)


def check_listen(host: str, port: int) -> None:
    """Fail before the model loads when the address cannot be listened on (a port in use, an
    unknown host): one line, exit 1, instead of the server's own log line after the loading."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
        with socket.socket(family, kind, proto) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the server binds
            probe.bind(address)
    except OSError as e:
        fail(f"cannot listen on {host}:{port}: {e.strerror or e}")


@app.command()
@with_options(BENCH_OPTIONS, PLACEMENT_OPTIONS)
def bench(
    model: ModelArg,
    prompt_tokens: Annotated[
        list[int] | None,
        typer.Option(
            help="Prompt length for prompt processing; repeat for several (the first one is the "
            "prompt of the decode timings). Default: 512."
        ),
    ] = None,
    gen_tokens: Annotated[int, typer.Option(help="Tokens generated for tokens/pass and speed.")] = 128,
    repeats: Annotated[int, typer.Option(help="Runs per timing (the median is reported).")] = 3,
    simulate: Annotated[
        bool,
        typer.Option(
            "--simulate",
            help="Also run the labelled acceptance simulations: diffusion resolving exactly k = 1, 2, 4, "
            "8, 16 tokens per pass, speculative accepting exactly a = 0, 1, 2, 4, 8 drafted tokens per "
            "iteration (random weights accept nothing; this shows the engine's speed apart from the model).",
        ),
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the results as JSON.")] = False,
    *,
    options: list[dict[str, Any]],
) -> None:
    """Time prompt processing, the preview, commit and speculative passes and the AR step on one
    model, with the bytes each pass moves, then generate in every mode it runs (ar, diffusion,
    speculative) side by side."""
    loading, placing = options
    check_options(loading, placing)
    for flag, n in (
        ("--gen-tokens", gen_tokens),
        ("--repeats", repeats),
        ("--prompt-tokens", min(prompt_tokens or [1])),
    ):
        if n < 1:
            fail(f"{flag} must be an integer >= 1, got {n}", code=2)
    with user_errors():
        path = location.resolve(model, loading.pop("file"))
        mode = ModeName.diffusion
        if loading["backend"] is BackendName.llama and path.is_file():
            # an --ar-only file: no previews to time; else the speculative snapshots, so every mode runs
            diffusion = read_info(path).has_diffusion_tensors
            mode = ModeName.speculative if diffusion else ModeName.ar
        clover = load_model(str(path), None, mode=mode, **loading, placement=placement_kwargs(**placing))
    with clover, user_errors():
        lengths = prompt_tokens or [512]
        res = run_bench(clover, lengths, gen_tokens, repeats, simulate)
    if as_json:
        print(json.dumps(res, indent=2))
        return
    t = Table(title=f"clover bench: {res['model']} ({res['mode']})")
    t.add_column("measure")
    t.add_column("value", justify="right")
    for n, pp in res["prompt_processing"].items():
        t.add_row(f"prompt processing ({n} tokens)", f"{pp['tokens_per_s']:.1f} tok/s ({pp['ms']:.1f} ms)")
    if res["preview_ms"] is not None:
        t.add_row(f"preview pass ({res['block_size']} rows)", f"{res['preview_ms']:.1f} ms")
    t.add_row(f"commit pass ({res['block_size']} tokens)", f"{res['commit_ms']:.1f} ms")
    if res["fused_pass_ms"] is not None:
        t.add_row(
            f"speculative pass ({res['block_size']} + {res['block_size']} rows)",
            f"{res['fused_pass_ms']:.1f} ms",
        )
    t.add_row("AR step (1 token)", f"{res['ar_step_ms']:.1f} ms = {res['ar_tokens_per_s']:.1f} tok/s")
    g = res["generation"]
    speed = f"{g['tokens_per_s']:.1f} tok/s ({res['speedup_vs_ar']:.2f}x AR)"
    t.add_row(f"generation ({g['tokens']} tokens)", f"{g['tokens_per_pass']:.2f} tok/pass, {speed}")
    for mode, m in res["modes"].items():
        ratio = m["tokens_per_s"] / res["ar_tokens_per_s"]
        t.add_row(
            f"  {mode} ({m['passes']} passes)",
            f"{m['tokens_per_pass']:.2f} tok/pass, {m['ms_per_pass']:.1f} ms/pass, "
            f"{m['tokens_per_s']:.1f} tok/s ({ratio:.2f}x AR)",
        )
    up = res.get("llama_cpp_ar")
    if up:
        t.add_row(
            "plain llama.cpp greedy decoding (same file)",
            f"{up['tokens_per_s']:.1f} tok/s (ar mode: {up['ar_ratio']:.2f}x)",
        )
    for name, moved in res["bytes_per_pass"].items():
        if moved is not None:
            t.add_row(f"bytes per {name} pass", f"{moved['read']} read, {moved['written']} written")
    sim = res.get("simulation")
    if sim:
        t.add_row("[b]simulation[/b] (labelled: fixed acceptance)", f"ar loop {sim['ar_tok_s']:.1f} tok/s")
        for k, v in sim.get("e2e_tok_s_by_k", {}).items():
            t.add_row(f"  diffusion, {k} tokens/pass", f"{v:.1f} tok/s ({v / sim['ar_tok_s']:.2f}x ar)")
        for a, v in sim.get("spec_tok_s_by_accept", {}).items():
            t.add_row(
                f"  speculative, {a} accepted/iteration", f"{v:.1f} tok/s ({v / sim['ar_tok_s']:.2f}x ar)"
            )
    out.print(t)


@app.command("rpc-server")
def rpc_server(
    host: Annotated[
        str, typer.Option("--host", "-H", help="IPv4 address to listen on (0.0.0.0: every interface).")
    ] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", "-p", help="Port to listen on.")] = DEFAULT_PORT,
    threads: Annotated[
        int | None, typer.Option("--threads", "-t", help="CPU device threads (default: half the cores).")
    ] = None,
    device: Annotated[
        str | None,
        typer.Option(
            "--device",
            "-d",
            help="DEV[,...]: devices to serve (CPU, CUDA0, ...; default: every GPU, else the CPU).",
        ),
    ] = None,
) -> None:
    """Serve this machine's devices to other machines' --rpc over ggml's RPC protocol, until Ctrl-C.

    A client (clover chat/generate/serve/bench/verify --rpc HOST:PORT, or Clover(rpc_servers=...))
    puts layers on them as on local GPUs; one client at a time. RPC has no authentication and no
    encryption: whoever reaches the port uses the devices, so listen on a trusted network only.
    """
    from .rpc_server import check_address, default_threads, serve

    names = [n for n in (device or "").split(",") if n]
    with user_errors():
        check_address(host, port)
    check_listen(host, port)
    with user_errors():
        try:
            serve(
                host,
                port,
                default_threads() if threads is None else threads,
                names,
                say=lambda line: err.print(line, highlight=False, soft_wrap=True),
                warn=lambda line: err.print(
                    f"[yellow]warning:[/yellow] {line}", highlight=False, soft_wrap=True
                ),
            )
        except KeyboardInterrupt:
            # the server loop never returns: end the process without running its static destructors
            err.print("stopped", style="yellow")
            sys.stdout.flush()
            os._exit(130)


if __name__ == "__main__":
    run()
