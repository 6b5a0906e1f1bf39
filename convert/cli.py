"""`clover-convert`: a Clover checkpoint (directory or Hugging Face repo id) to one GGUF file.

Bad input ends with one `error:` line on stderr and exit status 1, never a traceback and never a
partial output file; an interrupt exits 130 after removing the temporary files.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    TextColumn,
    TimeRemainingColumn,
    TransferSpeedColumn,
)
from rich.table import Table

from . import writer
from .errors import ConvertError
from .mix import OUTTYPES
from .pipeline import Options, Prepared, Result, convert, parse_size, prepare
from .plan import PlannedTensor

MAX_THREADS = 512  # a worker thread per core, as ggml's pool counts them; more only costs memory

app = typer.Typer(
    add_completion=False, rich_markup_mode=None, context_settings={"help_option_names": ["-h", "--help"]}
)
err = Console(stderr=True)


@app.command()
def convert_command(
    model: Annotated[
        str,
        typer.Argument(metavar="MODEL", help="Checkpoint directory, or a Hugging Face repo id (owner/name)."),
    ],
    outfile: Annotated[
        Path | None,
        typer.Option("--outfile", "-o", help="Output GGUF path (default: ./<model>-<OUTTYPE>.gguf)."),
    ] = None,
    outtype: Annotated[
        str,
        typer.Option(
            "--outtype",
            help=f"Tensor type: {', '.join(OUTTYPES)}. Norms, biases, ssm_a, the router, conv and "
            "block-diffusion tensors always stay F32.",
        ),
    ] = "bf16",
    imatrix: Annotated[
        Path | None, typer.Option(help="Importance matrix (llama-imatrix GGUF) for quantized outtypes.")
    ] = None,
    ar_only: Annotated[
        bool,
        typer.Option(
            "--ar-only",
            help="Write a left-to-right-only file: no block-diffusion tensors or keys. "
            "Required for checkpoints that lack them.",
        ),
    ] = False,
    dry_run: Annotated[
        bool,
        typer.Option("--dry-run", help="Print the tensor plan (name, shape, type, source); write nothing."),
    ] = False,
    split_max_size: Annotated[
        str | None,
        typer.Option(
            help="Split into shards of at most this size (e.g. 500M, 50G): NAME-00001-of-0000N.gguf."
        ),
    ] = None,
    threads: Annotated[
        int,
        typer.Option("--threads", "-t", min=0, max=MAX_THREADS, help="Worker threads (0: all cores)."),
    ] = 0,
    force: Annotated[bool, typer.Option("--force", help="Overwrite an existing output file.")] = False,
    name: Annotated[
        str | None, typer.Option(help="general.name (default: the checkpoint directory name).")
    ] = None,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print the plan or the result as JSON on stdout.")
    ] = False,
) -> None:
    """Convert a Clover checkpoint to GGUF (arch clover-moe), keeping every block-diffusion tensor."""
    logging.getLogger("gguf").setLevel(logging.ERROR)
    try:
        opts = Options(
            model=model,
            outfile=outfile,
            outtype=outtype,
            imatrix=imatrix,
            ar_only=ar_only,
            split_max_size=parse_size(split_max_size) if split_max_size else 0,
            force=force,
            name=name,
            threads=threads or os.cpu_count() or 1,
        )
        prep = prepare(opts)
        if dry_run:
            _print_plan(prep, as_json)
            return
        with writer.interrupt_on_termination():
            result = _run(prep, opts.threads)
    except ConvertError as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(1) from None
    except OSError as e:  # e.g. the disk filled up while writing: temporary files are already gone
        typer.echo(f"error: {e.filename or 'output'}: {e.strerror}", err=True)
        raise typer.Exit(1) from None
    except KeyboardInterrupt as e:  # Ctrl-C (130), SIGTERM (143) or SIGHUP (129)
        typer.echo("interrupted: no output written", err=True)
        raise typer.Exit(128 + e.signum if isinstance(e, writer.Terminated) else 130) from None
    _print_result(result, as_json)


def _run(prep: Prepared, threads: int) -> Result:
    plan = prep.plan
    columns = (
        TextColumn("{task.description}"),
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        TimeRemainingColumn(),
    )
    with Progress(*columns, console=err, disable=not err.is_terminal, transient=True) as progress:
        task = progress.add_task("", total=plan.nbytes)
        index = {t.name: i for i, t in enumerate(plan.tensors, 1)}

        def report(t: PlannedTensor, n: int) -> None:
            progress.update(task, advance=n, description=f"[{index[t.name]}/{len(index)}] {t.name}")

        return convert(prep, threads, report)


def _print_plan(prep: Prepared, as_json: bool) -> None:
    plan = prep.plan
    rows = [
        {
            "name": t.name,
            "shape": list(reversed(t.shape)),
            "type": t.qtype.name,
            "bytes": t.nbytes,
            "source": t.source,
        }
        for t in plan.tensors
    ]
    if as_json:
        summary = {"files": [str(p) for p in prep.shards], "bytes": plan.nbytes, "dropped": plan.dropped}
        print(json.dumps({**summary, "tensors": rows}, indent=1))
        return
    out = Console(width=None if sys.stdout.isatty() else 200)  # full names when piped
    table = Table("tensor", "ne (ggml order)", "type", "size", "source", box=None)
    for r in rows:
        table.add_row(r["name"], str(r["shape"]), r["type"], _size(r["bytes"]), r["source"])
    out.print(table)
    out.print(f"{len(rows)} tensors, {_size(plan.nbytes)} -> " + ", ".join(str(p) for p in prep.shards))
    if plan.dropped:
        out.print(_dropped(plan.dropped))
    out.print("dry run: nothing written")


def _print_result(result: Result, as_json: bool) -> None:
    plan = result.plan
    rate = plan.source_bytes / result.seconds / 1e9 if result.seconds else 0.0
    if as_json:
        print(
            json.dumps(
                {
                    "files": [str(p) for p in result.shards],
                    "bytes": plan.nbytes,
                    "source_bytes": plan.source_bytes,
                    "seconds": round(result.seconds, 3),
                    "dropped": plan.dropped,
                }
            )
        )
        return
    if plan.dropped:
        typer.echo(_dropped(plan.dropped), err=True)
    files = ", ".join(str(p) for p in result.shards)
    print(
        f"wrote {files}: {len(plan.tensors)} tensors, {_size(plan.nbytes)} in {result.seconds:.1f} s "
        f"({rate:.2f} GB/s of input)"
    )


def _dropped(names: list[str]) -> str:
    more = f" and {len(names) - 1} more" if len(names) > 1 else ""
    return f"not converted: {names[0]}{more}"


def _size(n: int) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n} B"


def main() -> None:
    """Console-script entry point (`clover-convert`)."""
    app(prog_name="clover-convert")


if __name__ == "__main__":
    main()
