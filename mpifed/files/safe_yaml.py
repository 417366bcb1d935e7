"""YAML read with limits: a config, table or run file is small, so one that is not is refused
before it is built, not after it has taken the machine's memory.

PyYAML's safe loader runs no code, but aliases (``*name``) let a few lines stand for billions of
values (an "alias bomb"): each level repeats the one below. The limits are on the file's size and
on the number of values it holds once every alias is expanded (counted on the parsed node graph,
shared nodes counted once per use, without expanding anything).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

MAX_BYTES = 4 * 2**20      # a config with every key set is a few kilobytes; a table of all papers' rows, tens
MAX_VALUES = 200_000       # values once aliases are expanded
_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)   # libyaml's, where PyYAML has it: the same YAML, faster


class YamlTooLarge(yaml.YAMLError):
    """A YAML text beyond the size or expansion limit, or nested beyond Python's recursion limit."""


def load(text: str, source: str) -> Any:
    """The YAML ``text`` (from ``source``, for the message) as plain Python values, within the limits."""
    if len(text) > MAX_BYTES:
        raise YamlTooLarge(f"{source} holds {len(text) / 2**20:.1f} MiB of YAML, beyond mpifed's limit of "
                           f"{MAX_BYTES // 2**20} MiB for a config: it is not a config file (check the path)")
    loader = _LOADER(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        values = _expanded(node, {}, source)
        if values > MAX_VALUES:
            raise YamlTooLarge(f"{source} expands to {values:,} values once its aliases (*name) are repeated, beyond "
                               f"mpifed's limit of {MAX_VALUES:,}: a config never needs that many; write the values "
                               f"out, or use fewer levels of aliases")
        return loader.construct_document(node)
    except RecursionError:
        raise YamlTooLarge(f"{source} is nested too deeply to read (thousands of levels): it is not a config "
                           f"file") from None
    finally:
        loader.dispose()


def key_lines(text: str) -> dict[tuple[str, ...], int]:
    """The line (from 1) of each key of the YAML ``text`` (one :func:`load` has accepted), by its path
    of keys through nested mappings."""
    loader = _LOADER(text)
    try:
        node = loader.get_single_node()
    finally:
        loader.dispose()
    found: dict[tuple[str, ...], int] = {}

    def walk(node: yaml.Node, path: tuple[str, ...]) -> None:
        if isinstance(node, yaml.MappingNode):
            for key, value in node.value:
                if isinstance(key, yaml.ScalarNode):
                    found.setdefault((*path, key.value), key.start_mark.line + 1)
                    walk(value, (*path, key.value))

    if node is not None:
        walk(node, ())
    return found


def read(path: Path, source: str | None = None) -> Any:
    """The YAML file ``path`` (see :func:`load`); its size is checked before it is read."""
    check_size(path, source)
    return load(path.read_text(), source or str(path))


def check_size(path: Path, source: str | None = None) -> None:
    """Refuse a file beyond the size limit before reading it."""
    size = path.stat().st_size
    if size > MAX_BYTES:
        raise YamlTooLarge(f"{source or path} is {size / 2**20:.1f} MiB, beyond mpifed's limit of "
                           f"{MAX_BYTES // 2**20} MiB for a config: it is not a config file (check the path)")


def _expanded(node: yaml.Node, seen: dict[int, int], source: str) -> int:
    """How many values ``node`` stands for with every alias expanded (each shared node counted once)."""
    key = id(node)
    if key in seen:
        if seen[key] < 0:
            raise YamlTooLarge(f"{source}, line {node.start_mark.line + 1}: an alias (*name) refers to a node that "
                               f"holds it, a value without end: a config never needs one")
        return seen[key]
    seen[key] = -1
    if isinstance(node, yaml.MappingNode):
        total = 1 + sum(_expanded(k, seen, source) + _expanded(v, seen, source) for k, v in node.value)
    elif isinstance(node, yaml.SequenceNode):
        total = 1 + sum(_expanded(v, seen, source) for v in node.value)
    else:
        total = 1
    seen[key] = total
    return total
