"""The files of a run directory, read and appended without following a symbolic link.

A run directory is exchanged between colleagues, archived for a repository and downloaded with
papers; a link inside it could point anywhere (a password file, another run's log). mpifed reads
and appends a run's own files only where they are files: a link in their place is refused with
:class:`LinkRefused`, which names it. (Whole-file writes replace a link by a file: see
:func:`mpifed.run.rundir.atomic_write`.)
"""
from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import IO


class LinkRefused(OSError):
    """A run's file is a symbolic link: mpifed does not read or write through it."""

    def __init__(self, path: Path) -> None:
        super().__init__(errno.ELOOP, f"{path} is a symbolic link, and mpifed reads and writes a run directory's "
                                      f"own files only, never what a link points to; replace the link by the file "
                                      f"itself (or remove it)", str(path))

    def __str__(self) -> str:
        return self.strerror


def _opened(path: Path, flags: int, mode: int = 0o644) -> int:
    try:
        return os.open(path, flags | os.O_NOFOLLOW, mode)
    except OSError as exc:
        if exc.errno == errno.ELOOP and Path(path).is_symlink():
            raise LinkRefused(Path(path)) from None
        raise


def read_bytes(path: Path) -> bytes:
    """The content of the file ``path``; :class:`LinkRefused` when it is a link."""
    with os.fdopen(_opened(path, os.O_RDONLY), "rb") as f:
        return f.read()


def read_text(path: Path) -> str:
    return read_bytes(path).decode()


def open_append(path: Path, buffering: int = -1) -> IO[str]:
    """``path`` opened to append text (made if absent); :class:`LinkRefused` when it is a link."""
    return os.fdopen(_opened(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT), "a", buffering=buffering)


def open_lock(path: Path) -> int:
    """A descriptor of the lock file ``path`` for reading and writing (made if absent); never a link's target."""
    return _opened(path, os.O_RDWR | os.O_CREAT)


def open_at(path: Path, write: bool) -> int:
    """A descriptor of ``path`` for reading (and, with ``write``, writing, made if absent) at offsets;
    :class:`LinkRefused` when it is a link."""
    return _opened(path, os.O_RDWR | os.O_CREAT if write else os.O_RDONLY)
