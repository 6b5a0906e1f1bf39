"""A jinja2 sandbox with bounds, for chat templates that come with a model file.

jinja2's sandbox blocks attribute escapes (`__class__`, `__globals__`) but not work: three nested
`range(100000)` loops run for days and `'a' * 10**10` asks for 10 GB. Here a render has a time
limit (a trace function on the template's own frames, so loops are interrupted between
iterations), an output-size limit, and no argument or product that would build a larger value;
`{% include %}`, `{% import %}` and `{% extends %}` find no loader. Every failure is a
`TemplateError` with a one-line message.
"""

from __future__ import annotations

import functools
import math
import re
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from jinja2 import BaseLoader
from jinja2.exceptions import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment

RENDER_SECONDS = 5.0
MAX_CHARS = 32 << 20  # far beyond a prompt that fits the 131072-token context
_WIDE_FORMAT = re.compile(r"%[-+ #0]*\d{7,}|\{[^}]*:[^}]*\d{7,}")


class TemplateLimitError(TemplateError):
    """The template would take too long or build too large a value."""


class _NoLoader(BaseLoader):
    def get_source(self, environment: Any, template: str) -> Any:
        raise TemplateError("a chat template cannot include, import or extend other templates")


class BoundedSandbox(ImmutableSandboxedEnvironment):
    """`ImmutableSandboxedEnvironment` whose values cannot outgrow `MAX_CHARS`."""

    intercepted_binops = frozenset(["*", "**", "%"])

    def __init__(self, **kw: Any):
        super().__init__(loader=_NoLoader(), **kw)
        self.filters = {name: bounded_filter(f) for name, f in self.filters.items()}

    def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
        if operator == "*" and _size(left) * _count(right) + _size(right) * _count(left) > MAX_CHARS:
            raise TemplateLimitError(f"a value of more than {MAX_CHARS} characters")
        if operator == "**" and _power_bits(left, right) > 4096:
            raise TemplateLimitError("a number of more than 4096 bits")
        if operator == "%" and isinstance(left, str) and _WIDE_FORMAT.search(left):
            raise TemplateLimitError(f"a format width of more than {MAX_CHARS} characters")
        return super().call_binop(context, operator, left, right)

    def call(self, __context: Any, __obj: Any, *args: Any, **kwargs: Any) -> Any:
        _check_args(args, kwargs, __obj)
        return super().call(__context, __obj, *args, **kwargs)


def render(env: BoundedSandbox, source: str, **context: Any) -> str:
    """Render `source` within `RENDER_SECONDS` and `MAX_CHARS`."""
    out: list[str] = []
    n = 0
    with _deadline(time.monotonic() + RENDER_SECONDS):
        for chunk in env.from_string(source).generate(**context):
            n += len(chunk)
            if n > MAX_CHARS:
                raise TemplateLimitError(f"the rendered prompt exceeds {MAX_CHARS} characters")
            out.append(chunk)
    return "".join(out)


@contextmanager
def _deadline(deadline: float) -> Iterator[None]:
    """Trace the template's frames (this thread only) and stop them past `deadline`."""

    def local(frame: Any, event: str, arg: Any) -> Any:
        if time.monotonic() > deadline:
            raise TemplateLimitError(f"rendering took more than {RENDER_SECONDS:g} s")
        return local

    def calls(frame: Any, event: str, arg: Any) -> Any:
        return local if frame.f_code.co_filename == "<template>" else None

    previous = sys.gettrace()
    sys.settrace(calls)
    try:
        yield
    finally:
        sys.settrace(previous)


def bounded_filter(f: Callable[..., Any]) -> Callable[..., Any]:
    """A filter whose arguments are checked first (`center(10**9)`, `replace` growth)."""

    @functools.wraps(f)  # keeps jinja's pass-context marks
    def run(*args: Any, **kwargs: Any) -> Any:
        _check_args(args, kwargs, f)
        return f(*args, **kwargs)

    return run


def _check_args(args: tuple[Any, ...], kwargs: dict[str, Any], target: Any) -> None:
    values = (*args, *kwargs.values())
    if any(isinstance(v, int) and not isinstance(v, bool) and abs(v) > MAX_CHARS for v in values):
        raise TemplateLimitError(f"an argument larger than {MAX_CHARS}")
    if getattr(target, "__name__", "").endswith("replace"):  # str.replace or the replace filter
        owner = getattr(target, "__self__", None)
        strs = [v for v in ((owner,) if isinstance(owner, str) else ()) + values if isinstance(v, str)]
        if len(strs) >= 3:
            text, old, new = strs[-3:]
            if len(text) + (len(text) + 1) // max(len(old), 1) * len(new) > MAX_CHARS:
                raise TemplateLimitError(f"a value of more than {MAX_CHARS} characters")


def _size(v: Any) -> int:
    return len(v) if isinstance(v, str | list | tuple) else 0


def _count(v: Any) -> int:
    return abs(v) if isinstance(v, int) and not isinstance(v, bool) else 0


def _power_bits(base: Any, exp: Any) -> float:
    if not isinstance(base, int) or not isinstance(exp, int) or exp <= 0 or abs(base) < 2:
        return 0.0
    return exp * math.log2(abs(base))
