"""Shared by the benchmark scripts: run mpifed (debug mode or N ranks) and read its figures."""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PHASES = ("downlink", "local_training", "uplink", "aggregate", "evaluation", "worker_idle_mean", "round")


@dataclass
class RunFigures:
    ranks: int                 # 0: single-process debug mode
    rows: list[dict]
    summary: dict
    wall_s: float
    startup_s: float           # launch to the start of round 1

    def median(self, phase: str) -> float:
        return statistics.median(r["time"].get(phase, 0.0) for r in self.rows)

    @property
    def peak_rss_total_mb(self) -> float:
        return sum(self.summary["peak_rss_mb_per_rank"])


def run_mpifed(ranks: int, args: list[str], run_root: Path, name: str, timeout: float = 3600,
               resume: bool = False) -> RunFigures:
    """Run mpifed with ``args`` (plus run.root/run.name) and collect its per-round figures.

    ``resume``: continue the run already in ``run_root/name`` (a finished one is left as it is)
    instead of overwriting it; the wall and start-up times then describe this call only."""
    sets = ["--set", f"run.root={run_root}", f"run.name={name}", "--resume" if resume else "--overwrite"]
    if ranks == 0:
        cmd = [sys.executable, "-m", "mpifed.main", *args, *sets]
    else:
        cmd = [str(REPO / "launch" / "local.sh"), str(ranks), *args, *sets]
    env = dict(os.environ, PYTHON=sys.executable, PYTHONPATH=str(REPO))
    start = time.time()
    p = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)
    wall = time.time() - start
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}")
    run = run_root / name
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    summary = json.loads((run / "summary.json").read_text())
    return RunFigures(ranks, rows, summary, wall, summary["first_round_started_at"] - start)


def breakdown_table(figs: list[RunFigures], skip_first: int = 1, labels: list[str] | None = None) -> str:
    """Per-round medians (seconds) of every phase, one line per run (named by ``labels``, else by its
    rank count), first rounds skipped (warm-up)."""
    width = max([14, *(len(label) for label in labels or [])])
    head = f"{'mode':>{width}} " + " ".join(f"{p:>16}" for p in PHASES) + f" {'startup_s':>10} {'peak_rss_MB':>12}"
    lines = [head]
    for i, f in enumerate(figs):
        rows = f.rows[skip_first:] or f.rows
        fr = RunFigures(f.ranks, rows, f.summary, f.wall_s, f.startup_s)
        mode = labels[i] if labels else "debug (1 proc)" if f.ranks == 0 else f"mpirun -n {f.ranks}"
        lines.append(f"{mode:>{width}} " + " ".join(f"{fr.median(p):>16.4f}" for p in PHASES)
                     + f" {f.startup_s:>10.1f} {f.peak_rss_total_mb:>12.0f}")
    return "\n".join(lines)
