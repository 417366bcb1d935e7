"""A report's figures for asynchronous FL (docs/federations.md), drawn for a setting that holds
asynchronous runs (``aggregation: fedbuff``, ``fedasync`` or a plugin's), beside its synchronous ones:

* ``<setting>-async``: accuracy (the first ``--y`` metric) against simulated time, one panel per
  algorithm (FedAvg, FedNTD, ...), one line per aggregation (sync, FedBuff (K=..), FedAsync): at
  each simulated time the mean over the seeds of each seed's last evaluation at or before it (what
  the run would report if stopped then, as the ``at_times`` metric reads it), with its band, from
  the latest first evaluation to the earliest last one among the seeds;
* ``<setting>-staleness``: the staleness histogram, one panel per algorithm: the updates the server
  took at each staleness (server versions since the client started), per run (the mean over the
  seeds), and the updates dropped as staler than ``max_staleness``, said in the legend.

Each with its numbers in a CSV beside it. Draws with :mod:`mpifed.tables.plots`, imported when drawing.
"""
from __future__ import annotations

import csv
from collections import Counter
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import yaml

from mpifed.files import safe_yaml
from mpifed.plugin.registry import AGGREGATIONS, ALGORITHMS
from mpifed.run import results
from mpifed.run.rundir import CONFIG
from mpifed.tables.curves import Bars, Curve, FigureOptions, seeds_note, spread, styled, write_csv, y_axis

if TYPE_CHECKING:
    from mpifed.tables.plots import Layout

SIM_TIME = "simulated time (s)"
ORDER = ("sync", "fedbuff", "fedasync")   # a panel's lines in this order, then any plugin's


@dataclass(frozen=True)
class Series:
    """One method's runs in an asynchronous figure: its panel (the algorithm's display name, or the method's
    label where its config names none), its line's label (the aggregation, with the method's label where
    two methods of a panel share an aggregation), its aggregation's registered name and its runs."""

    panel: str
    label: str
    aggregation: str
    runs: list[Path]


def algorithm(run: Path | None) -> str | None:
    """The display name of the algorithm a run used, from its config.yaml (None where unreadable)."""
    given = _config(run).get("algorithm") if run is not None else None
    name = given.get("name") if isinstance(given, dict) else None
    return ALGORITHMS.display_name(name) if name in ALGORITHMS.names() else None


def aggregation(run: Path) -> tuple[str, str]:
    """A run's aggregation from its config.yaml: its registered name (``sync`` where the config has none)
    and its label as papers write it: sync, FedBuff (K=10), FedAsync (a plugin's by its name, with its K
    where it buffers)."""
    given = _config(run).get("aggregation") or {}
    name = given.get("name", "sync") if isinstance(given, dict) else str(given)
    shown = AGGREGATIONS.display_name(name) if name in AGGREGATIONS.names() else name
    if isinstance(given, dict) and given.get("buffer") is not None:
        shown += f" (K={given['buffer']})"
    return name, shown


def series(methods: list[tuple[str, list[Path]]], options: FigureOptions) -> list[Series]:
    """The methods of a setting as :class:`Series`: sync, FedBuff, FedAsync, then any other aggregation, each
    in the order given; a line's label is its aggregation's, followed by the method's label where two methods of
    its panel share that aggregation label."""
    found = []
    for m, runs in methods:
        name, shown = aggregation(runs[0])
        found.append(Series(algorithm(runs[0]) or options.label(m), shown, name, runs))
    count = Counter((s.panel, s.label) for s in found)
    named = [replace(s, label=f"{s.label}: {options.label(m)}") if count[(s.panel, s.label)] > 1 else s
             for s, (m, _) in zip(found, methods)]
    return sorted(named, key=lambda s: ORDER.index(s.aggregation) if s.aggregation in ORDER else len(ORDER))


def timeline(rows: list[dict[str, Any]], column: str) -> tuple[np.ndarray, np.ndarray] | None:
    """Each evaluation of ``column`` in a run's metrics rows at its simulated time (the ``sim_clock`` so far;
    0 before the first row that records it); None for a run without the virtual clock."""
    if not any("sim_clock" in r for r in rows):
        return None
    clock, times, values = 0.0, [], []
    for r in rows:
        clock = float(r.get("sim_clock", clock))
        if (v := results.entry(r, column)) is not None:
            times.append(clock)
            values.append(float(v))
    return np.array(times, dtype=np.float64), np.array(values, dtype=np.float64)


def at_simulated_times(label: str, runs: list[Path], column: str, scale: float = 1.0,
                       band: str = "t95") -> Curve | None:
    """``column`` (times ``scale``) against simulated time: at every time one of ``runs`` evaluated, from the
    latest first evaluation to the earliest last one, the mean over the runs of each one's last evaluation at
    or before it, with its ``band``; None where a run has no virtual clock or no evaluation, or the runs'
    evaluations do not overlap in time."""
    found = [timeline(results.read_rows(r), column) for r in runs]
    if any(t is None or not len(t[0]) for t in found):
        return None
    start, end = max(t[0] for t, _ in found), min(t[-1] for t, _ in found)
    grid = np.unique(np.concatenate([t for t, _ in found]))
    grid = grid[(grid >= start) & (grid <= end)]
    if not len(grid):
        return None
    values = scale * np.array([v[np.searchsorted(t, grid, side="right") - 1] for t, v in found])
    return Curve(label, grid, values.mean(axis=0), spread(values, band), n=len(runs), steps=True)


