"""YAML read with limits: a config, table or run file is small, so one that is not is refused
before it is built, not after it has taken the machine's memory; a key set twice in one mapping,
which YAML would silently keep only the last of, is refused naming both lines; a file that is not
UTF-8 is refused naming it.

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


class YamlRefused(yaml.YAMLError):
    """A YAML text mpifed does not read; the message names its source and the fix."""


class YamlTooLarge(YamlRefused):
    """A YAML text beyond the size or expansion limit, or nested beyond Python's recursion limit."""


class DuplicateKey(YamlRefused):
    """A mapping that sets one key twice (YAML would keep the last value and drop the first)."""


class NotUtf8(YamlRefused):
    """A YAML file whose bytes are not UTF-8."""


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
        _refuse_duplicates(loader, node, (), set(), source)
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
    return load(read_text(path, source), source or str(path))


def read_text(path: Path, source: str | None = None) -> str:
    """The text of the YAML file ``path``, within the size limit and decoded as UTF-8 (:class:`NotUtf8` otherwise)."""
    check_size(path, source)
    return decode(path.read_bytes(), source or str(path))


def decode(data: bytes, source: str) -> str:
    """``data`` (a YAML file's bytes, from ``source``) as text: UTF-8, or :class:`NotUtf8` naming the first bad byte."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        if data.startswith((b"\xff\xfe", b"\xfe\xff")):
            found = "is UTF-16 text (it starts with a UTF-16 byte-order mark)"
            convert = "iconv -f UTF-16 -t UTF-8"
        else:
            line = data.count(b"\n", 0, exc.start) + 1
            found = (f"is not UTF-8 text (line {line} holds the byte 0x{data[exc.start]:02x}, as Latin-1 or "
                     f"Windows-1252 text does)")
            convert = "iconv -f LATIN1 -t UTF-8"
        raise NotUtf8(f"{source} {found}: mpifed reads YAML files as UTF-8 only; save it as UTF-8 (in an editor, or "
                      f"with {convert} old.yaml > new.yaml)") from None


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


def _refuse_duplicates(loader: Any, node: yaml.Node, path: tuple[str, ...], seen: set[int], source: str) -> None:
    """Raise :class:`DuplicateKey` for the first mapping under ``node`` that sets a key twice. Keys compare
    as the values they are built into (``1`` and ``1.0``, ``true`` and ``1`` are one key of a Python
    dict); the keys a merge (``<<: *base``) brings in may be set again, as YAML's merge intends."""
    if id(node) in seen:
        return
    seen.add(id(node))
    if isinstance(node, yaml.SequenceNode):
        for item in node.value:
            _refuse_duplicates(loader, item, path, seen, source)
    if not isinstance(node, yaml.MappingNode):
        return
    first: dict[Any, yaml.Node] = {}
    for key, value in node.value:
        if isinstance(key, yaml.ScalarNode) and key.tag != "tag:yaml.org,2002:merge":
            built = loader.construct_object(key)
            if built in first:
                raise DuplicateKey(f"{source}: the key {'.'.join((*path, key.value))!r} is set twice, "
                                   f"{_where(first[built], key)}; YAML keeps only the last, dropping the first "
                                   f"without a word: remove one of them, or merge the two into one")
            first[built] = key
        _refuse_duplicates(loader, value, (*path, str(key.value)), seen, source)


def _where(first: yaml.Node, second: yaml.Node) -> str:
    """``on lines 3 and 9``; ``on line 1 (columns 2 and 11)`` for two keys on one line (a flow mapping)."""
    a, b = first.start_mark, second.start_mark
    if a.line == b.line:
        return f"on line {a.line + 1} (columns {a.column + 1} and {b.column + 1})"
    return f"on lines {a.line + 1} and {b.line + 1}"
