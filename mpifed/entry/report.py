"""Figures and tables from finished runs: ``python -m mpifed.report RUNS_OR_TABLE... --out DIR``.

    python -m mpifed.report configs/repro/fedntd/table1.table.yaml --out report/     # a table's runs
    python -m mpifed.report runs/fedntd-table1 runs/my-run --out report/ --format pdf

Each input is a table file (its runs under ``--runs-root``, with ``--set`` picking the
configuration as ``python -m mpifed.table`` does), a run directory, or a folder of run
directories. Runs are grouped into methods: a table's methods, or for directories the run's
name without ``-s<seed>``; runs of different configurations are never put in one group.
For every setting (a table's setting, or the folder that holds the runs) it writes:

    <setting>-curves.<fmt>      test accuracy (%) and loss against round, one line per method,
                                mean ± sample std over the seeds as a band
    <setting>-per-class.<fmt>   the final model's per-class test accuracy (methods x classes,
                                named where the data set names them)

and for all inputs ``table.md``, ``table.csv`` and ``table.tex``: the table in its metric
(``--metric`` where given, else a table file's own, else final test accuracy), mean ± sample
std (n - 1) with n; for one table file what ``python -m mpifed.table TABLE --summary`` prints,
claims and Holm's adjustment included; the CSV with each method's paired difference with the
reference, the LaTeX with the clear best of each setting in bold. Methods are shown as papers
write them (fedntd: FedNTD), each in one colour in every figure; titles carry the table's title
and the ``--set`` overrides the runs were made with. Without matplotlib the tables are still written.
"""
from __future__ import annotations

import argparse
import csv
import io
import json
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import yaml

from mpifed.settings import config
from mpifed.run import results
from mpifed.files import safe_yaml
from mpifed.data.raw import class_names
from mpifed.files.pipes import quiet_when_pipe_closes
from mpifed.plugin.registry import ALGORITHMS, DATASETS
from mpifed.run.rundir import RunDir
from mpifed.run.run_records import CLIENT_ACC
from mpifed.tables.stats import paired
from mpifed.tables.summary import Runs, Summary, tabulate
from mpifed.tables.table_file import Table, finished_runs, load_table, resolve, stored_identity

if TYPE_CHECKING:
    from mpifed.tables.plots import Curve, Layout

FORMATS = ("png", "pdf", "svg")
_SEED_SUFFIX = re.compile(r"-s\d+(-[0-9a-f]{10})?$")


class ReportError(ValueError):
    """An input cannot be reported on."""


@dataclass
class Collection:
    """Finished run directories per (setting, method), the runs left out and why, the metric;
    ``title`` names the inputs and the overrides, ``figure_title`` the tables and the overrides."""

    title: str
    metric: results.Metric
    groups: dict[tuple[str, str], list[Path]] = field(default_factory=dict)
    left_out: list[str] = field(default_factory=list)
    figure_title: str = ""
    notes: list[str] = field(default_factory=list)        # settings split because their runs hold different data
    starts: dict[Path, str] = field(default_factory=dict)  # each run's initial model, in words (pairing needs one)
    identities: dict[Path, dict[str, Any]] = field(default_factory=dict)   # each run's result fingerprint
    table: Table | None = None     # the input, when it is one table file: its tables are what --summary prints


def collect(inputs: list[str], runs_root: str, added: list[str], metric: results.Metric | None,
            plugins: list[str] | None = None) -> Collection:
    """Group the runs of every input (see the module docstring), methods by their display names;
    a setting whose runs hold different data is split, one setting per data (:func:`split_by_data`)."""
    titles, tables = [], []
    out = Collection("", metric or results.Metric())
    for item in inputs:
        path = Path(item)
        if path.name.endswith(".table.yaml"):
            table = load_table(path, runs_root, plugins)
            resolve(table, added)
            groups, left_out, _, _ = finished_runs(table)
            out.identities.update({r.path: r.identity for r in table.runs})
            for key, runs in groups.items():
                out.groups.setdefault(key, []).extend(runs)
            out.left_out += left_out
            titles.append(table.title)
            tables.append(table.title)
            if metric is None:
                out.metric = table.metric
        elif path.is_dir():
            _collect_dirs(path, out)
            titles.append(str(path))
        else:
            raise ReportError(f"{item} is neither a table file (*.table.yaml) nor a folder of runs")
    if not any(out.groups.values()):
        raise ReportError("no finished runs found in " + ", ".join(inputs)
                          + (f" (left out: {'; '.join(out.left_out)})" if out.left_out else ""))
    overrides = f" (--set {' '.join(added)})" if added else ""
    out.title = "; ".join(titles) + overrides
    out.figure_title = "; ".join(tables) + overrides if tables else ""
    split_by_data(out)
    out.groups = with_display_names(out.groups)
    if len(inputs) == 1 and tables:
        out.table = table
    return out


