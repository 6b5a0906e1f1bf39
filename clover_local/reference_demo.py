"""Block diffusion on the numpy reference, traced pass by pass.

`python -m clover_local.reference_demo [--checkpoint DIR]` renders a chat prompt, runs the decode
loop on the reference model and prints, per block, every pass: the positions it filled and the
block as it stands (masks shown as `_`). Without a checkpoint a `tiny` one is generated into a
temporary directory, so the demo needs nothing but this package.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from rich.console import Console
from rich.markup import escape

from .loops import BlockEvent, PassEvent, Result, diffusion_loop
from .model.config import CheckpointConfig
from .model.tokenizer import THINK_END, THINK_START, CloverTokenizer
from .policy import DecodingSettings
from .reference.backend import NumpyBackend
from .reference.model import ReferenceModel

MASK_GLYPH = "_"


def block_text(tok: CloverTokenizer, tokens: tuple[int, ...], filled: tuple[int, ...], mask_id: int) -> str:
    """The block as rich markup: masks as `_`, this pass's fills in bold green."""
    parts = []
    for i, t in enumerate(tokens):
        piece = MASK_GLYPH if t == mask_id else escape(tok.decode([t]).replace("\n", "\\n"))
        parts.append(
            f"[bold green]{piece}[/]" if i in filled else f"[dim]{piece}[/]" if t == mask_id else piece
        )
    return "".join(parts)


def run(
    checkpoint: Path,
    prompt: str,
    max_new_tokens: int,
    block_size: int | None,
    threshold: float | None,
    thinking: bool,
    console: Console,
) -> Result:
    """Trace one chat request on the checkpoint and return the decode result."""
    cfg = CheckpointConfig.from_dir(checkpoint)
    tok = CloverTokenizer.from_dir(checkpoint)
    model = ReferenceModel.from_checkpoint(checkpoint)
    s = DecodingSettings.from_defaults(
        cfg.generation,
        cfg.model.mask_token_id,
        max_new_tokens=max_new_tokens,
        block_size=block_size,
        threshold=threshold,
        think_start_id=tok.token_id(THINK_START),
        think_end_id=tok.token_id(THINK_END),
    )
    ids = tok.encode_chat([{"role": "user", "content": prompt}], enable_thinking=thinking)
    console.print(f"[bold]checkpoint[/] {checkpoint}  block {s.block_size}  threshold {s.threshold}")
    console.print(f"[bold]prompt[/] ({len(ids)} tokens) {escape(tok.decode(ids))!r}")
    for event in diffusion_loop(NumpyBackend(model), ids, s):
        if isinstance(event, PassEvent):
            text = block_text(tok, event.tokens, event.filled, s.mask_token_id)
            console.print(
                f"  block {event.block} pass {event.pass_index:2d}  +{len(event.filled):2d}  "
                f"{event.seconds * 1e3:6.1f} ms  {text}"
            )
        elif isinstance(event, BlockEvent):
            console.print(
                f"[bold]block {event.block}[/]: {event.passes} passes, {len(event.tokens)} tokens "
                f"-> {escape(tok.decode(event.tokens))!r}"
            )
        else:
            n_pass, n_tok = sum(event.passes_per_block), len(event.tokens)
            console.print(
                f"[bold]{n_tok} tokens[/] in {n_pass} passes over {len(event.passes_per_block)} blocks "
                f"({n_tok / max(n_pass, 1):.2f} tokens/pass), finish: {event.finish_reason}, "
                f"{event.seconds:.2f} s"
            )
            console.print(f"[bold]text[/] {escape(tok.decode(event.tokens))!r}")
            return event
    raise AssertionError("the loop ended without a Result")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m clover_local.reference_demo", description=__doc__.splitlines()[0]
    )
    ap.add_argument("--checkpoint", type=Path, help="checkpoint directory (default: generate a tiny one)")
    ap.add_argument("--prompt", default="What is the capital of France?")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--block-size", type=int, help="default: the checkpoint's")
    ap.add_argument("--threshold", type=float, help="default: the checkpoint's")
    ap.add_argument("--no-think", action="store_true", help="render the prompt with enable_thinking=false")
    args = ap.parse_args(argv)
    console = Console(highlight=False)
    opts = (args.prompt, args.max_new_tokens, args.block_size, args.threshold, not args.no_think, console)
    if args.checkpoint is not None:
        run(args.checkpoint, *opts)
        return 0
    from .testing.make_checkpoint import write_checkpoint

    with tempfile.TemporaryDirectory(prefix="clover-demo-") as tmp:
        run(write_checkpoint(Path(tmp) / "tiny", "tiny"), *opts)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
