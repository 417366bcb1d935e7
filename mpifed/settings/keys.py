"""Dotted keys (``train.lr``) of a config as a plain dict: joining, looking up, setting, comparing."""
from __future__ import annotations

from typing import Any


def dotted(path: str, key: str) -> str:
    """``key`` under the dotted ``path`` (``key`` itself at the top)."""
    return f"{path}.{key}" if path else key


def lookup(d: Any, key: str) -> Any:
    """The value at the dotted ``key`` of a nested dict (None where absent)."""
    for part in key.split("."):
        if not isinstance(d, dict):
            return None
        d = d.get(part)
    return d


def holds(d: Any, key: str) -> bool:
    """Whether the nested dict ``d`` has the dotted ``key`` (with any value, None included)."""
    for part in key.split("."):
        if not isinstance(d, dict) or part not in d:
            return False
        d = d[part]
    return True


def put(d: dict[str, Any], key: str, value: Any) -> None:
    """Set the dotted ``key`` of the nested dict ``d`` to ``value``, making the dicts on the way."""
    *parents, last = key.split(".")
    for part in parents:
        d = d.setdefault(part, {})
    d[last] = value


def diff_keys(a: Any, b: Any, path: str = "") -> list[str]:
    """Dotted keys whose values differ between two config dicts."""
    if isinstance(a, dict) and isinstance(b, dict):
        keys = sorted(set(a) | set(b))
        return [k for key in keys for k in diff_keys(a.get(key), b.get(key), dotted(path, key))]
    return [] if a == b else [path or "<top>"]
