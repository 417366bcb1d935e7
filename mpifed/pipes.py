"""Output piped into a reader that stops early (``mpifed table X --list | head``, ``mpifed run ... | head -1``)."""
from __future__ import annotations

import functools
import os
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


class _Surviving:
    """A text stream that, once its reader has gone, sends everything to devnull instead of raising."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)
        except BrokenPipeError:
            self._to_devnull()
            return len(text)

    def flush(self) -> None:
        try:
            self._stream.flush()
        except BrokenPipeError:
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
    """While a run is in progress: if stdout's or stderr's reader goes away (``... | head -1``), the
    run goes on, its messages still reach log.txt, and the console's are dropped."""
    saved = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = _Surviving(sys.stdout), _Surviving(sys.stderr)
    try:
        yield
    finally:
        sys.stdout, sys.stderr = saved
