"""The time a table's unfinished runs will take, priced from its finished runs (``--list`` prints it)."""
from __future__ import annotations

import math
import statistics

from mpifed.tables.table_file import Table, TableRun, settled, status
from mpifed.run.state import RunState
from mpifed.run.record import RunRecord


def estimate(table: Table) -> str:
    """The time the unfinished runs (those waiting for their search too) will take one after another,
    from the finished runs' seconds per round and local epoch (or local step, train.local_steps;
    their median: a run slowed by other work weighs little) times each run's rounds and local
    epochs (steps): the nearest finished runs first (same setting, method and kind, search or final;
    then same setting and method; same setting and kind; the nearest local work in the same unit
    that has finished runs, same kind; the same, any kind; same kind; any); empty when nothing is
    left. Across local epochs the price is high, as a round's evaluation does not grow with them."""
    per_round: dict[tuple[object, ...], list[float]] = {}
    timed: set[tuple[str, int]] = set()                # the local work finished runs have measured
    whole = table.whole or table
    for r in whole.search + whole.runs:
        if (r.candidate is not None or (r.setting, r.method) not in whole.pending) and status(r) == RunState.FINISHED:
            wall = RunRecord(r.path).summary.get("wall_time_s")
            if isinstance(wall, (int, float)):
                local = _local(r)
                timed.add(local)
                for key in _nearness(r, local):
                    per_round.setdefault(key, []).append(float(wall) / _work(r))
    left = [r for r in table.search + table.runs if not settled(r.path)]
    if not left:
        return ""
    if not per_round:
        return (f"no estimate of the time left yet: none of the table's runs has finished; --list prices the "
                f"{len(left)} runs once one has (a search run, the shortest, is enough)")
    def nearest(local: tuple[str, int]) -> tuple[str, int]:
        return min(timed, key=lambda e: (e[0] != local[0], abs(math.log(e[1] / local[1])), e))

    seconds = sum(_work(r) * statistics.median(next(per_round[k] for k in _nearness(r, nearest(_local(r)))
                                                    if k in per_round))
                  for r in left)
    waiting = sum(1 for r in left if r.candidate is None and (r.setting, r.method) in table.pending)
    note = f", {waiting} of them after their search" if waiting else ""
    done = len(per_round[()])
    return (f"estimated time left, one run at a time: {_duration(seconds)} for {len(left)} runs{note}, from "
            f"{done} finished runs' seconds per round and local "
            + " or ".join(sorted({unit.removeprefix("local_").rstrip("s") for unit, _ in timed})))


def _nearness(r: TableRun, local: tuple[str, int]) -> list[tuple[object, ...]]:
    kind = "search" if r.candidate is not None else "final"
    return [(r.setting, r.method, kind), (r.setting, r.method), (r.setting, kind), (local, kind), (local,),
            (kind,), ()]


def _local(r: TableRun) -> tuple[str, int]:
    """The run's local work a round: ("local_epochs", E), or ("local_steps", S) under train.local_steps
    (a pair: no setting label equals it)."""
    train = r.resolved.get("train", {})
    steps = train.get("local_steps")
    if isinstance(steps, int) and steps > 0:
        return "local_steps", steps
    epochs = train.get("local_epochs")
    return "local_epochs", epochs if isinstance(epochs, int) and epochs > 0 else 1


def _work(r: TableRun) -> int:
    """Rounds x local epochs (or steps): what a run's time scales with, to first order (evaluation aside)."""
    rounds = r.resolved.get("train", {}).get("rounds")
    return (rounds if isinstance(rounds, int) and rounds > 0 else 1) * _local(r)[1]


def _duration(seconds: float) -> str:
    minutes = round(seconds / 60)
    return f"{minutes // 60}h{minutes % 60:02d}m" if minutes >= 60 else f"{max(minutes, 1)}m"
