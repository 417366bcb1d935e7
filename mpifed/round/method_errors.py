"""An exception in a hook of the method's own code, reported once: which method, hook, client,
round and rank, the line of the method's file, and how to continue after the fix.

A worker that meets such an exception (:func:`hook_failure`) does not end the job on its own: it
keeps the failure, takes part in the round's collectives with nothing trained, and the round's
gather brings every worker's failure to rank 0, which raises :class:`MethodFailed` with the first
one's traceback (the others named in a line). Only an exception whose traceback passes through the
method's own source counts; anything else is mpifed's, and crashes as before.
"""
from __future__ import annotations

import inspect
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

from mpifed.algorithms.base import NonFiniteLoss
from mpifed.settings.plugins import CHANGED_FLAG


@dataclass(frozen=True)
class HookFailure:
    """One rank's failure in the method's code, small enough to gather."""

    method: str
    hook: str              # the method's function the round called (``loss``, ``uplink``, ``aggregate``)
    where: str             # ``my_method.py, line 12``: the method's line the exception passed through last
    rank: int
    client: int | None     # None for a hook that is not a client's (``round_start``, the server's)
    server_round: int
    text: str              # the traceback from the hook on, and the exception

    def place(self) -> str:
        client = f"client {self.client}, " if self.client is not None else ""
        return f"{client}round {self.server_round}, rank {self.rank}"


class MethodFailed(Exception):
    """A hook of the method's own code raised (on one or more ranks): its report, once."""

    def __init__(self, failures: list[HookFailure], how_to_continue: str) -> None:
        first = failures[0]
        also = [f"{f.place()} ({f.hook})" for f in failures[1:]]
        also_line = f"\nIt failed as well on: {'; '.join(also)}." if also else ""
        self.headline = (f"the method {first.method} failed in its hook {first.hook} ({first.place()}) at "
                         f"{first.where}: {first.text.rstrip().splitlines()[-1]}")
        super().__init__(f"the method {first.method} failed in its hook {first.hook} ({first.place()}) at "
                         f"{first.where}:\n{first.text.rstrip()}{also_line}\n{how_to_continue}")
        self.failures = failures


def method_sources(*classes: type) -> frozenset[str]:
    """The resolved paths of the source files that define ``classes`` and their own bases (mpifed's
    base classes left out): what counts as the method's code."""
    files = set()
    for cls in classes:
        for klass in inspect.getmro(cls):
            if klass.__module__ == "mpifed.algorithms.base" or klass.__module__ == "builtins":
                continue
            try:
                files.add(str(Path(inspect.getfile(klass)).resolve()))
            except (TypeError, OSError):
                continue
    return frozenset(files)


def hook_failure(exc: BaseException, method: str, sources: Iterable[str], rank: int, client: int | None,
                 server_round: int) -> HookFailure | None:
    """``exc`` as a failure of the method's code, when its traceback passes through ``sources``;
    None when it does not (mpifed's own error), and for a loss that became NaN or infinite (a run
    that diverged, recorded as such, whatever code it passed through)."""
    if isinstance(exc, NonFiniteLoss):
        return None
    sources = set(sources)
    frames = traceback.extract_tb(exc.__traceback__)
    mine = [i for i, f in enumerate(frames) if str(Path(f.filename).resolve()) in sources]
    if not mine:
        return None
    first, last = frames[mine[0]], frames[mine[-1]]
    text = ("Traceback (most recent call last):\n" + "".join(traceback.format_list(frames[mine[0]:]))
            + "".join(traceback.format_exception_only(type(exc), exc)))
    return HookFailure(method, first.name, f"{Path(last.filename).name}, line {last.lineno}", rank, client,
                       server_round, text)


def how_to_continue(resume_command: str, checkpoint_round: int | None) -> str:
    """What to do after the fix: resume from the last checkpoint with the changed code."""
    since = (f"from its last checkpoint (after round {checkpoint_round})" if checkpoint_round is not None
             else "from round 1 (no checkpoint was written yet)")
    return (f"Fix the method's code, then continue the run {since} with the fixed code (the run's provenance "
            f"records both versions): {resume_command} {CHANGED_FLAG}")
