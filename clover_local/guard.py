"""One call at a time on a `Clover`, and none after `close()`.

A llama.cpp context is not thread-safe: two threads decoding on one abort
(`GGML_ASSERT(i01 >= 0 && i01 < ne01)`), segfault or hang, and any call on a freed model aborts the
process. A `Guard` serializes the calls with a re-entrant lock: a non-streaming request holds it
to its end, a stream takes it for each step (so it may be consumed from any thread), and a second
stream started while one is open ends the first with the documented RuntimeError. After `close`,
every guarded call raises `ClosedError`.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

T = TypeVar("T")
F = TypeVar("F", bound=Callable[..., Any])


class ClosedError(ValueError):
    """The model was closed (like the ValueError of a closed file)."""


class Guard:
    def __init__(self, what: str):
        self.what = what
        self.closed = False
        self._lock = threading.RLock()

    def __enter__(self) -> None:
        self._lock.acquire()
        if self.closed:
            self._lock.release()
            raise ClosedError(f"{self.what} is closed")

    def __exit__(self, *exc: object) -> None:
        self._lock.release()

    def close(self) -> bool:
        """Mark closed once the current call ends; True the first time."""
        with self._lock:
            first, self.closed = not self.closed, True
            return first

    def steps(self, events: Iterator[T]) -> Iterator[T]:
        """`events`, each one produced under the lock."""
        try:
            while True:
                with self:
                    try:
                        item = next(events)
                    except StopIteration:
                        return
                yield item
        finally:
            close = getattr(events, "close", None)
            if close is not None:
                close()


def serialized(method: F) -> F:
    """Run a method of an object with a `_guard` under that guard."""

    @functools.wraps(method)
    def run(self: Any, *args: Any, **kwargs: Any) -> Any:
        with self._guard:
            return method(self, *args, **kwargs)

    return run  # type: ignore[return-value]
