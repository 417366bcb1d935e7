"""A config's YAML layers: a file read with its ``base:`` files under it, layers merged one over
another, where each key was set (for error messages), and a file's ``per_algorithm`` values."""
from __future__ import annotations

import copy
import functools
from pathlib import Path
from typing import Any

import yaml

from mpifed.files import safe_yaml
from mpifed.plugin.options import ConfigError
from mpifed.plugin.registry import ALGORITHMS, nearest
from mpifed.settings.config_plugins import plugin_specs
from mpifed.settings.schema import is_choice_path


def merge(base: dict[str, Any], over: dict[str, Any], path: tuple[str, ...] = ()) -> dict[str, Any]:
    """Deep-merge ``over`` into ``base``. A choice section whose name changes is replaced whole."""
    out = dict(base)
    for key, value in over.items():
        sub = path + (key,)
        if is_choice_path(sub) and isinstance(value, str):
            value = {"name": value}
        old = out.get(key)
        if is_choice_path(sub) and isinstance(old, str):
            old = {"name": old}
        if isinstance(value, dict) and isinstance(old, dict):
            if is_choice_path(sub) and "name" in value and value["name"] != old.get("name"):
                out[key] = dict(value)
            else:
                out[key] = merge(old, value, sub)
        else:
            out[key] = value
    return out


@functools.lru_cache(maxsize=512)
def _parse_yaml(text: str, source: str) -> Any:
    # keyed by the text, so a changed file is parsed again; a table reads its few files hundreds of times
    return safe_yaml.load(text, source)


def read_yaml(path: str | Path, _seen: tuple[Path, ...] = ()) -> dict[str, Any]:
    """Read a config file; a top-level ``base:`` (path relative to the file) is merged under it.
    ``plugins`` file paths are made absolute (relative to the file that names them), and the
    plugins of the bases and the file add up."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file {str(path)!r} does not exist (`mpifed config list` shows the configs shipped "
                          "with mpifed)")
    resolved = path.resolve()
    if resolved in _seen:
        raise ConfigError(f"config file {str(path)!r} includes itself through 'base:'")
    source = f"config file {str(path)!r}"
    try:
        data = copy.deepcopy(_parse_yaml(safe_yaml.read_text(path, source), source))
    except safe_yaml.YamlRefused as exc:
        raise ConfigError(str(exc)) from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"config file {str(path)!r} is not valid YAML: {exc}") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"config file {str(path)!r} must hold a mapping of sections (run, data, model, train, "
                          f"algorithm, ...), not {type(data).__name__}")
    own = plugin_specs(data.pop("plugins", None), f"config file {str(path)!r}", path.parent)
    bases = data.pop("base", None)
    if bases is None:
        return {**data, "plugins": own} if own else data
    merged: dict[str, Any] = {}
    inherited: list[str] = []
    for base in [bases] if isinstance(bases, str) else list(bases):
        layer = read_yaml(path.parent / base, _seen + (resolved,))
        inherited += layer.pop("plugins", [])
        merged = merge(merged, layer)
    merged = merge(merged, data)
    specs = list(dict.fromkeys(inherited + own))
    return {**merged, "plugins": specs} if specs else merged


def key_sources(path: str | Path, _seen: tuple[Path, ...] = ()) -> dict[str, str]:
    """Where each key of the config file ``path`` (one :func:`read_yaml` has read) is set, its bases'
    under its own: ``"train.lr"`` -> ``"configs/x.yaml, line 7"``."""
    path = Path(path)
    source = f"config file {str(path)!r}"
    text = safe_yaml.read_text(path, source)
    data = _parse_yaml(text, source)
    found: dict[str, str] = {}
    bases = data.get("base") if isinstance(data, dict) else None
    for base in [bases] if isinstance(bases, str) else list(bases or []):
        if (path.parent / base).resolve() not in _seen:
            found.update(key_sources(path.parent / base, _seen + (path.resolve(),)))
    for keys, line in _key_lines(text).items():
        if keys[0] not in ("base", "plugins"):
            found[".".join(map(str, keys))] = f"{path}, line {line}"
    return found


@functools.lru_cache(maxsize=512)
def _key_lines(text: str) -> dict[tuple[str, ...], int]:
    return safe_yaml.key_lines(text)


PER_ALGORITHM = "per_algorithm"


def per_algorithm(layer: dict[str, Any], source: str) -> dict[str, Any]:
    """Pop and check a file's ``per_algorithm`` section: algorithm name -> config values."""
    section = layer.pop(PER_ALGORITHM, None) or {}
    if not isinstance(section, dict) or not all(isinstance(v, dict) for v in section.values()):
        raise ConfigError(f"{source}: '{PER_ALGORITHM}' must map algorithm names to config values, "
                          f"e.g. per_algorithm: {{fedprox: {{algorithm: {{mu: 0.001}}}}}}")
    known = ALGORITHMS.names()
    for name in section:
        if name not in known:
            close = nearest(name, known)
            hint = f" Did you mean '{close}'?" if close else ""
            raise ConfigError(f"{source}: {PER_ALGORITHM}.{name}: unknown algorithm.{hint} Known: "
                              f"{', '.join(sorted(known))}")
    return section
