"""`--visual`: the block being denoised, in place: mask glyphs turning into text pass by pass.

`BlockView` consumes the decode events (`on_event`) and draws, in a transient rich `Live`, the
response so far followed by the current block: resolved positions as their text, masked ones as
a glyph, the positions this pass filled highlighted. It redraws after every event (not on a
timer), so every pass is seen however fast it runs. Only the last lines that fit are drawn.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from rich.console import Console, ConsoleOptions, RenderResult
from rich.live import Live
from rich.text import Text

from .api import AnyEvent, appended
from .loops import BlockEvent, PassEvent
from .model.tokenizer import THINK_END

MASK_GLYPH = "░"


class BlockView:
    """A response under block diffusion (or AR: the text alone), live while used as a context."""

    def __init__(
        self,
        decode: Callable[[Sequence[int]], str],
        mask_token_id: int,
        console: Console,
        reasoning: bool = False,
    ):
        self.decode, self.mask_token_id, self.reasoning = decode, mask_token_id, reasoning
        self.live = Live(self, console=console, auto_refresh=False, transient=True)
        self.committed: list[int] = []
        self.block: tuple[int, ...] = ()
        self.filled: tuple[int, ...] = ()

    def __enter__(self) -> BlockView:
        self.live.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.live.stop()

    def update(self, event: AnyEvent) -> None:
        """`on_event`: take the event in and redraw."""
        if isinstance(event, PassEvent):
            self.block, self.filled = event.tokens, event.filled
        elif isinstance(event, BlockEvent):
            self.committed += event.tokens
            self.block, self.filled = (), ()
        else:
            self.committed += appended(event)
        self.live.refresh()

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
