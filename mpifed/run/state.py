"""A run's state, one type for every writer and reader of runs: its values are the strings status.json holds
(``running``, ``stopped``, ``finished``, ``failed``), and those a reader derives (``diverged``, ``damaged``) or
gives a folder without a run (``new``), so a state compares equal to its string and files stay as they are."""
from __future__ import annotations

from enum import Enum


class RunState(str, Enum):
    """What a run is doing or how it ended; ``str(state)`` and ``f"{state}"`` give the string written."""

    RUNNING = "running"      # written at the start and after each checkpoint
    STOPPED = "stopped"      # stopped on request (a signal, a time limit), to be resumed
    FINISHED = "finished"    # every round done
    FAILED = "failed"        # an error ended it, or its processes died without recording why
    DIVERGED = "diverged"    # read: failed because its loss became NaN or infinite (running it again diverges again)
    DAMAGED = "damaged"      # read: finished, but metrics.jsonl does not hold every round
    NEW = "new"              # read: a folder holding no run yet

    def __str__(self) -> str:
        return self.value

    __format__ = str.__format__

    @property
    def settled(self) -> bool:
        """Whether the run is done with: finished, or diverged (a search scores that)."""
        return self in (RunState.FINISHED, RunState.DIVERGED)
