"""Output whose reader goes away: a pipe into a reader that stops early (``mpifed table X --list |
head``, ``mpifed run ... | head -1``), or a terminal that closed (SIGHUP)."""
from __future__ import annotations

import errno
import functools
import os
import stat
import sys
from contextlib import contextmanager
from typing import Callable, Iterator, TextIO


def quiet_when_pipe_closes(main: Callable[..., int]) -> Callable[..., int]:
    """Wrap a command's ``main`` so that a closed stdout ends it with status 1 and no traceback."""

    @functools.wraps(main)
    def wrapper(*args, **kwargs) -> int:
        try:
            return main(*args, **kwargs)
        except BrokenPipeError:
            # Python flushes stdout again at exit; point it at devnull so that flush cannot raise too.
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
            return 1

    return wrapper


_GONE = (errno.EPIPE, errno.EIO)   # the pipe's reader exited; the terminal closed


class _Surviving:
    """A text stream that, once its reader has gone, sends everything to devnull instead of raising."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)
        except OSError as exc:
            if exc.errno not in _GONE:
                raise
            self._to_devnull()
            return len(text)

    def flush(self) -> None:
        try:
            self._stream.flush()
        except OSError as exc:
            if exc.errno not in _GONE:
                raise
            self._to_devnull()

    def _to_devnull(self) -> None:
        devnull = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(devnull, self._stream.fileno())
        finally:
            os.close(devnull)

    def __getattr__(self, name: str):
        return getattr(self._stream, name)


@contextmanager
def survive_closed_output() -> Iterator[None]:
    """While a run is in progress: if stdout's or stderr's reader goes away (``... | head -1``, a
    closed terminal), the run goes on, its messages still reach log.txt, and the console's are dropped."""
    saved = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = _Surviving(sys.stdout), _Surviving(sys.stderr)
    try:
        yield
    finally:
        sys.stdout, sys.stderr = saved


def leave_terminal() -> None:
    """After SIGHUP (the terminal closed): stdout and stderr, where they are that terminal, go to
    devnull, so that what the stop still prints cannot fail (writing to a closed terminal raises EIO);
    log.txt keeps it. A hung-up terminal no longer answers isatty(), so any character device counts."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        for fd in (1, 2):
            try:
                if stat.S_ISCHR(os.fstat(fd).st_mode):
                    os.dup2(devnull, fd)
            except OSError:
                continue
    finally:
        os.close(devnull)
