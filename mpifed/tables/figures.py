"""A report's figures, per setting: the recorded metrics (test accuracy and loss by default) against
round, wall time, simulated time or bytes sent (the mean over the seeds with its band, the curves'
numbers in a CSV beside each figure: :mod:`mpifed.tables.curves`), the final per-class accuracy, each
client's held-out accuracy, and where a setting holds asynchronous runs accuracy against simulated time per
aggregation and the staleness histogram (:mod:`mpifed.tables.figures_async`); each method in one look in every
figure (:func:`method_styles`). Draws with
:mod:`mpifed.tables.plots` (matplotlib), imported when drawing."""
from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import yaml

from mpifed.data.raw import class_names
from mpifed.files import safe_yaml
from mpifed.plugin.registry import ALGORITHMS, DATASETS
from mpifed.run import results
from mpifed.run.record import RunRecord
from mpifed.run.rundir import CONFIG
from mpifed.tables.collection import Collection
from mpifed.tables.curves import (X_AXES, FigureOptions, curve, difference, seeds_note, styled, write_csv,
                                  write_matrix_csv, y_axis)
from mpifed.tables.figures_async import aggregation_figures, algorithm

if TYPE_CHECKING:
    from mpifed.tables.curves import Curve
    from mpifed.tables.figure_style import Style
    from mpifed.tables.plots import Layout


FORMATS = ("png", "pdf", "svg")


def final_per_class(runs: list[Path]) -> np.ndarray | None:
    """The mean over ``runs`` of the last evaluation's per-class test accuracy."""
    last = []
    for r in runs:
        rows = [row for row in results.read_rows(r) if row.get("per_class_acc") is not None]
        if rows:
            last.append([np.nan if a is None else a for a in rows[-1]["per_class_acc"]])
    if not last or len({len(x) for x in last}) != 1:
        return None
    return np.nanmean(np.array(last, dtype=np.float64), axis=0)


def final_client_accuracy(runs: list[Path], band: str = "t95") -> "Curve | None":
    """Each client's accuracy on its held-out rows at the last evaluation (``client_acc.jsonl``, from
    ``data.client_holdout``), sorted worst first, in %: the mean over ``runs`` and its ``band``, position by
    position, against the share of clients (0 to 100%)."""
    from mpifed.tables.curves import Curve, spread
    sorted_runs = []
    for r in runs:
        rows = RunRecord(r).client_accuracy()
        if rows:
            sorted_runs.append(sorted(a for a in rows[-1]["acc"] if a is not None))
    if not sorted_runs or len({len(s) for s in sorted_runs}) != 1 or len(sorted_runs[0]) < 2:
        return None
    values = 100 * np.array(sorted_runs, dtype=np.float64)
    return Curve("", np.linspace(0, 100, values.shape[1]), values.mean(axis=0), spread(values, band), n=len(values))


