"""A report's tables: the summary of its runs (:func:`tables_of`), as CSV with each method's paired
difference from the reference (:func:`csv_text`) and as LaTeX (:mod:`mpifed.tables.latex`): a
float in bold the best of each setting and the methods the seeds cannot tell from it."""
from __future__ import annotations

import csv
import io
from pathlib import Path
from typing import Any

from mpifed.tables.collection import Collection, display_name
from mpifed.tables.latex import latex_table
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


def write_tables(s: Summary, out: Path, caption: str | None = None, label: str = "tab:results",
                 numbers: str = "siunitx") -> list[Path]:
    """Write the tables into the folder ``out`` (made if need be): table.md (as ``--summary`` prints it),
    table.csv (:func:`csv_text`) and table.tex (a float with ``caption``, ``label`` and ``numbers``:
    :func:`mpifed.tables.latex.latex_table`); the files written."""
    out.mkdir(parents=True, exist_ok=True)
    written = [out / "table.md", out / "table.csv", out / "table.tex"]
    for path, text in zip(written, (s.markdown() + "\n", csv_text(s), latex_table(s, caption, label, numbers))):
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
