"""The curves of a figure, from finished runs: any recorded metric against rounds, wall time,
simulated time or bytes sent; the mean over seeds with its band; and the same numbers as a CSV
written beside the figure, for a co-author's own plotting tool; and a histogram's bars (:class:`Bars`,
the staleness histogram of :mod:`mpifed.tables.figures_async`). Imports no plotting library.

A band is the 95% t interval of the mean over seeds (``t95``: mean ± t(0.975, n-1) s/sqrt(n), the
default), the sample standard deviation (``std``), or none; one seed has none. On an x axis other
than rounds each point is the mean over seeds of that axis at the round (the seeds' wall times
differ), so the band is over the metric alone.
"""
from __future__ import annotations

import csv
import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from mpifed.files import safe_yaml
from mpifed.run import results
from mpifed.run.rundir import CONFIG

X_AXES = {"round": "round", "wall_time": "wall time (s)", "sim_time": "simulated time (s)",
          "bytes": "data sent (MB)"}
AXIS_KEYS = {"wall_time": "time.round", "sim_time": "sim_clock", "bytes": "bytes_down and bytes_up"}  # in metrics rows
BANDS = {"t95": "band: 95% t interval of the mean over seeds", "std": "band: ± sample std over seeds",
         "none": "no band"}


class FigureError(ValueError):
    """A figure cannot be drawn as asked (an axis the runs do not record)."""


@dataclass(frozen=True)
class FigureOptions:
    """What a report's curves show and how: the x axis (:data:`X_AXES`), the metrics drawn (one panel
    each), the band (:data:`BANDS`), greyscale looks, methods' labels in figures (``METHOD=TEXT``, the
    method by its name in the report, which may hold ``=`` itself, as a sweep's ``lr=0.1+beta=0.5``),
    the order methods are listed in (those named first, in that order), and the method whose paired
    differences get panels of their own (``versus``)."""

    x: str = "round"
    y: tuple[str, ...] = ("test_acc", "test_loss")
    band: str = "t95"
    greyscale: bool = False
    labels: tuple[str, ...] = ()
    order: tuple[str, ...] = ()
    versus: str | None = None    # a method: a panel more per metric, each method's paired difference to it

    def ordered(self, methods: list[Any]) -> list[Any]:
        """``methods`` ((name, ...) pairs) with those :attr:`order` names first, in its order."""
        rank = {m: i for i, m in enumerate(self.order)}
        return sorted(methods, key=lambda item: rank.get(item[0], len(rank)))

    def label(self, method: str) -> str:
        """``method``'s label in figures: the TEXT of a ``METHOD=TEXT`` given for it, else its name."""
        return next((given[len(method) + 1:] for given in self.labels if given.startswith(f"{method}=")), method)


@dataclass
class Curve:
    """One method's line: x values, the mean over seeds and the half-width of its band (None: none,
    or one seed); how it is drawn (a colour, line style and marker, see
    :mod:`mpifed.tables.figure_style`; ``steps``: each value held until the next x, as a value that holds
    until the next evaluation); ``n``: its number of seeds."""

    label: str
    rounds: np.ndarray             # the x values (rounds, seconds, MB, or a share of clients)
    mean: np.ndarray
    band: np.ndarray | None
    colour: str | None = None
    linestyle: Any = "-"
    marker: str | None = None
    n: int = 1
    steps: bool = False


@dataclass
class Bars:
    """One line's histogram: the updates taken per run at each staleness (the mean over ``n`` runs), the
    updates dropped as stale per run (staler than ``max_staleness``, where known), and how it is drawn (its
    colour and its legend's text)."""

    label: str
    staleness: np.ndarray
    per_run: np.ndarray
    dropped: float
    n: int
    max_staleness: int | None = None
    colour: str | None = None
    legend: str = ""


def y_axis(column: str) -> tuple[str, float]:
    """A metric's axis label and scale: an accuracy in %, anything else as recorded."""
    if column == "test_acc":
        return "test accuracy (%)", 100.0
    if column == "val_acc":
        return "validation accuracy (%)", 100.0
    if column.endswith("acc"):
        return f"{column.replace('_', ' ')} (%)", 100.0
    return column.replace("_", " "), 1.0


