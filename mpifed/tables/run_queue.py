"""Run a list of mpifed runs from one process: one after another, or several at once.

Each run is its own ``python -m mpifed.main`` (or ``mpifed.launch -n N``) in a session of its
own, so that a terminal's Ctrl-C reaches it exactly once, through this process: every run in
progress finishes its round, writes a checkpoint and stops (exit code 75), and no new run
starts. A run another process is running (its directory's lock is held) is skipped; a run
whose loss became NaN or infinite is reported and the others go on; any other failure lets
the runs in progress finish and starts no new one.
"""
from __future__ import annotations

import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Callable

from mpifed.files.pipes import leave_terminal
from mpifed.run.rundir import RunDir
from mpifed.run.state import RunState

EXIT_STOPPED = 75
SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1, signal.SIGHUP)


@dataclass
class Job:
    """One run: its directory, its mpifed arguments, and where its output goes when several run at once."""

    path: Path
    args: list[str]
    log: Path | None = None


@dataclass
class Outcome:
    """What a batch of runs came to: the exit code for the caller, runs skipped, signals received."""

    code: int = 0
    skipped: int = 0
    received: list[str] = field(default_factory=list)
    failed: list[tuple[Path, int]] = field(default_factory=list)


def launcher(ranks: int) -> list[str]:
    """The command that starts one run: the debug mode (``ranks`` 0) or the launcher with N ranks."""
    if ranks == 0:
        return [sys.executable, "-m", "mpifed.main"]
    return [sys.executable, "-m", "mpifed.launch", "-n", str(ranks)]


def run_jobs(jobs: list[Job], ranks: int, parallel: int = 1, say: Callable[[str], None] = print) -> Outcome:
    """Run ``jobs``, ``parallel`` at a time (with more than one, each run's output goes to its
    ``log`` file); returns the :class:`Outcome`."""
    out = Outcome()
    running: dict[subprocess.Popen, tuple[Job, IO[Any] | None]] = {}

    def forward(signum: int, _frame: Any) -> None:
        if signum == signal.SIGHUP:
            leave_terminal()
        out.received.append(signal.Signals(signum).name)
        for proc in running:
            proc.send_signal(signum)

    before = {s: signal.signal(s, forward) for s in SIGNALS}
    queue = list(jobs)
    started = 0
    try:
        while running or (queue and not out.received and not out.failed):
            while queue and len(running) < parallel and not out.received and not out.failed:
                job = queue.pop(0)
                rd = RunDir(job.path)
                if rd.in_progress():
                    say(f"{job.path.name}: another process is running it ({rd.lock_holder()}); skipped")
                    out.skipped += 1
                    continue
                started += 1
                log = None
                if parallel > 1 and job.log is not None:
                    job.log.parent.mkdir(parents=True, exist_ok=True)
                    log = open(job.log, "a")
                say(f"run {started}/{len(jobs)}: {job.path}" + (f" (output: {job.log})" if log else ""))
                proc = subprocess.Popen(launcher(ranks) + job.args, start_new_session=True, stdout=log,
                                        stderr=subprocess.STDOUT if log else None)
                running[proc] = (job, log)
            time.sleep(0.2)
            for proc in [p for p in running if p.poll() is not None]:
                job, log = running.pop(proc)
                if log is not None:
                    log.close()
                _ended(job, proc.returncode, out, say)
    finally:
        for s, handler in before.items():
            signal.signal(s, handler)
    return out


def _ended(job: Job, code: int, out: Outcome, say: Callable[[str], None]) -> None:
    if out.received:
        out.code = out.code or code or EXIT_STOPPED
    elif code == 0:
        return
    elif RunDir(job.path).state() == RunState.DIVERGED:
        say(f"{job.path.name}: its loss became NaN or infinite; the others go on without it")
    elif RunDir(job.path).in_progress():
        say(f"{job.path.name}: another process started it meanwhile; skipped")
        out.skipped += 1
    else:
        say(f"{job.path.name} ended with exit code {code}" + (f"; its output is in {job.log}" if job.log else ""))
        out.failed.append((job.path, code))
        out.code = out.code or code
