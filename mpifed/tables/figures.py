"""A report's figures, per setting: test accuracy and loss against round (mean ± sample std over the
seeds), the final per-class accuracy, each client's held-out accuracy; each method in one colour in every
figure (:func:`method_colours`). Draws with :mod:`mpifed.tables.plots` (matplotlib), imported when drawing."""
from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import yaml

from mpifed.data.raw import class_names
from mpifed.files import safe_yaml
from mpifed.plugin.registry import ALGORITHMS, DATASETS
from mpifed.run import results
from mpifed.run.record import RunRecord
from mpifed.tables.collection import Collection
from mpifed.run.rundir import CONFIG

if TYPE_CHECKING:
    from mpifed.tables.plots import Curve, Layout


FORMATS = ("png", "pdf", "svg")


def curve(label: str, runs: list[Path], column: str, scale: float = 1.0) -> "Curve | None":
    """The mean and sample std of ``column`` (times ``scale``) over ``runs`` at the rounds every run evaluated."""
    from mpifed.tables.plots import Curve
    series = [dict(results.evaluations(results.read_rows(r), column)) for r in runs]
    rounds = sorted(set.intersection(*(set(s) for s in series))) if series else []
    if not rounds:
        return None
    values = scale * np.array([[s[r] for r in rounds] for s in series], dtype=np.float64)
    std = values.std(axis=0, ddof=1) if len(runs) > 1 else None
    return Curve(label, np.array(rounds), values.mean(axis=0), std)


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


def final_client_accuracy(runs: list[Path]) -> "Curve | None":
    """Each client's accuracy on its held-out rows at the last evaluation (``client_acc.jsonl``, from
    ``data.client_holdout``), sorted worst first, in %: the mean and sample std over ``runs``, position by
    position, against the share of clients (0 to 100%)."""
    from mpifed.tables.plots import Curve
    sorted_runs = []
    for r in runs:
        rows = RunRecord(r).client_accuracy()
        if rows:
            sorted_runs.append(sorted(a for a in rows[-1]["acc"] if a is not None))
    if not sorted_runs or len({len(s) for s in sorted_runs}) != 1 or len(sorted_runs[0]) < 2:
        return None
    values = 100 * np.array(sorted_runs, dtype=np.float64)
    std = values.std(axis=0, ddof=1) if len(values) > 1 else None
    return Curve("", np.linspace(0, 100, values.shape[1]), values.mean(axis=0), std)


def seeds_note(counts: list[int]) -> str:
    """How many seeds each line averages: said once when all agree, else per method in the legend."""
    if len(set(counts)) != 1:
        return "line: mean over the seeds (n per method); band: ± sample std"
    return "one seed" if counts[0] == 1 else f"line: mean over {counts[0]} seeds; band: ± sample std"


def figures(c: Collection, out: Path, fmt: str, layout: "Layout | None" = None,
            title: str | None = None) -> dict[str, list[Path]]:
    """Each setting's figures, written to ``out`` at ``layout``'s size; ``title`` replaces the
    automatic one (the table's title and the setting)."""
    from mpifed.tables import plots
    layout = layout or plots.Layout()
    written: dict[str, list[Path]] = {}
    palette = method_colours(c)
    for setting in dict.fromkeys(s for s, _ in c.groups):
        methods = [(m, runs) for (s, m), runs in c.groups.items() if s == setting and runs]
        counts = [len(runs) for _, runs in methods]
        mixed = len(set(counts)) > 1
        if title is None:
            title_here = f"{c.figure_title}: {setting}" if c.figure_title else setting
        else:
            title_here = title if len({s for s, _ in c.groups}) == 1 else f"{title}: {setting}"
        panels = []
        for ylabel, column, scale in (("test accuracy (%)", "test_acc", 100.0), ("test loss", "test_loss", 1.0)):
            lines = []
            for m, runs in methods:
                line = curve(f"{m} (n={len(runs)})" if mixed else m, runs, column, scale)
                if line is not None:
                    line.colour = palette[m]
                    lines.append(line)
            panels.append((ylabel, lines))
        stem = _slug(setting)
        mine = written.setdefault(setting, [])
        if panels[0][1]:
            mine.append(plots.curves(out / f"{stem}-curves.{fmt}", title_here, seeds_note(counts), panels, layout))
        per_class = [(m, v) for m, runs in methods if (v := final_per_class(runs)) is not None]
        if per_class and len({len(v) for _, v in per_class}) == 1:
            values = 100 * np.stack([v for _, v in per_class])
            names = _class_names(methods[0][1][0], values.shape[1])
            mine.append(plots.heatmap(out / f"{stem}-per-class.{fmt}", title_here,
                                         "final per-class test accuracy (%), mean over seeds", values,
                                         [m for m, _ in per_class], names, "class", "method", "test accuracy (%)",
                                         fmt="{:.0f}", vmin=0.0, vmax=100.0, layout=layout))
        clients = []
        for m, runs in methods:
            if (line := final_client_accuracy(runs)) is not None:
                line.label, line.colour = m, palette[m]
                clients.append(line)
        if clients:
            mine.append(plots.curves(out / f"{stem}-clients.{fmt}", title_here,
                                     f"each client on its held-out samples, last evaluation; {seeds_note(counts)}",
                                     [("client accuracy (%)", clients)],
                                     layout, xlabel="clients, worst first (%)"))
    return written


def method_colours(c: Collection) -> dict[str, str]:
    """One colour per method label, the same in every figure and report: a label that is the only one
    of its algorithm takes that algorithm's colour (FedNTD's, whether the runs are a table's ``fedntd``
    or a folder's ``digits-lda0.1-fedntd``); labels that share an algorithm take colours of their own."""
    from mpifed.tables import plots
    labels = list(dict.fromkeys(m for _, m in c.groups))
    algorithm = {m: _algorithm(next((runs[0] for (_, k), runs in c.groups.items() if k == m and runs), None))
                 for m in labels}
    share = {a: sum(1 for m in labels if algorithm[m] == a) for a in algorithm.values()}
    keys = {m: algorithm[m] if algorithm[m] is not None and share[algorithm[m]] == 1 else m for m in labels}
    palette = plots.colours(list(keys.values()), [ALGORITHMS.display_name(n) for n in ALGORITHMS.names()])
    return {m: palette[keys[m]] for m in labels}


def _algorithm(run: Path | None) -> str | None:
    """The display name of the algorithm a run used, from its config.yaml (None where unreadable)."""
    try:
        name = safe_yaml.read(run / CONFIG)["algorithm"]["name"] if run is not None else None
    except (OSError, KeyError, TypeError, yaml.YAMLError):
        return None
    return ALGORITHMS.display_name(name) if name in ALGORITHMS.names() else None


def _class_names(run: Path, num_classes: int) -> list[str] | None:
    try:
        dataset = DATASETS.get(safe_yaml.read(run / CONFIG)["data"]["dataset"]["name"])
    except (OSError, yaml.YAMLError, KeyError, TypeError):
        return None
    return class_names(dataset, num_classes)


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text).strip("_") or "runs"