def split_by_data(c: Collection) -> None:
    """Give each data a setting of its own: a setting whose runs hold different data (another data
    set, class set, partition, number of clients, subset or hold-out, or another plugin's code for
    them) becomes one setting per data, named by what differs, with a note; and note each run's
    initial model (``c.starts``), so that only runs that share it are paired."""
    found = c.identities
    c.starts = {run: _start(found[run]) for runs in c.groups.values() for run in runs if run in found}
    datas: dict[str, dict[str, dict[str, Any]]] = {}
    for (setting, _), runs in c.groups.items():
        for run in runs:
            if run in found:
                data = _data(found[run])
                datas.setdefault(setting, {})[config.digest(data)] = data
    groups: dict[tuple[str, str], list[Path]] = {}
    for (setting, method), runs in c.groups.items():
        kinds = datas.get(setting, {})
        for run in runs:
            name = setting
            if len(kinds) > 1 and run in found:
                name = f"{setting} ({_described(kinds, config.digest(_data(found[run])))})"
            groups.setdefault((name, method), []).append(run)
    c.groups = groups
    for setting, kinds in datas.items():
        if len(kinds) > 1:
            differ = ", ".join(k.removeprefix("data.") for k in _differing(kinds))
            c.notes.append(f"The runs of {setting} hold different data ({differ}): they are "
                           f"reported as {len(kinds)} settings, and no method is compared across them.")


def _data(identity: dict[str, Any]) -> dict[str, Any]:
    """What a run's clients and evaluation sets hold, from its result fingerprint."""
    code = identity.get("code") or {}
    data = {k: v for k, v in (identity.get("data") or {}).items() if k != "augment"}   # training-time only
    return {"data": data, "code": {k: code.get(k) for k in ("dataset", "partition")}}


def _start(identity: dict[str, Any]) -> str:
    """A run's initial model in words: the model with its options (and its plugin's hash)."""
    model = dict(identity.get("model") or {})
    name = model.pop("name", "?")
    sha = (identity.get("code") or {}).get("model")
    options = ", ".join(f"{k}={v}" for k, v in sorted(model.items()))
    return f"{name}" + (f" ({options})" if options else "") + (f" [code {sha[:8]}]" if sha else "")


def _differing(kinds: dict[str, dict[str, Any]]) -> list[str]:
    """The dotted keys on which the data of a setting's runs differ (a choice whose name differs
    counts once, by its name)."""
    first, *others = kinds.values()
    keys = list(dict.fromkeys(k for other in others for k in config.diff_keys(first, other)))
    renamed = [k.removesuffix(".name") for k in keys if k.endswith(".name")]
    return [k for k in keys if not any(k.startswith(f"{r}.") and k != f"{r}.name" for r in renamed)]


def _described(kinds: dict[str, dict[str, Any]], digest: str) -> str:
    return ", ".join(f"{k.removeprefix('data.')}={config.lookup(kinds[digest], k)}" for k in _differing(kinds)[:3])


def display_name(label: str) -> str:
    """A method label as papers write it: a registered method's name (or one followed by ``-``,
    ``_`` or a space, a variant) in its display form, e.g. fedntd: FedNTD, fedprox-mu0.01:
    FedProx-mu0.01; any other label as it is."""
    base = max((n for n in ALGORITHMS.names() if label == n or label.startswith((f"{n}-", f"{n}_", f"{n} "))),
               key=len, default=None)
    return label if base is None else ALGORITHMS.display_name(base) + label[len(base):]


def with_display_names(groups: dict[tuple[str, str], list[Path]]) -> dict[tuple[str, str], list[Path]]:
    """``groups`` with each method's display name, unless two of its labels would show as one."""
    labels = list(dict.fromkeys(m for _, m in groups))
    shown = {m: display_name(m) for m in labels}
    if len(set(shown.values())) < len(labels):
        return groups
    return {(s, shown[m]): runs for (s, m), runs in groups.items()}