def x_values(rows: list[dict[str, Any]], axis: str, run: Path) -> dict[int, float]:
    """Each recorded round's position on ``axis`` (:data:`X_AXES`) in one run's metrics rows: the round,
    the wall time so far (the rounds' recorded times summed), the simulated time so far (``sim_clock``,
    recorded by a run with ``system.clock``), or the data sent so far in MB (its rows' ``bytes_down`` and
    ``bytes_up`` summed). A row before the first that records the axis (an evaluation before training)
    is at 0."""
    if axis == "round":
        return {int(r.get("round", 0)): float(r.get("round", 0)) for r in rows}
    if not any(_position(r, axis) is not None for r in rows):
        raise FigureError(f"--x {axis}: the run {run} records no {AXIS_KEYS[axis]} (its metrics.jsonl rows lack "
                          f"it; simulated time and bytes are recorded by runs with system.clock=true). Choose "
                          f"--x round or wall_time")
    out, total = {}, 0.0
    for r in rows:
        value = _position(r, axis)
        if value is not None:
            total = value if axis == "sim_time" else total + value
        out[int(r.get("round", 0))] = total / 1e6 if axis == "bytes" else total
    return out


def _position(row: dict[str, Any], axis: str) -> float | None:
    """What one metrics row adds to (or, for the simulated clock, sets) its position on ``axis``."""
    if axis == "wall_time":
        value = (row.get("time") or {}).get("round")
    elif axis == "sim_time":
        value = row.get("sim_clock")
    else:
        sent = [row.get(k) for k in ("bytes_down", "bytes_up")]
        value = sum(sent) if all(isinstance(v, (int, float)) for v in sent) else None
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def figure_options(x: str = "round", y: str = "test_acc,test_loss", band: str = "t95", greyscale: bool = False,
                   labels: list[str] | tuple[str, ...] = (), order: str | None = None,
                   versus: str | None = None) -> FigureOptions:
    """The :class:`FigureOptions` of a report's command line (``y`` and ``order`` comma-separated,
    ``labels`` as ``METHOD=TEXT``); a :class:`FigureError` for a label without its ``=`` or no metric."""
    for given in labels:
        method, sep, text = given.partition("=")
        if not sep or not method.strip() or not text.strip():
            raise FigureError(f"--label {given!r}: give METHOD=TEXT, e.g. --label 'fedntd=FedNTD (ours)'")
    ordered = tuple(m.strip() for m in (order or "").split(",") if m.strip())
    metrics = tuple(m.strip() for m in y.split(",") if m.strip())
    if not metrics:
        raise FigureError("--y: name at least one metric, e.g. --y test_acc")
    return FigureOptions(x, metrics, band, greyscale, tuple(labels), ordered, versus)


def seeds_note(counts: list[int], band: str = "t95") -> str:
    """How many seeds each line averages (said once when all agree, else per method in the legend)
    and what its band is."""
    said = BANDS[band].removeprefix("band: ")
    if len(set(counts)) != 1:
        return f"line: mean over the seeds (n per method); band: {said}"
    return "one seed" if counts[0] == 1 else f"line: mean over {counts[0]} seeds; band: {said}"


def curve(label: str, runs: list[Path], column: str, scale: float = 1.0, x: str = "round",
          band: str = "t95") -> Curve | None:
    """The mean of ``column`` (times ``scale``) over ``runs`` at the rounds every run evaluated, against
    ``x``, with its ``band`` (:data:`BANDS`); None where the runs share no evaluated round."""
    rows = [results.read_rows(r) for r in runs]
    series = [dict(results.evaluations(rs, column)) for rs in rows]
    rounds = sorted(set.intersection(*(set(s) for s in series))) if series else []
    if not rounds:
        return None
    values = scale * np.array([[s[r] for r in rounds] for s in series], dtype=np.float64)
    where = [x_values(rs, x, run) for rs, run in zip(rows, runs)]
    xs = np.array([[w[r] for r in rounds] for w in where], dtype=np.float64).mean(axis=0)
    return Curve(label, xs, values.mean(axis=0), spread(values, band), n=len(runs))


