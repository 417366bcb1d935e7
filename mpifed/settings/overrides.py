"""The command line's ``--set key.path=value`` overrides, read into a layer of the config."""
from __future__ import annotations

import types
import typing
from typing import Any, Union

import yaml

from mpifed.files import safe_yaml
from mpifed.plugin.options import ConfigError
from mpifed.settings.schema import key_type


def _is_string_key(path: tuple[str, ...], data: dict[str, Any]) -> bool:
    """Whether the config key at ``path`` holds text (so ``run.name=off`` stays the string 'off')."""
    cls = key_type(path, data)
    args = typing.get_args(cls) if typing.get_origin(cls) in (Union, types.UnionType) else (cls,)
    return str in args


def parse_override(text: str, data: dict[str, Any] | None = None) -> dict[str, Any]:
    """``a.b.c=value`` to a nested dict: the value read as YAML, or kept as typed when the key
    holds text (in the config ``data`` being built)."""
    if "=" not in text:
        raise ConfigError(f"override {text!r} must look like key.path=value, e.g. train.rounds=5")
    key, raw = text.split("=", 1)
    key = key.strip()
    if not key or any(not part for part in key.split(".")):
        raise ConfigError(f"override {text!r}: the key {key!r} is not a dotted path like train.rounds")
    parts = key.split(".")
    if data is not None and raw.strip() and _is_string_key(tuple(parts), data):
        value: Any = raw
    else:
        try:
            value = safe_yaml.load(raw, f"override {text!r}") if raw.strip() else None
        except safe_yaml.YamlRefused as exc:
            raise ConfigError(str(exc)) from None
        except yaml.YAMLError as exc:
            raise ConfigError(f"override {text!r}: the value is not valid YAML ({exc})") from None
    node: dict[str, Any] = {}
    cur = node
    for part in parts[:-1]:
        cur[part] = {}
        cur = cur[part]
    cur[parts[-1]] = value
    return node