def figures(c: Collection, out: Path, fmt: str, layout: "Layout | None" = None,
            title: str | None = None, options: FigureOptions = FigureOptions()) -> dict[str, list[Path]]:
    """Each setting's figures, written to ``out`` at ``layout``'s size, each with its numbers in a CSV
    beside it; ``title`` replaces the automatic one (the table's title and the setting); ``options``:
    the axes, band, looks, labels and order."""
    from mpifed.tables import plots
    layout = layout or plots.Layout()
    written: dict[str, list[Path]] = {}
    palette = method_styles(c, options.greyscale)
    for setting in dict.fromkeys(s for s, _ in c.groups):
        methods = options.ordered([(m, runs) for (s, m), runs in c.groups.items() if s == setting and runs])
        counts = [len(runs) for _, runs in methods]
        mixed = len(set(counts)) > 1
        if title is None:
            title_here = f"{c.figure_title}: {setting}" if c.figure_title else setting
        else:
            title_here = title if len({s for s, _ in c.groups}) == 1 else f"{title}: {setting}"
        panels = []
        for column in options.y:
            ylabel, scale = y_axis(column)
            lines = []
            for m, runs in methods:
                name = options.label(m)
                line = curve(f"{name} (n={len(runs)})" if mixed else name, runs, column, scale, options.x,
                             options.band)
                if line is not None:
                    lines.append(styled(line, palette[m]))
            if lines:
                panels.append((ylabel, lines))
        panels += _differences(methods, options, palette, mixed)
        stem = _slug(setting)
        mine = written.setdefault(setting, [])
        if panels:
            xlabel = X_AXES[options.x]
            drawn = plots.curves(out / f"{stem}-curves.{fmt}", title_here, seeds_note(counts, options.band), panels,
                                 layout, xlabel)
            mine += [drawn, write_csv(drawn.with_suffix(".csv"), panels, xlabel, options.band)]
        per_class = [(m, v) for m, runs in methods if (v := final_per_class(runs)) is not None]
        if per_class and len({len(v) for _, v in per_class}) == 1:
            values = 100 * np.stack([v for _, v in per_class])
            names = _class_names(methods[0][1][0], values.shape[1])
            rows = [options.label(m) for m, _ in per_class]
            drawn = plots.heatmap(out / f"{stem}-per-class.{fmt}", title_here,
                                  "final per-class test accuracy (%), mean over seeds", values, rows, names, "class",
                                  "method", "test accuracy (%)", fmt="{:.0f}", vmin=0.0, vmax=100.0, layout=layout)
            columns = names or [str(k) for k in range(values.shape[1])]
            mine += [drawn, write_matrix_csv(drawn.with_suffix(".csv"), values, rows, columns)]
        clients = []
        for m, runs in methods:
            if (line := final_client_accuracy(runs, options.band)) is not None:
                clients.append(styled(replace(line, label=options.label(m)), palette[m]))
        if clients:
            panels = [("client accuracy (%)", clients)]
            drawn = plots.curves(out / f"{stem}-clients.{fmt}", title_here, "each client on its held-out samples, "
                                 f"last evaluation; {seeds_note(counts, options.band)}", panels, layout,
                                 "clients, worst first (%)")
            mine += [drawn, write_csv(drawn.with_suffix(".csv"), panels, "clients, worst first (%)", options.band)]
        mine += aggregation_figures(methods, out, stem, fmt, title_here, layout, options)
    return written


def _differences(methods: list[tuple[str, list[Path]]], options: FigureOptions, palette: dict[str, "Style"],
                 mixed: bool) -> list[tuple[str, list["Curve"]]]:
    """With ``options.versus``, a panel per metric of each other method's paired difference to it, seed
    by seed (its band a paired one); none where the setting does not hold that method."""
    reference = dict(methods).get(options.versus) if options.versus else None
    if reference is None:
        return []
    panels = []
    for column in options.y:
        ylabel, scale = y_axis(column)
        lines = []
        for m, runs in methods:
            if m != options.versus:
                name = options.label(m)
                line = difference(f"{name} (n={len(runs)})" if mixed else name, runs, reference, column, scale,
                                  options.x, options.band)
                if line is not None:
                    lines.append(styled(line, palette[m]))
        if lines:
            unit = " (points)" if scale == 100.0 else ""
            panels.append((f"{ylabel.split(' (')[0]} − {options.label(options.versus)}{unit}", lines))
    return panels


def method_styles(c: Collection, greyscale: bool = False) -> dict[str, "Style"]:
    """Each method label's look, the same in every figure of a report whatever else it holds
    (:mod:`mpifed.tables.figure_style`): a label that is its setting's only one of its algorithm is drawn
    as that algorithm (FedNTD's look, whether the runs are a table's ``fedntd`` or a folder's
    ``digits-lda0.1-fedntd``); labels that share an algorithm in a setting take looks of their own."""
    from mpifed.tables import figure_style
    by_setting: dict[str, list[str]] = {}
    for (setting, m), runs in c.groups.items():
        by_setting.setdefault(setting, []).append(m)
    algorithms = {m: algorithm(next((runs[0] for (_, k), runs in c.groups.items() if k == m and runs), None))
                  for labels in by_setting.values() for m in labels}
    keys = figure_style.method_keys(by_setting, algorithms)
    return figure_style.styles(keys, [ALGORITHMS.display_name(n) for n in ALGORITHMS.names()], greyscale)


def _class_names(run: Path, num_classes: int) -> list[str] | None:
    try:
        dataset = DATASETS.get(safe_yaml.read(run / CONFIG)["data"]["dataset"]["name"])
    except (OSError, yaml.YAMLError, KeyError, TypeError):
        return None
    return class_names(dataset, num_classes)


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text).strip("_") or "runs"
