"""Stop requests: Ctrl-C (SIGINT), Slurm's warning signal (SIGUSR1), preemption (SIGTERM) and a
closing terminal (SIGHUP, after which the console's output goes to devnull; log.txt keeps it).

While a run is in progress (:func:`listening`), the signals are blocked in every thread and
received by one listener thread with ``sigwait``, so they are seen at once even while the
main thread is inside a blocking MPI call (where a Python signal handler would not run
until the call returns). A signal sets a flag and calls the registered callback (the
server prints where the last checkpoint is); the server finishes the round in progress,
writes a checkpoint and stops every rank. A second SIGINT, SIGTERM or SIGHUP ends the process
at once.
"""
from __future__ import annotations

import os
import signal
import sys
import threading
from contextlib import contextmanager
from typing import Callable, Iterator

from mpifed.files.pipes import leave_terminal

_WATCHED = {signal.SIGUSR1, signal.SIGTERM, signal.SIGINT, signal.SIGHUP}
_IMMEDIATE_ON_SECOND = {"SIGTERM", "SIGINT", "SIGHUP"}


class _Listener:
    """The process's one signal-listening thread and the current run's requests."""

    def __init__(self) -> None:
        self.received: list[str] = []
        self.callback: Callable[[str], None] | None = None
        self.thread: threading.Thread | None = None

    def listen(self) -> None:
        while True:
            sig = signal.sigwait(_WATCHED)
            name = signal.Signals(sig).name
            if name == "SIGHUP":
                leave_terminal()
            if name in _IMMEDIATE_ON_SECOND and name in self.received:
                sys.stderr.write(f"\n[mpifed] second {name}: exiting now\n")
                sys.stderr.flush()
                os._exit(128 + sig)
            self.received.append(name)
            if self.callback is not None:
                self.callback(name)


_listener = _Listener()


@contextmanager
def listening() -> Iterator[None]:
    """Receive stop signals for the duration of one run. Enter first, before MPI or torch start
    threads (threads inherit the signal mask, so no other thread takes the signals)."""
    _listener.received.clear()
    _listener.callback = None
    signal.pthread_sigmask(signal.SIG_BLOCK, _WATCHED)
    if _listener.thread is None:
        _listener.thread = threading.Thread(target=_listener.listen, name="mpifed-signals", daemon=True)
        _listener.thread.start()
    try:
        yield
    finally:
        _listener.callback = None
        signal.pthread_sigmask(signal.SIG_UNBLOCK, _WATCHED)


def on_signal(callback: Callable[[str], None]) -> None:
    """Have ``callback(signal name)`` called (from the listener thread) when a stop signal arrives."""
    _listener.callback = callback


def stop_requested() -> bool:
    return bool(_listener.received)


def received() -> list[str]:
    return list(_listener.received)
