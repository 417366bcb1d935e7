"""Stop requests: Slurm's warning signal (SIGUSR1) and preemption (SIGTERM).

The signals are blocked in every thread and received by one listener thread with
``sigwait``, so they are seen at once even while the main thread is inside a blocking
MPI call (where a Python signal handler would not run until the call returns). A
signal sets a flag and calls the registered callback (the server prints where the last
checkpoint is); the server finishes the round in progress, writes a checkpoint and stops
every rank. A second SIGTERM ends the process at once.
"""
from __future__ import annotations

import os
import signal
import sys
import threading
from typing import Callable

_WATCHED = {signal.SIGUSR1, signal.SIGTERM}
_received: list[str] = []
_callback: list[Callable[[str], None]] = []


def start() -> None:
    """Block the stop signals and start the listener. Call first, before MPI or torch start threads
    (threads inherit the mask, so no other thread takes the signals)."""
    signal.pthread_sigmask(signal.SIG_BLOCK, _WATCHED)
    threading.Thread(target=_listen, name="mpifed-signals", daemon=True).start()


def on_signal(callback: Callable[[str], None]) -> None:
    """Have ``callback(signal name)`` called (from the listener thread) when a stop signal arrives."""
    _callback[:] = [callback]


def _listen() -> None:
    while True:
        sig = signal.sigwait(_WATCHED)
        name = signal.Signals(sig).name
        if sig == signal.SIGTERM and "SIGTERM" in _received:
            sys.stderr.write("\n[mpifed] second SIGTERM: exiting now\n")
            sys.stderr.flush()
            os._exit(128 + sig)
        _received.append(name)
        for callback in _callback:
            callback(name)


def stop_requested() -> bool:
    return bool(_received)


def received() -> list[str]:
    return list(_received)
