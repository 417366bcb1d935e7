"""Stop requests: Slurm's warning signal (SIGUSR1) and preemption (SIGTERM).

A signal only sets a flag (and lets the server print where the last checkpoint is);
the server finishes the round in progress, writes a checkpoint and stops every rank.
"""
from __future__ import annotations

import signal
from typing import Callable

_received: list[str] = []


def install(on_signal: Callable[[str], None] | None = None) -> None:
    """Catch SIGUSR1 and SIGTERM; ``on_signal(name)`` runs in the handler (keep it short)."""

    def handler(signum: int, frame: object) -> None:
        name = signal.Signals(signum).name
        _received.append(name)
        if on_signal is not None:
            on_signal(name)

    for sig in (signal.SIGUSR1, signal.SIGTERM):
        signal.signal(sig, handler)


def stop_requested() -> bool:
    return bool(_received)


def received() -> list[str]:
    return list(_received)
