"""A sweep's summary as a pivot: its metric with one swept key down and another across.

A sweep's points are labelled by their values (``lr=0.01+beta=0.1``, see :mod:`mpifed.tables.sweep`);
the pivot puts one key's values down (rows) and another's across (columns), each cell the point's
mean ± sample std over seeds, in the order the sweep gave the values. A sweep of three or more keys
keeps the keys it does not spread across in the row label. Printed as markdown, and as LaTeX (a
float that compiles as it is, in bold the best point and every point the seeds cannot tell from it,
see :mod:`mpifed.tables.latex`).
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from mpifed.run import results
from mpifed.tables.latex import bold, column_spec, digits, escape, lower_is_better, number
from mpifed.tables.summary import Summary


class PivotError(ValueError):
    """The summary is not a sweep of two keys or more, or names a key it does not sweep."""


def point_values(label: str) -> dict[str, str]:
    """A point's label as its key -> value: ``lr=0.01+beta=0.1`` -> ``{"lr": "0.01", "beta": "0.1"}``."""
    parts = re.split(r"\+(?=[A-Za-z_][\w.]*=)", label)
    return dict(part.split("=", 1) for part in parts if "=" in part)


@dataclass
class Pivot:
    """The cells of a pivot: (row, column) -> the point it shows, its rows and columns in order."""

    summary: Summary
    down: str
    across: str
    rows: list[str]
    columns: list[str]
    points: dict[tuple[str, str], str]

    def stat(self, row: str, column: str) -> results.Stat:
        point = self.points.get((row, column))
        s = self.summary
        return s.cells.get((s.settings[0], point, s.columns[0]), results.Stat([])) if point else results.Stat([])

    def markdown(self) -> str:
        """The pivot as a markdown table, headed by the metric."""
        s = self.summary
        places = digits(s.columns[0])
        lines = [f"{s.title}: {s.columns[0]}{' (%)' if s.percent else ''}, {self.down} down, {self.across} across", "",
                 f"| {self.down} | " + " | ".join(f"{self.across}={c}" for c in self.columns) + " |",
                 "| --- |" + " --- |" * len(self.columns)]
        for row in self.rows:
            lines.append(f"| {row} | " + " | ".join(self.stat(row, c).text(places, declared=s.declared_seeds)
                                                  for c in self.columns) + " |")
        return "\n".join(lines)

    def latex(self, caption: str | None = None, label: str = "tab:sweep", numbers: str = "siunitx") -> str:
        """The pivot as a LaTeX table float (see :func:`mpifed.tables.latex.latex_table`)."""
        s = self.summary
        places = digits(s.columns[0])
        full = s.declared_seeds or max((st.n + st.missing for st in s.cells.values()), default=0)
        strong = bold({p: s.by_seed.get((s.settings[0], p), {}) for p in self.points.values()}, lower_is_better(s))
        specs = "".join(column_spec([self.stat(r, c) for r in self.rows], places, numbers) for c in self.columns)
        unit = " (\\%)" if s.percent else ""
        said = escape(caption) if caption is not None else (
            f"{escape(s.title)}: {escape(s.columns[0])}{unit}, mean $\\pm$ sample standard "
            f"deviation over {full} seeds, {escape(self.down)} down, {escape(self.across)} across. Bold: the best, "
            f"and every point whose paired 95\\% interval against it contains 0.")
        wrap = (lambda h: f"{{{h}}}") if numbers == "siunitx" else (lambda h: h)
        lines = ["\\begin{table}[t]", "\\centering", f"\\caption{{{said}}}", f"\\label{{{label}}}",
                 f"\\begin{{tabular}}{{l{specs}}}", "\\toprule",
                 f"{escape(self.down)} & " + " & ".join(wrap(escape(f"{self.across}={c}")) for c in self.columns)
                 + " \\\\", "\\midrule"]
        for row in self.rows:
            cells = [number(self.stat(row, c), places, numbers, self.points.get((row, c)) in strong, full)
                     for c in self.columns]
            lines.append(f"{escape(row)} & " + " & ".join(cells) + " \\\\")
        lines += ["\\bottomrule", "\\end{tabular}", "\\end{table}"]
        return "\n".join(lines) + "\n"


def pivot(s: Summary, down: str | None = None, across: str | None = None) -> Pivot:
    """The pivot of the sweep summary ``s``: ``down`` and ``across`` are swept keys as the point labels
    name them (default: the first two)."""
    values = {m: point_values(m) for m in s.methods}
    keys = list(dict.fromkeys(k for v in values.values() for k in v))
    if len(keys) < 2 or any(set(v) != set(keys) for v in values.values()):
        raise PivotError(f"--pivot needs a sweep of two keys or more (points labelled like lr=0.01+beta=0.1); this "
                         f"summary's rows are {', '.join(s.methods[:4])}")
    down, across = down or keys[0], across or next(k for k in keys if k != (down or keys[0]))
    for key in (down, across):
        if key not in keys:
            raise PivotError(f"--pivot {key}: not a key of this sweep; its keys are {', '.join(keys)}")
    if down == across:
        raise PivotError(f"--pivot {down},{across}: give two different keys of the sweep ({', '.join(keys)})")
    rest = [k for k in keys if k not in (down, across)]

    def row_of(v: dict[str, str]) -> str:
        return "+".join([v[down], *(f"{k}={v[k]}" for k in rest)])
    points = {(row_of(v), v[across]): m for m, v in values.items()}
    rows = list(dict.fromkeys(row_of(v) for v in values.values()))
    columns = list(dict.fromkeys(v[across] for v in values.values()))
    return Pivot(s, down, across, rows, columns, points)
