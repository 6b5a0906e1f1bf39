"""Typed reading of the checkpoint's JSON files: every field is checked for its type on the way in.

A wrong type (`hidden_size: "abc"`, `text_config` a string, a list where an object belongs, a file
that is not UTF-8) becomes one `ConfigError` line naming the file and the field, never a Python
exception from deep inside the converter. Ranges are checked later, on the parsed values
(`hparam_limits`).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

_MISSING: Any = object()


class ConfigError(ValueError):
    """A checkpoint's configuration is missing, malformed or not a Clover model."""


def read_object(path: Path) -> dict[str, Any]:
    """A JSON file whose top level must be an object."""
    try:
        value = json.loads(path.read_bytes().decode("utf-8"))
    except OSError as e:
        raise ConfigError(f"{path}: cannot read ({e.strerror})") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{path.name}: not UTF-8 text") from None
    except (json.JSONDecodeError, RecursionError) as e:
        raise ConfigError(f"{path.name}: not valid JSON (line {getattr(e, 'lineno', '?')})") from None
    if not isinstance(value, dict):
        raise ConfigError(f"{path.name}: expected a JSON object, found {_kind(value)}")
    return value


def get_int(d: dict[str, Any], key: str, source: str, default: Any = _MISSING) -> int:
    v = _get(d, key, source, default)
    if v is default and default is not _MISSING:
        return v
    if isinstance(v, bool) or not isinstance(v, int | float) or not float(v).is_integer():
        raise ConfigError(f"{source}: {key} must be an integer, found {_kind(v)}")
    return int(v)


def get_opt_int(d: dict[str, Any], key: str, source: str) -> int | None:
    return None if d.get(key) is None else get_int(d, key, source)


def get_float(d: dict[str, Any], key: str, source: str, default: Any = _MISSING) -> float:
    v = _get(d, key, source, default)
    if v is default and default is not _MISSING:
        return v
    if isinstance(v, bool) or not isinstance(v, int | float) or math.isinf(v) or math.isnan(v):
        raise ConfigError(f"{source}: {key} must be a finite number, found {_kind(v)}")
    return float(v)


def get_bool(d: dict[str, Any], key: str, source: str, default: Any = _MISSING) -> bool:
    v = _get(d, key, source, default)
    if not isinstance(v, bool):
        raise ConfigError(f"{source}: {key} must be true or false, found {_kind(v)}")
    return v


def get_object(d: dict[str, Any], key: str, source: str) -> dict[str, Any]:
    """A nested object (absent or null: empty)."""
    v = d.get(key)
    if v is None:
        return {}
    if not isinstance(v, dict):
        raise ConfigError(f"{source}: {key} must be an object, found {_kind(v)}")
    return v


def get_list(d: dict[str, Any], key: str, source: str, item: type, default: Any = _MISSING) -> list[Any]:
    v = _get(d, key, source, default)
    if v is default and default is not _MISSING:
        return v
    ok = isinstance(v, list) and all(isinstance(x, item) and not isinstance(x, bool) for x in v)
    if not ok:
        raise ConfigError(f"{source}: {key} must be a list of {item.__name__}, found {_kind(v)}")
    return v


def coerce(value: Any, like: Any, key: str, source: str) -> Any:
    """`value` as the type of the default `like` (int, float or bool), checked."""
    d = {key: value}
    if isinstance(like, bool):
        return get_bool(d, key, source)
    if isinstance(like, int):
        return get_int(d, key, source)
    return get_float(d, key, source)


def _get(d: dict[str, Any], key: str, source: str, default: Any) -> Any:
    if key in d and d[key] is not None:
        return d[key]
    if default is _MISSING:
        raise ConfigError(f"{source} lacks the key {key!r}")
    return default


def _kind(v: Any) -> str:
    """What a JSON value is, for messages: its type, and a number's value (never a string's text)."""
    if isinstance(v, bool) or v is None:
        return json.dumps(v)
    if isinstance(v, int | float):
        return repr(v)
    return {str: "a string", list: "a list", dict: "an object"}.get(type(v), type(v).__name__)
