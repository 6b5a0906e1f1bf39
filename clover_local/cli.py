"""The `clover` command line: convert, info, verify (and the runtime commands as they land).

Every command reports bad input as one `error:` line with a hint on stderr and a non-zero exit
(1 for bad input, 2 for usage); `--debug` shows the traceback instead.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from clover_convert.cli import convert_command
from rich.console import Console
from rich.table import Table

from .model_info import ModelFileError, read_info

app = typer.Typer(
    add_completion=False,
    rich_markup_mode=None,
    no_args_is_help=True,
    help="Run the Clover block-diffusion model locally (llama.cpp, quantized weights).",
)
out = Console()
err = Console(stderr=True)
_state = {"debug": False}


@app.callback()
def main(debug: Annotated[bool, typer.Option("--debug", help="Show tracebacks on errors.")] = False) -> None:
    _state["debug"] = debug


def fail(message: str, code: int = 1) -> None:
    """Print one error line (or re-raise under --debug) and exit."""
    if _state["debug"]:
        raise
    err.print(f"[red]error:[/red] {message}", highlight=False, soft_wrap=True)
    raise typer.Exit(code)


app.command("convert", help="Convert a Clover checkpoint to GGUF (same as clover-convert).")(convert_command)


@app.command()
def info(
    model: Annotated[Path, typer.Argument(metavar="MODEL", help="A Clover .gguf file.")],
    as_json: Annotated[bool, typer.Option("--json", help="Print the metadata as JSON.")] = False,
) -> None:
    """Show a GGUF's metadata: architecture, sizes, quant mix, diffusion keys and tensors."""
    try:
        meta = read_info(model)
    except ModelFileError as e:
        fail(str(e))
    if as_json:
        print(json.dumps(meta.to_dict(), indent=2))
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
    out.print(t)