def difference(label: str, runs: list[Path], reference: list[Path], column: str, scale: float = 1.0,
               x: str = "round", band: str = "t95") -> Curve | None:
    """The paired difference of ``column`` (times ``scale``) between ``runs`` and the ``reference``'s runs
    of the same seeds, round by round (the rounds both evaluated): its mean over the seeds with the
    ``band`` of that mean (a paired band: the seeds' differences, not the two methods' spreads); None
    where they share no seed or round."""
    mine, theirs = _by_seed(runs), _by_seed(reference)
    seeds = sorted(set(mine) & set(theirs))
    if not seeds:
        return None
    rows = {s: (results.read_rows(mine[s]), results.read_rows(theirs[s])) for s in seeds}
    series = {s: (dict(results.evaluations(a, column)), dict(results.evaluations(b, column))) for s, (a, b) in
              rows.items()}
    rounds = sorted(set.intersection(*(set(a) & set(b) for a, b in series.values())))
    if not rounds:
        return None
    diffs = scale * np.array([[a[r] - b[r] for r in rounds] for a, b in series.values()], dtype=np.float64)
    where = [x_values(rows[s][0], x, mine[s]) for s in seeds]
    xs = np.array([[w[r] for r in rounds] for w in where], dtype=np.float64).mean(axis=0)
    return Curve(label, xs, diffs.mean(axis=0), spread(diffs, band), n=len(seeds))


def _by_seed(runs: list[Path]) -> dict[int, Path]:
    """Runs by their seed (their config.yaml's run.seed)."""
    found = {}
    for run in runs:
        try:
            found[int(safe_yaml.read(run / CONFIG)["run"]["seed"])] = run
        except (OSError, KeyError, TypeError, ValueError, yaml.YAMLError):
            continue
    return found


def spread(values: np.ndarray, band: str) -> np.ndarray | None:
    """The half-width of the ``band`` (:data:`BANDS`) of the mean of ``values`` (seeds x points) over its
    seeds; None for no band or one seed."""
    n = values.shape[0]
    if n < 2 or band == "none":
        return None
    sd = values.std(axis=0, ddof=1)
    return sd if band == "std" else t_quantile(n - 1) * sd / math.sqrt(n)


def t_quantile(df: int, level: float = 0.95) -> float:
    """The two-sided ``level`` quantile of Student's t with ``df`` degrees of freedom."""
    from scipy import stats
    return float(stats.t.ppf(0.5 + level / 2, df))


def styled(line: Curve, style: Any) -> Curve:
    """``line`` drawn in a :class:`mpifed.tables.figure_style.Style`."""
    return replace(line, colour=style.colour, linestyle=style.linestyle, marker=style.marker)


def write_matrix_csv(path: Path, values: np.ndarray, rows: list[str], columns: list[str]) -> Path:
    """A heatmap's numbers as CSV (``path``): one line per row, one column per column."""
    with path.open("w", newline="") as f:
        w = csv.writer(f, lineterminator="\n")
        w.writerow(["", *columns])
        for name, line in zip(rows, values):
            w.writerow([name, *("" if not np.isfinite(v) else _num(v) for v in line)])
    return path


def write_csv(path: Path, panels: list[tuple[str, list[Curve]]], xlabel: str, band: str) -> Path:
    """The curves of a figure as CSV (``path``): one line per panel, method and point, with the band's
    low and high ends and its kind."""
    with path.open("w", newline="") as f:
        w = csv.writer(f, lineterminator="\n")
        w.writerow(["panel", "method", xlabel, "mean", "low", "high", "n", "band"])
        for ylabel, lines in panels:
            for c in lines:
                for i, (xv, m) in enumerate(zip(c.rounds, c.mean)):
                    low, high = ("", "") if c.band is None else (_num(m - c.band[i]), _num(m + c.band[i]))
                    w.writerow([ylabel, c.label, _num(xv), _num(m), low, high, c.n,
                                band if c.band is not None else "none"])
    return path


def _num(x: float) -> str:
    return f"{float(x):.6g}"