def _collect_dirs(folder: Path, out: Collection) -> None:
    """Every run under ``folder`` (itself, or any folder below holding config.yaml), grouped by
    name without the seed and by configuration without the seed."""
    found = [folder] if (folder / "config.yaml").exists() else sorted(p.parent for p in folder.rglob("config.yaml"))
    keyed: dict[tuple[str, str, str], list[Path]] = {}
    for run in found:
        held = stored_identity(run)
        if isinstance(held, str) or held is None:
            out.left_out.append(f"{run}: {held or 'no config.yaml'}")
            continue
        state = RunDir(run).state()  # a dead "running" run reads as failed
        if state != "finished":
            out.left_out.append(f"{run}: {RunDir(run).why_left_out(state)}")
            continue
        out.identities[run] = held
        seedless = {**held, "run": {k: v for k, v in held["run"].items() if k != "seed"}}
        keyed.setdefault((run.parent.name, _SEED_SUFFIX.sub("", run.name), config.digest(seedless)), []).append(run)
    labels: dict[tuple[str, str], int] = {}
    for setting, label, _ in keyed:
        labels[(setting, label)] = labels.get((setting, label), 0) + 1
    for (setting, label, digest), runs in keyed.items():
        method = label if labels[(setting, label)] == 1 else f"{label} [{digest[:6]}]"
        out.groups.setdefault((setting, method), []).extend(runs)


def check_metric(c: Collection, given: str) -> None:
    """Refuse a ``--metric`` that none of the collected runs has a value for, listing those they have."""
    runs = [r for group in c.groups.values() for r in group]
    records = [(results.read_rows(r), results.read_json(r / "summary.json")) for r in runs]
    if any(results.value(c.metric, rows, summary) is not None for rows, summary in records):
        return
    held = set().union(*(_numeric(row) for rows, summary in records for row in [summary, *rows]))
    raise ReportError(f"--metric {given}: none of the runs has a value for it. Allowed: {', '.join(results.KINDS)} "
                      f"(of test_acc, or of a column: {{kind: best, column: ...}}), or a summary.json key or metrics "
                      f"column the runs hold: {', '.join(sorted(held))}")


def _numeric(d: dict[str, Any]) -> set[str]:
    """The keys of ``d`` that hold a number."""
    return {k for k, v in d.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}


# ------------------------------------------------------------------ tables
def tables_of(c: Collection) -> Summary:
    """The tables of the report: for one table file what ``python -m mpifed.table TABLE --summary``
    prints (its reference, declared seeds, claims with Holm's adjustment, diverged runs as it
    declares), in the metric given; for folders of runs their cells and each method against FedAvg."""
    if c.table is None:
        return tabulate(c.title, c.metric, Runs(c.groups, c.left_out, starts=c.starts), notes=c.notes)
    from mpifed.entry.table import summarize
    c.table.metric = c.metric
    summary = summarize(c.table)
    summary.notes += c.notes
    summary.display = {m: display_name(m) for m in summary.methods}
    return summary


PAIRED = ["vs", "difference", "ci_low", "ci_high", "seeds_ahead", "seeds", "p", "verdict"]


