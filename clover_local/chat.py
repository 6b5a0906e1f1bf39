"""`clover chat`: a multi-turn conversation in the terminal, streamed as blocks resolve.

Reasoning is shown dimmed; `/think on|off` switches the template's thinking mode. Each turn runs
only what the model does not hold yet (`prompt_cache`); when the history outgrows the context, the
oldest turns are dropped (the system prompt stays) with a one-line notice. Ctrl-C stops
the answer being written (the turn is dropped, the conversation stays as it was), Ctrl-D at the
prompt exits. A line ending in `\\` continues on the next one; `\"\"\"` opens and closes a block of
lines. `/save` and `/load` keep conversations as JSON: `{"thinking": bool, "messages": [...]}`.
"""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape

from . import limits
from .api import Clover
from .model.decoding_parameters import PARAMETERS
from .policy import RequestTooLong
from .visual import BlockView

try:
    import readline  # line editing and history for input()

    # a pasted block arrives as one message, newlines included, whatever the user's inputrc says
    readline.parse_and_bind("set enable-bracketed-paste on")
except ImportError:  # not on every platform
    pass

PROMPT, MORE = ">>> ", "... "
FENCE = '"""'
HELP = """\
/help               this help
/think [on|off]     thinking mode (reasoning shown dimmed); alone: switch it
/system TEXT        set the system prompt (and start over)
/reset              forget the conversation (keeps the system prompt)
/set NAME VALUE     a decoding option: max_tokens, threshold, block_size, coreset on|off, temperature, ...
/save [FILE]        save the conversation as JSON (default: clover-chat-DATE.json)
/load FILE          load a conversation saved with /save
/exit               quit (or Ctrl-D)
End a line with \\ to continue it; \"\"\" opens and closes a block of lines.
Ctrl-C stops an answer."""


def on_off(text: str) -> bool:
    """A switch's value as `/set` takes it: on / off (or true / false, 1 / 0)."""
    value = {"on": True, "true": True, "1": True, "off": False, "false": False, "0": False}.get(text.lower())
    if value is None:
        raise ValueError(text)
    return value


# `/set NAME VALUE`: the decoding parameters a request may change (their table), and the sampling;
# each name's parser
SETTABLE: dict[str, Callable[[str], Any]] = {
    **{p.request: on_off if p.type is bool else p.type for p in PARAMETERS if p.request is not None},
    "temperature": float,
    "seed": int,
}


