"""`--visual`: the block being denoised, in place: mask glyphs turning into text pass by pass.

`BlockView` consumes the decode events (`on_event`) and renders, for a rich `Live`, the response
so far followed by the current block: resolved positions as their text, masked ones as a glyph,
the positions this pass filled highlighted. Only the last lines that fit the terminal are drawn.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from rich.console import Console, ConsoleOptions, RenderResult
from rich.text import Text

from .decode import BlockEvent, Event, PassEvent
from .tokenizer import THINK_END

MASK_GLYPH = "░"


class BlockView:
    """A rich renderable of a response under block diffusion (or AR: the text alone)."""

    def __init__(self, decode: Callable[[Sequence[int]], str], mask_token_id: int, reasoning: bool = False):
        self.decode, self.mask_token_id, self.reasoning = decode, mask_token_id, reasoning
        self.committed: list[int] = []
        self.block: tuple[int, ...] = ()
        self.filled: tuple[int, ...] = ()
        self.passes = 0

    def update(self, event: Event) -> None:
        if isinstance(event, PassEvent):
            self.block, self.filled = event.tokens, event.filled
            self.passes += 1
        elif isinstance(event, BlockEvent):
            self.committed += event.tokens
            self.block, self.filled = (), ()

    def text(self) -> Text:
        """Committed text (reasoning dimmed), then the block position by position."""
        out = Text()
        done = self.decode(self.committed)
        if self.reasoning and THINK_END in done:
            head, _, tail = done.partition(THINK_END)
            out.append(head + THINK_END, style="dim")
            out.append(tail)
        else:
            out.append(done, style="dim" if self.reasoning else "")
        for i, t in enumerate(self.block):
            if t == self.mask_token_id:
                out.append(MASK_GLYPH, style="bright_black")
            else:
                out.append(self.decode([t]), style="bold green" if i in self.filled else "cyan")
        return out

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        lines = self.text().wrap(console, options.max_width)
        height = max(1, (options.height or console.size.height) - 2)
        yield from lines[-height:]
