"""Commands whose output is piped into a reader that stops early (``mpifed table X --list | head``)."""
from __future__ import annotations

import functools
import os
import sys
from typing import Callable


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
