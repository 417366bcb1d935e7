"""What the simulated federation costs the server at scale: the selector and the virtual clock per round.

    python benchmarks/federation.py [--clients 1000 1000000] [--cohort 100] [--rounds 20]
                                    [--selection uniform oort]

Per population and selector, on rank 0's side only (no training): the time to set up the round's
plan (:class:`mpifed.round.timeline.Timeline`: devices, availability, each client's expected
seconds), then per round the plan (availability, the selector, local work, the clock's plan) and the
selector's update from the round's outcome; the memory the set-up holds and the most the rounds add
(tracemalloc, which counts numpy's arrays). Times are CPU seconds of this process
(time.process_time), so a busy machine does not inflate them; tracemalloc slows allocation a little.
The federation is FedScale-like: log-normal speeds and bandwidths, on-off availability, 20% dropout,
a deadline, over-commitment 1.3, partial stragglers. The issue's budget at 10^6 clients: at most 50
ms a round and 100 MB more memory.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
import tracemalloc
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from mpifed.algorithms.base import ClientReport  # noqa: E402
from mpifed.round.timeline import Costs, Timeline  # noqa: E402
from mpifed.settings import config  # noqa: E402

import numpy as np  # noqa: E402

SYSTEM = ("system.clock=true", "system.speed_sigma=0.5", "system.bandwidth_sigma=0.5", "system.dropout=0.2",
          "system.availability=on-off", "system.on_period=3600", "system.off_period=3600", "system.deadline=60",
          "system.overcommit=1.3", "system.stragglers=partial")
COSTS = Costs(passes=3, bytes_down=2_000_000, bytes_up=2_000_000)   # a model of half a million floats


def measure(clients: int, cohort: int, rounds: int, selection: str) -> dict[str, float]:
    cfg, _ = config.load(None, [f"data.num_clients={clients}", f"train.participation={cohort / clients}",
                                f"selection.name={selection}", *SYSTEM])
    sizes = np.random.default_rng(0).integers(10, 200, clients)
    tracemalloc.start()
    start = time.process_time()
    line = Timeline(cfg, sizes, COSTS)
    setup_s = time.process_time() - start
    held = tracemalloc.get_traced_memory()[0]
    tracemalloc.reset_peak()
    per_round = []
    for rnd in range(rounds):
        start = time.process_time()
        planned = line.plan(rnd)
        reports = [ClientReport(int(c), 0, int(sizes[c]), 1, 1.0 + (int(c) % 7) / 10, 0.0, {}) for c in planned.clients]
        line.finished(rnd, reports)
        per_round.append(time.process_time() - start)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return {"setup_ms": setup_s * 1000, "round_ms": statistics.median(per_round) * 1000,
            "round_max_ms": max(per_round) * 1000, "held_mb": held / 2**20, "round_peak_mb": peak / 2**20}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--clients", type=int, nargs="+", default=[1000, 1_000_000])
    p.add_argument("--cohort", type=int, default=100)
    p.add_argument("--rounds", type=int, default=20)
    p.add_argument("--selection", nargs="+", default=["uniform", "weighted", "oort"])
    a = p.parse_args()
    print("| clients | selection | set-up ms | ms/round (median) | ms/round (max) | MB held | MB peak in a round |")
    print("| ---: | --- | ---: | ---: | ---: | ---: | ---: |")
    for k in a.clients:
        for name in a.selection:
            m = measure(k, a.cohort, a.rounds, name)
            print(f"| {k} | {name} | {m['setup_ms']:.0f} | {m['round_ms']:.1f} | {m['round_max_ms']:.1f} | "
                  f"{m['held_mb']:.1f} | {m['round_peak_mb']:.1f} |", flush=True)


if __name__ == "__main__":
    main()