class ChatSession:
    """The conversation state and the terminal loop around `Clover.create_chat_completion`."""

    def __init__(
        self,
        clover: Clover,
        console: Console,
        system: str | None = None,
        thinking: bool = True,
        visual: bool = False,
        **request: Any,
    ):
        self.clover, self.console, self.visual = clover, console, visual
        self.thinking, self.request = thinking, request
        self.messages: list[dict[str, Any]] = []
        self.system = system
        self._field: str | None = None  # the field the last printed delta belonged to
        self.reset()

    # -- conversation -----------------------------------------------------------------------------

    def reset(self) -> None:
        self.messages = [{"role": "system", "content": self.system}] if self.system else []

    def save(self, path: Path) -> None:
        path.write_text(json.dumps({"thinking": self.thinking, "messages": self.messages}, indent=2) + "\n")

    def load(self, path: Path) -> None:
        data = json.loads(path.read_text(encoding="utf-8"))
        messages = data["messages"] if isinstance(data, dict) else data
        if not isinstance(messages, list) or not all(
            isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
            for m in messages
        ):
            raise ValueError(f"{path}: expected a list of messages with role and content")
        self.messages = messages
        self.thinking = bool(data.get("thinking", self.thinking)) if isinstance(data, dict) else self.thinking
        self.system = messages[0]["content"] if messages and messages[0]["role"] == "system" else None

    # -- terminal loop ----------------------------------------------------------------------------

    def run(self) -> None:
        # Ctrl-C stops an answer. A process started in the background of a non-interactive shell
        # inherits SIGINT ignored, and Python then never raises KeyboardInterrupt: take it back.
        signal.signal(signal.SIGINT, signal.default_int_handler)
        self.note("Clover chat: /help for commands, Ctrl-D to quit")
        while True:
            try:
                text = self.read_message()
            except EOFError:
                self.console.print()
                return
            except KeyboardInterrupt:
                self.console.print()
                self.note("Use Ctrl-D or /exit to quit.")
                continue
            if not text.strip():
                continue
            if text.startswith("/"):
                if not self.command(text.strip()):
                    return
                continue
            self.ask(text)

    def read_message(self) -> str:
        """One message: a line, lines joined by trailing backslashes, or a \"\"\" block."""
        line = input(PROMPT)
        if line.strip() == FENCE or (line.startswith(FENCE) and not line.rstrip().endswith(FENCE)):
            lines = [line.strip()[len(FENCE) :]] if line.strip() != FENCE else []
            while True:
                nxt = input(MORE)
                if nxt.rstrip().endswith(FENCE):
                    lines.append(nxt.rstrip()[: -len(FENCE)])
                    return "\n".join(lines).strip("\n")
                lines.append(nxt)
        lines = []
        while line.endswith("\\"):
            lines.append(line[:-1])
            line = input(MORE)
        return "\n".join([*lines, line])

    def command(self, line: str) -> bool:
        """Run a slash command; False means quit."""
        name, _, arg = line.partition(" ")
        arg = arg.strip()
        if name in ("/exit", "/quit", "/bye"):
            return False
        if name == "/help":
            self.console.print(HELP, markup=False, highlight=False)
        elif name == "/think" and arg in ("on", "off", ""):
            self.thinking = arg == "on" if arg else not self.thinking
            self.note(f"thinking {'on' if self.thinking else 'off'}")
        elif name == "/system" and arg:
            self.system = arg
            self.reset()
            self.note("system prompt set; conversation reset")
        elif name == "/reset":
            self.reset()
            self.note("conversation reset")
        elif name == "/set":
            self.set_option(arg)
        elif name == "/load" and not arg:
            self.error("/load needs a file: /load FILE")
        elif name in ("/save", "/load"):
            arg = arg or time.strftime("clover-chat-%Y%m%d-%H%M%S.json")
            try:
                (self.save if name == "/save" else self.load)(Path(arg).expanduser())
            except OSError as e:
                self.error(f"{arg}: {e.strerror or e}")
                return True
            except (ValueError, KeyError) as e:
                self.error(f"{arg}: not a saved conversation ({e})")
                return True
            turns = sum(m["role"] == "user" for m in self.messages)
            self.note(f"{'saved' if name == '/save' else 'loaded'} {turns} turns: {arg}")
        else:
            self.error(f"unknown command {line!r}; /help lists them")
        return True

    def set_option(self, arg: str) -> None:
        """`/set NAME VALUE` for a request option (a number, or on / off); `/set` alone lists them."""
        key, _, value = arg.partition(" ")
        if not key:
            self.note(
                ", ".join(f"{k}={v}" for k, v in sorted(self.request.items()) if k != "stop") or "defaults"
            )
            return
        if key not in SETTABLE:
            self.error(f"/set knows {', '.join(SETTABLE)}")
            return
        try:
            number = SETTABLE[key](value)
            limits.check(key, number)
        except limits.OptionError as e:
            self.error(f"/set {e}")
            return
        except ValueError:
            kind = "on or off" if SETTABLE[key] is on_off else "a number"
            self.error(f"/set {key}: {value!r} is not {kind}")
            return
        self.request[key] = number
        self.note(f"{key} = {self.request[key]}")

    def note(self, text: str) -> None:
        self.console.print(text, style="dim", markup=False, highlight=False)

    def error(self, text: str) -> None:
        self.console.print(f"[red]error:[/red] {escape(text)}", highlight=False)

    def ask(self, text: str) -> None:
        """Stream the answer to `text`; on Ctrl-C drop the turn and keep the conversation as it was."""
        messages = [*self.messages, {"role": "user", "content": text}]
        view = BlockView(self.clover._text, self.clover.mask_token_id, self.console, self.thinking)
        dropped = 0
        while True:
            try:
                stream = self.clover.create_chat_completion(
                    messages,
                    stream=True,
                    thinking=self.thinking,
                    on_event=view.update if self.visual else None,
                    **self.request,
                )
                break
            except RequestTooLong as e:  # the history overflows: drop the oldest turn, keep the system
                first = 1 if messages[0]["role"] == "system" else 0
                turn_end = next(
                    (i for i in range(first + 1, len(messages)) if messages[i]["role"] == "user"), None
                )
                if turn_end is None:  # the new message alone does not fit
                    self.error(str(e))
                    return
                messages = [*messages[:first], *messages[turn_end:]]
                dropped += 1
            except ValueError as e:  # bad option values: say so, keep going
                self.error(str(e))
                return
        if dropped:
            self.note(f"(context full: dropped the {dropped} oldest turn{'s' if dropped > 1 else ''})")
        self._field = None
        try:
            if self.visual:
                with view:
                    answer, final = drain(stream)
                self._show(answer)
            else:
                answer, final = drain(stream, self._print_delta)
        except KeyboardInterrupt:
            stream.close()
            self.console.print("\n(stopped)", style="yellow", highlight=False)
            return
        self.console.print()
        reply = {"role": "assistant", "content": answer["content"]}
        if answer["reasoning_content"]:
            reply["reasoning_content"] = answer["reasoning_content"]
        self.messages = [*messages, reply]
        self.console.print(_stats_line(final), style="dim", highlight=False)

    def _print_delta(self, name: str, delta: str) -> None:
        if self._field not in (None, name):  # reasoning done: the answer starts on a new line
            self.console.print()
        self._field = name
        style = "dim" if name == "reasoning_content" else None
        self.console.print(delta, end="", style=style, markup=False, highlight=False, soft_wrap=True)

    def _show(self, answer: dict[str, str]) -> None:
        if answer["reasoning_content"]:
            self.console.print(answer["reasoning_content"], style="dim", markup=False, highlight=False)
        self.console.print(answer["content"], end="", markup=False, highlight=False, soft_wrap=True)


def drain(
    stream: Iterator[dict[str, Any]], on_delta: Callable[[str, str], None] | None = None
) -> tuple[dict[str, str], dict[str, Any]]:
    """Read a completion or chat stream to its end: the text per field, and the last chunk
    (finish reason, usage, statistics). `on_delta(field, text)` sees each piece as it comes."""
    fields, last = {"content": "", "reasoning_content": ""}, {}
    for chunk in stream:
        choice = chunk["choices"][0]
        for name, delta in (choice["delta"] if "delta" in choice else {"content": choice["text"]}).items():
            if name in fields and delta:
                fields[name] += delta
                if on_delta is not None:
                    on_delta(name, delta)
        last = chunk
    return fields, last


def _stats_line(final: dict[str, Any]) -> str:
    st, usage = final.get("clover", {}), final.get("usage", {})
    n = usage.get("completion_tokens", 0)
    parts = [f"{n} tokens", f"{st.get('passes', 0)} passes"]
    if st.get("mode") == "diffusion":
        parts.append(f"{st.get('mean_tokens_per_pass', 0):.2f} tokens/pass")
    parts.append(f"{st.get('generation_tokens_per_s', 0):.1f} tok/s")
    return "[" + ", ".join(parts) + "]"
