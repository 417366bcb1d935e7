"""A report's tables: the summary of its runs (:func:`tables_of`), as CSV with each method's paired
difference from the reference (:func:`csv_text`) and as LaTeX with the clear best of each setting in bold
(:func:`latex`)."""
from __future__ import annotations

import csv
import io
import re
from pathlib import Path
from typing import Any

from mpifed.run import results
from mpifed.tables.collection import Collection, display_name
from mpifed.tables.stats import paired
from mpifed.tables.summary import Runs, Summary, tabulate


def tables_of(c: Collection) -> Summary:
    """The tables of the report: for one table file what ``python -m mpifed.table TABLE --summary``
    prints (its reference, declared seeds, claims with Holm's adjustment, diverged runs as it
    declares), in the metric given; for folders of runs their cells and each method against FedAvg."""
    if c.table is None:
        return tabulate(c.title, c.metric, Runs(c.groups, c.left_out, starts=c.starts), notes=c.notes)
    from mpifed.tables.summarize import summarize
    c.table.metric = c.metric
    summary = summarize(c.table)
    summary.notes += c.notes
    summary.display = {m: display_name(m) for m in summary.methods}
    return summary



def write_tables(s: Summary, out: Path) -> list[Path]:
    """Write the tables into the folder ``out`` (made if need be): table.md (as ``--summary`` prints it),
    table.csv (:func:`csv_text`) and table.tex (:func:`latex`); the files written."""
    out.mkdir(parents=True, exist_ok=True)
    written = [out / "table.md", out / "table.csv", out / "table.tex"]
    for path, text in zip(written, (s.markdown() + "\n", csv_text(s), latex(s))):
        path.write_text(text)
    return written

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
