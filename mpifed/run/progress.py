"""Rank 0's console: one line per round with elapsed time and an ETA, and a live progress bar
(tqdm) only on a terminal (:func:`mpifed.comm.handoff.progress_bar_wanted`), so logs (Slurm's output
files, a launcher's output redirected to a file) stay one line per round."""
from __future__ import annotations

import sys
import time
from typing import Any

from mpifed.comm.handoff import progress_bar_wanted


def duration(seconds: float) -> str:
    """Seconds as 42s, 3m05s or 2h07m."""
    s = int(round(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


def count(n: int, noun: str) -> str:
    """``1 round``, ``3 rounds``."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


class Progress:
    """Rounds done out of ``total``, counting from ``start`` (a resumed run's first round)."""

    def __init__(self, total: int, start: int, live: bool | None = None) -> None:
        self.total = total
        self.start = start
        self.budget = 0.0            # system.time_budget: the ETA follows the simulated clock instead (budget_from)
        self.sim_start = 0.0
        self.begun = time.perf_counter()
        self.bar: Any = None
        if live if live is not None else progress_bar_wanted():
            from tqdm import tqdm
            # on stdout, with the round lines: under mpirun each stream is passed on by itself, so a
            # bar on stderr would be drawn out of order with the lines written above it
            self.bar = tqdm(total=total, initial=start, unit="round", dynamic_ncols=True, leave=False, file=sys.stdout)

    def budget_from(self, budget: float, sim_clock: float) -> None:
        """The run ends at simulated time ``budget`` (``system.time_budget``), this invocation starting at
        ``sim_clock``: the lines show the simulated clock, and the ETA its pace, when it ends first."""
        self.budget, self.sim_start = budget, sim_clock

    def eta(self, done: int, sim_clock: float | None = None) -> str:
        """``ETA 3m10s`` after ``done`` rounds (the simulated clock at ``sim_clock``), from this invocation's
        pace: of the rounds, or of the simulated clock towards the time budget when that ends sooner."""
        elapsed = time.perf_counter() - self.begun
        left = elapsed / max(done - self.start, 1) * (self.total - done)
        if self.budget and sim_clock is not None and sim_clock > self.sim_start:
            left = min(left, elapsed / (sim_clock - self.sim_start) * max(self.budget - sim_clock, 0.0))
        return f"ETA {duration(left)}"

    def line(self, done: int, row: dict[str, Any]) -> str:
        """The console's line for a round (at most 100 characters): its test, validation and training
        figures, its seconds and the ETA; the phases' seconds are in metrics.jsonl."""
        figures = [("acc", "test_acc"), ("loss", "test_loss"), ("val_acc", "val_acc"), ("train_loss", "train_loss")]
        shown = "".join(f"  {name} {row[key]:.4f}" for name, key in figures if row.get(key) is not None)
        sim = row.get("sim_clock") if self.budget else None
        of = f" t={sim:.0f}s" if sim is not None else f"/{self.total}"    # t: the simulated clock
        return f"round {done}{of}{shown}  {row['time']['round']:.2f} s  {self.eta(done, sim)}"

    def advance(self, done: int) -> None:
        if self.bar is not None:
            self.bar.n = done
            self.bar.refresh()

    def write(self, line: str, err: bool = False) -> None:
        """Print a line above the bar (on its stream), or plainly without one (to stderr if ``err``)."""
        if self.bar is not None:
            self.bar.write(line, file=sys.stdout)
        else:
            print(line, file=sys.stderr if err else sys.stdout, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None
