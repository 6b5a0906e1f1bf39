"""One thread runs the requests, in arrival order, from a bounded queue.

A `Clover` decodes one request at a time and every pass is compute-bound, so requests wait their
turn rather than share passes; a full queue refuses at once (the server answers 429) instead of
letting waits grow without bound. A request's results travel to its HTTP handler through an
asyncio queue; a handler whose client went away cancels its job, and the decode-event callback
raises at the next pass, so a disconnected client costs at most one more pass.
"""

from __future__ import annotations

import asyncio
import queue
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from ..api import AnyEvent, Clover, appended
from ..loops import BlockEvent, PassEvent, Result

# What a job's start function returns: a whole result (dict) or a stream of chunks.
Started = dict[str, Any] | Iterator[dict[str, Any]]
StartFn = Callable[[Callable[[AnyEvent], None]], Started]


class QueueFull(Exception):
    """The queue holds as many waiting requests as allowed."""


class Cancelled(Exception):
    """Raised inside the decode loop once a job's client has gone."""


class ShuttingDown(Exception):
    """What a job still waiting when the server stops is told."""


@dataclass
class Message:
    """What the worker tells a handler. kind: `started` (request accepted; a stream follows),
    `chunk`, `pass` (a denoise view), `result`, `error`, `done`."""

    kind: str
    payload: Any = None


@dataclass
class Job:
    """One request: how to start it on the model, and the channel back to its handler."""

    start: StartFn
    mode: str | None
    denoise: bool
    loop: asyncio.AbstractEventLoop
    out: asyncio.Queue[Message] = field(default_factory=asyncio.Queue)
    cancelled: threading.Event = field(default_factory=threading.Event)

    def send(self, kind: str, payload: Any = None) -> None:
        self.loop.call_soon_threadsafe(self.out.put_nowait, Message(kind, payload))

    def cancel(self) -> None:
        self.cancelled.set()


@dataclass
class Counters:
    """Totals since the server started (shown by `/health`)."""

    completed: int = 0
    failed: int = 0
    cancelled: int = 0
    rejected: int = 0


class Worker:
    """Runs jobs on one `Clover` in a background thread, at most `max_queued` waiting."""

    def __init__(self, clover: Clover, max_queued: int):
        self.clover, self.max_queued = clover, max_queued
        self.modes = allowed_modes(clover.mode)
        self.counters = Counters()
        self.busy = False
        self._jobs: queue.Queue[Job | None] = queue.Queue()
        self._lock = threading.Lock()
        self._waiting = 0
        self._thread = threading.Thread(target=self._loop, name="clover-worker", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Finish the running job's current pass, drop the waiting ones, and join the thread."""
        with self._lock:
            while not self._jobs.empty():
                job = self._jobs.get_nowait()
                if job is not None:
                    job.cancel()
                    job.send("error", ShuttingDown("the server is shutting down; retry later"))
        self._jobs.put(None)
        self._thread.join()

    @property
    def waiting(self) -> int:
        return self._waiting

    def submit(self, job: Job) -> None:
        """Queue a job, or raise `QueueFull`."""
        with self._lock:
            if self._waiting >= self.max_queued:
                self.counters.rejected += 1
                raise QueueFull(f"the server is busy: {self._waiting} requests are waiting; retry later")
            self._waiting += 1
            self._jobs.put(job)

    def _loop(self) -> None:
        while (job := self._jobs.get()) is not None:
            with self._lock:
                self._waiting -= 1
            if job.cancelled.is_set():
                self.counters.cancelled += 1
                continue
            self.busy = True
            try:
                self._run(job)
            finally:
                self.busy = False

    def _run(self, job: Job) -> None:
        view = DenoiseView(self.clover) if job.denoise else None

        def on_event(event: AnyEvent) -> None:
            if job.cancelled.is_set():
                raise Cancelled
            if view is not None:
                job.send("pass", view.update(event))

        mode = self.clover.mode
        try:
            self.clover.mode = job.mode or mode  # the per-request mode; `allowed_modes` checked it
            started = job.start(on_event)
            if isinstance(started, dict):
                job.send("result", started)
            else:
                job.send("started")
                for chunk in started:
                    if job.cancelled.is_set():
                        raise Cancelled
                    job.send("chunk", chunk)
            job.send("done")
            self.counters.completed += 1
        except Cancelled:
            self.counters.cancelled += 1
            job.send("done")
        except Exception as e:  # the handler turns it into an error object; the worker keeps going
            self.counters.failed += 1
            job.send("error", e)
        finally:
            self.clover.mode = mode


def allowed_modes(mode: str) -> tuple[str, ...]:
    """Modes a request may ask for: ar runs on every engine and diffusion on any file with its
    tensors (the server's mode is not ar then); speculative needs the snapshots it loads with."""
    return {"ar": ("ar",), "diffusion": ("diffusion", "ar")}.get(mode, ("diffusion", "ar", "speculative"))


class DenoiseView:
    """The page's live view of decoding: the current block position by position after each pass
    (a string per resolved position, null where still masked), or the tokens a commit appended."""

    def __init__(self, clover: Clover):
        self.clover = clover
        self.tokens = 0

    def update(self, event: AnyEvent) -> dict[str, Any]:
        def text(ids: tuple[int, ...] | list[int]) -> str:
            return self.clover.tokenizer.decode(ids, skip_special_tokens=True)

        if isinstance(event, PassEvent):
            mask = self.clover.mask_token_id
            return {
                "type": "pass",
                "block": event.block,
                "pass": event.pass_index,
                "filled": list(event.filled),
                "tokens": [None if t == mask else text([t]) for t in event.tokens],
            }
        if isinstance(event, Result):
            return {"type": "end", "tokens": self.tokens}
        new = appended(event)
        self.tokens += len(new)
        kind = "commit" if isinstance(event, BlockEvent) else "step"
        return {"type": kind, "tokens": self.tokens, "text": text(new)}
