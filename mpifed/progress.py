"""Rank 0's console: one line per round with elapsed time and an ETA, and a live progress bar
(tqdm) only when stdout is a terminal, so logs (Slurm's output files) stay one line per round."""
from __future__ import annotations

import sys
import time
from typing import Any


def duration(seconds: float) -> str:
    """Seconds as 42s, 3m05s or 2h07m."""
    s = int(round(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


class Progress:
    """Rounds done out of ``total``, counting from ``start`` (a resumed run's first round)."""

    def __init__(self, total: int, start: int, live: bool | None = None) -> None:
        self.total = total
        self.start = start
        self.begun = time.perf_counter()
        self.bar: Any = None
        if live if live is not None else sys.stdout.isatty():
            from tqdm import tqdm
            self.bar = tqdm(total=total, initial=start, unit="round", dynamic_ncols=True, leave=False)

    def timing(self, done: int) -> str:
        """``elapsed 1m02s, ETA 3m10s`` after ``done`` rounds (ETA from this invocation's pace)."""
        elapsed = time.perf_counter() - self.begun
        ran = max(done - self.start, 1)
        eta = elapsed / ran * (self.total - done)
        return f"elapsed {duration(elapsed)}, ETA {duration(eta)}"

    def advance(self, done: int) -> None:
        if self.bar is not None:
            self.bar.n = done
            self.bar.refresh()

    def write(self, line: str) -> None:
        """Print a line above the bar (or plainly, without one)."""
        if self.bar is not None:
            self.bar.write(line)
        else:
            print(line, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None