def csv_text(s: Summary) -> str:
    """One line per (setting, method, column): mean, sample std, n, the runs without a value; on the
    metric's own column, the method's paired difference with the reference seed by seed (its 95%
    interval, seeds ahead, p, verdict), or why it has none."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(["setting", "method", "column", "unit", "mean", "std", "n", "missing", *PAIRED])
    for setting in s.settings:
        for method in s.methods:
            for i, column in enumerate(s.columns):
                stat = s.cells.get((setting, method, column))
                if stat is None:
                    continue
                unit = "rounds" if column.startswith("T(") else ("%" if s.percent else "")
                paired_with = _paired_cells(s, setting, method) if i == 0 else [""] * len(PAIRED)
                w.writerow([setting, s.name(method), column, unit, _num(stat.mean), _num(stat.std), stat.n,
                            stat.missing, *paired_with])
    return buf.getvalue()


def _paired_cells(s: Summary, setting: str, method: str) -> list[Any]:
    if s.reference is None or method == s.reference:
        return [""] * len(PAIRED)
    if (setting, method) in s.unpaired:
        return [s.name(s.reference), "", "", "", "", "", "", f"not paired: {s.unpaired[(setting, method)]}"]
    found = s.paired.get((setting, method))
    if found is None:
        return [s.name(s.reference), "", "", "", "", "", "", "fewer than 2 common seeds"]
    return [s.name(s.reference), _num(found.mean), _num(found.low), _num(found.high), found.wins, found.n,
            _num(found.p), found.verdict]


def _num(x: float | None) -> str:
    return "" if x is None else f"{x:.6g}"


def latex(s: Summary) -> str:
    """A booktabs tabular: methods as rows, settings (x columns) as columns; a cell says its number of
    seeds only where it has fewer than the table declares (for folders: than the most any cell has);
    in each setting the best method in the metric's own column is bold where it is ahead of every other
    method seed by seed, its 95% interval excluding 0."""
    heads = [s_ if len(s.columns) == 1 else f"{s_}: {c}" for s_ in s.settings for c in s.columns]
    full = s.declared_seeds or max((stat.n + stat.missing for stat in s.cells.values()), default=0)
    best = {setting: _clear_best(s, setting) for setting in s.settings}
    lines = [f"% {s.title}: {s.metric.label}{' (%)' if s.percent else ''}, mean $\\pm$ sample std over {full} seeds "
             "(n where fewer finished); bold: ahead of every other method seed by seed (95% interval excluding 0)",
             "\\begin{tabular}{l" + "c" * len(heads) + "}", "\\toprule",
             "method & " + " & ".join(_tex(h) for h in heads) + " \\\\", "\\midrule"]
    for m in s.methods:
        cells = []
        for setting in s.settings:
            for i, column in enumerate(s.columns):
                text = _tex(_cell(s, setting, m, column, full)).replace("±", "$\\pm$")
                cells.append(f"\\textbf{{{text}}}" if i == 0 and best[setting] == m else text)
        lines.append(f"{_tex(s.name(m))} & " + " & ".join(cells) + " \\\\")
    lines += ["\\bottomrule", "\\end{tabular}"]
    return "\n".join(lines) + "\n"


def _cell(s: Summary, setting: str, method: str, column: str, full: int) -> str:
    """``71.29 ± 0.35``, with ``(n=2)`` only when fewer than ``full`` seeds have a value."""
    stat = s.cells.get((setting, method, column), results.Stat([]))
    if not stat.values:
        return "-"
    digits = 1 if column.startswith("T(") else 2
    spread = f" ± {stat.std:.{digits}f}" if stat.std is not None else ""
    return f"{stat.mean:.{digits}f}{spread}" + (f" (n={stat.n})" if stat.n < full else "")


def _clear_best(s: Summary, setting: str) -> str | None:
    """The method of ``setting`` whose metric is ahead of every other method's seed by seed (the 95%
    interval of the paired difference excluding 0 in its favour), if there is one."""
    lower = "loss" in s.metric.column or s.columns[0].startswith("T(")
    values = {m: s.by_seed.get((setting, m), {}) for m in s.methods if s.by_seed.get((setting, m))}
    if len(values) < 2 or any(key[0] == setting for key in s.unpaired):
        return None
    top = (min if lower else max)(values, key=lambda m: sum(values[m].values()) / len(values[m]))
    for other in values:
        if other != top:
            found = paired(values[top], values[other])
            if found is None or found.verdict != ("lower" if lower else "higher"):
                return None
    return top


def _tex(text: str) -> str:
    return re.sub(r"([_%&#$])", r"\\\1", text)


# ------------------------------------------------------------------ figures
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
        lines = (r / CLIENT_ACC).read_text().splitlines() if (r / CLIENT_ACC).exists() else []
        if lines:
            sorted_runs.append(sorted(a for a in json.loads(lines[-1])["acc"] if a is not None))
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
        name = safe_yaml.read(run / "config.yaml")["algorithm"]["name"] if run is not None else None
    except (OSError, KeyError, TypeError, yaml.YAMLError):
        return None
    return ALGORITHMS.display_name(name) if name in ALGORITHMS.names() else None


def _class_names(run: Path, num_classes: int) -> list[str] | None:
    try:
        dataset = DATASETS.get(safe_yaml.read(run / "config.yaml")["data"]["dataset"]["name"])
    except (OSError, yaml.YAMLError, KeyError, TypeError):
        return None
    return class_names(dataset, num_classes)


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text).strip("_") or "runs"


@quiet_when_pipe_closes
def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m mpifed.report", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("inputs", nargs="+", metavar="RUNS_OR_TABLE", help="table files, run directories or folders of runs")
    p.add_argument("--out", required=True, metavar="DIR", help="folder the figures and tables are written to")
    p.add_argument("--format", choices=FORMATS, default="png", help="figure format (default: png)")
    p.add_argument("--size", choices=("column", "page"), default="page",
                   help="figure width: one column (3.35 in) or a two-column paper's full width (6.9 in; default); "
                        "no text smaller than 7 pt at that size")
    p.add_argument("--width", type=float, metavar="INCHES", help="figure width in inches (instead of --size)")
    p.add_argument("--title", metavar="TEXT", help="the figures' title (default: the table's title and the setting)")
    p.add_argument("--no-title", action="store_true", help="figures without a title (a paper's caption says it)")
    p.add_argument("--runs-root", default="runs", help="where a table file's runs are (as for python -m mpifed.table)")
    p.add_argument("--plugin", action="append", default=[], metavar="FILE_OR_MODULE", help="load a Python file or "
                   "module of your own first (as for python -m mpifed.table); runs made with plugins need none, "
                   "they keep a copy of their code")
    p.add_argument("--set", action="append", nargs="+", default=[], metavar="KEY=VALUE",
                   help="a table file's overrides: report the runs made with them (as for python -m mpifed.table)")
    p.add_argument("--mlflow", action="store_true", help="also add the tables and each setting's figures to the MLflow "
                   "run of every reported run that has one (made with run.mlflow=true), under report/")
    p.add_argument("--metric", metavar="YAML", help="the metric to report, e.g. best or "
                   "'{kind: final, rounds_to: [0.8]}' (default: a table file's own metric, for folders final test "
                   "accuracy; a given --metric replaces a table's)")
    a = p.parse_args(argv)
    if a.width is not None and not 1.0 <= a.width <= 20.0:
        print(f"[mpifed.report] --width {a.width:g}: give the figure's width in inches, from 1 to 20 (a column is "
              f"3.35, a page 6.9)", file=sys.stderr)
        return 2
    from mpifed.tables import plots
    try:
        metric = None
        if a.metric:
            spec = safe_yaml.load(a.metric, f"--metric {a.metric!r}")
            metric = results.Metric.parse({"kind": spec} if spec in results.KINDS else spec)
        c = collect(a.inputs, a.runs_root, [o for group in a.set for o in group], metric, a.plugin)
        if metric is not None:
            check_metric(c, a.metric)
    except (ReportError, results.MetricError, config.ConfigError, yaml.YAMLError) as exc:
        print(f"[mpifed.report] {exc}", file=sys.stderr)
        return 2
    out = Path(a.out)
    summary = tables_of(c)
    for note in c.notes:
        print(f"[mpifed.report] warning: {note}", file=sys.stderr)
    tables = [out / "table.md", out / "table.csv", out / "table.tex"]
    drawn: dict[str, list[Path]] = {}
    try:
        out.mkdir(parents=True, exist_ok=True)
        (out / "table.md").write_text(summary.markdown() + "\n")
        (out / "table.csv").write_text(csv_text(summary))
        (out / "table.tex").write_text(latex(summary))
        try:
            plots.require()
            layout = plots.Layout(a.width or plots.SIZES[a.size], title=not a.no_title)
            drawn = figures(c, out, a.format, layout, a.title)
        except plots.PlotsUnavailable as exc:
            print(f"[mpifed.report] no figures: {exc}", file=sys.stderr)
    except OSError as exc:
        where = f"{exc.filename}: " if exc.filename and str(exc.filename) != str(out) else ""
        print(f"[mpifed.report] cannot write the report to --out {out} ({where}{exc.strerror}): give a folder you "
              f"can write to (a new or existing folder, not a file, not under /proc)", file=sys.stderr)
        return 2
    print(summary.markdown())
    print("\nwrote " + ", ".join(str(w) for w in tables + [f for fs in drawn.values() for f in fs]))
    if a.mlflow:
        return _to_mlflow(c, tables, drawn)
    return 0


def _to_mlflow(c: Collection, tables: list[Path], drawn: dict[str, list[Path]]) -> int:
    from mpifed.run.mlflow_log import log_report
    try:
        logged = [run_id for (setting, _), runs in c.groups.items()
                  for run_id in log_report(runs, tables + drawn.get(setting, []))]
    except RuntimeError as exc:
        print(f"[mpifed.report] --mlflow: {exc}", file=sys.stderr)
        return 2
    if not logged:
        print("[mpifed.report] --mlflow: none of these runs was tracked with MLflow (run.mlflow=true)", file=sys.stderr)
        return 2
    print(f"added the tables and figures to {len(logged)} MLflow runs, under report/")
    return 0


if __name__ == "__main__":
    sys.exit(main())