def staleness_bars(label: str, runs: list[Path]) -> Bars | None:
    """The staleness histogram of ``runs`` (their metrics rows' ``staleness`` lists and ``stale_dropped``), per
    run, with their config's ``max_staleness``; None where no row records staleness (synchronous runs)."""
    taken: Counter[int] = Counter()
    dropped, recorded = 0, False
    for r in runs:
        for row in results.read_rows(r):
            if isinstance(row.get("staleness"), list):
                recorded = True
                taken.update(int(s) for s in row["staleness"])
                dropped += int(row.get("stale_dropped") or 0)
    if not recorded:
        return None
    values = np.arange(max(taken, default=0) + 1)
    return Bars(label, values, np.array([taken[s] for s in values], dtype=np.float64) / len(runs),
                dropped / len(runs), len(runs), _max_staleness(runs[0]))


def aggregation_figures(methods: list[tuple[str, list[Path]]], out: Path, stem: str, fmt: str, title: str,
                        layout: "Layout", options: FigureOptions) -> list[Path]:
    """A setting's asynchronous figures (the module docstring), each with its CSV, where ``methods`` (label,
    runs) hold an asynchronous run; none otherwise."""
    from mpifed.tables import plots
    lines = series(methods, options)
    if all(s.aggregation == "sync" for s in lines):
        return []
    look = _looks(lines, options.greyscale)
    panels = list(dict.fromkeys(s.panel for s in lines))
    column = options.y[0]
    ylabel, scale = y_axis(column)
    mixed = len({len(s.runs) for s in lines}) > 1
    curves: list[tuple[str, list[Curve]]] = []
    unclocked = []
    for panel in panels:
        drawn = []
        for s in (s for s in lines if s.panel == panel):
            label = f"{s.label} (n={len(s.runs)})" if mixed else s.label
            line = at_simulated_times(label, s.runs, column, scale, options.band)
            if line is None:
                unclocked.append(f"{panel} {s.label}")
            else:
                drawn.append(styled(line, look[s.label]))
        if drawn:
            curves.append((f"{panel}: {ylabel}", drawn))
    written = []
    note = seeds_note([len(s.runs) for s in lines], options.band)
    if unclocked:
        note += f"; not drawn (no simulated clock or no evaluation): {', '.join(unclocked)}"
    if curves:
        path = plots.curves(out / f"{stem}-async.{fmt}", title, "at each simulated time, each seed's last "
                            f"evaluation at or before it; {note}", curves, layout, SIM_TIME)
        written += [path, write_csv(path.with_suffix(".csv"), curves, SIM_TIME, options.band)]
    histograms = []
    for panel in panels:
        bars = [replace(b, colour=look[s.label].colour, legend=f"{s.label}; dropped as stale"
                        + (f" (> {b.max_staleness})" if b.max_staleness is not None else "") + f": {b.dropped:g}")
                for s in lines if s.panel == panel and (b := staleness_bars(s.label, s.runs)) is not None]
        if bars:
            histograms.append((panel, bars))
    if histograms:
        path = plots.bars(out / f"{stem}-staleness.{fmt}", title, "updates taken per run at each staleness (server "
                          "versions since the client started), mean over seeds; the legend says those dropped as "
                          "staler than max_staleness", histograms, layout, "staleness", "updates taken per run")
        written += [path, write_staleness_csv(path.with_suffix(".csv"), histograms)]
    return written


def write_staleness_csv(path: Path, panels: list[tuple[str, list[Bars]]]) -> Path:
    """The staleness histograms as CSV (``path``): one line per panel, aggregation and staleness (``updates``
    over all seeds, ``per_run`` their mean, ``share`` in % of the updates that arrived, taken or dropped as
    stale, ``n`` the runs), and a line ``dropped (> max_staleness)`` with the updates dropped as stale."""
    with path.open("w", newline="") as f:
        w = csv.writer(f, lineterminator="\n")
        w.writerow(["panel", "aggregation", "staleness", "updates", "per_run", "share", "n"])
        for panel, bars in panels:
            for b in bars:
                arrived = (b.per_run.sum() + b.dropped) or 1.0
                for s, per_run in zip(b.staleness, b.per_run):
                    w.writerow([panel, b.label, int(s), _count(per_run * b.n), _num(per_run),
                                _num(100 * per_run / arrived), b.n])
                bound = b.max_staleness
                w.writerow([panel, b.label, f"dropped (> {bound})" if bound is not None else "dropped",
                            _count(b.dropped * b.n), _num(b.dropped), _num(100 * b.dropped / arrived), b.n])
    return path


def _looks(lines: list[Series], greyscale: bool) -> dict[str, Any]:
    """Each line's look: its aggregation's, the same in every panel and report, where it is the only line of
    that aggregation in its panel; else a look of its own."""
    from mpifed.tables import figure_style
    shared = Counter((s.panel, s.aggregation) for s in lines)
    keys = {s.label: s.aggregation if shared[(s.panel, s.aggregation)] == 1 else s.label for s in lines}
    return figure_style.styles(keys, AGGREGATIONS.names(), greyscale)


def _max_staleness(run: Path) -> int | None:
    given = _config(run).get("aggregation")
    return given.get("max_staleness") if isinstance(given, dict) else None


def _config(run: Path) -> dict[str, Any]:
    """A run's config.yaml ({} where unreadable)."""
    try:
        found = safe_yaml.read(run / CONFIG)
    except (OSError, yaml.YAMLError):
        return {}
    return found if isinstance(found, dict) else {}


def _count(x: float) -> int:
    return int(round(float(x)))


def _num(x: float) -> str:
    return f"{float(x):.6g}"
