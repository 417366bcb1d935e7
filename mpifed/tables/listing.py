"""A table's runs listed (``python -m mpifed.table TABLE --list``): a grid of each run's value or state, or a
line per run with its state and arguments, then what its runs lack and the time left."""
from __future__ import annotations

import shlex
from pathlib import Path

from mpifed.run import results
from mpifed.settings import config
from mpifed.tables.estimate import estimate
from mpifed.tables.summary import run_value
from mpifed.tables.table_file import Table, TableRun, settled, status
from mpifed.run.state import RunState


def listing(table: Table, added: list[str], commands: bool = False) -> str:
    """The table's runs as a grid, a row per setting x method (and search candidate) and a column
    per seed: each finished run's value in the metric (a search run's score), each other run's
    state (``diverged``: failed with a NaN loss, not run again; ``search``: waits for its search;
    ``no data``, ``no tokenizer``: what it needs is missing); with ``commands``, instead a line per run
    with its state and mpifed arguments, marked where its data is missing. Then the folders the
    missing data is expected in (a settled run, finished or diverged, needs none: archived runs read
    on a machine without the data are counted as such), and the estimated time left."""
    from mpifed.preparation.spec import raw_data_missing
    folders: set[str] = set()
    tokenizers: set[str] = set()
    marks: dict[Path, str] = {}
    archived = 0
    for r in _listed(table):
        cfg = config.build(r.resolved)
        missing = raw_data_missing(cfg)
        if missing is not None and settled(r.path):
            archived += 1
        elif missing is not None:
            tokenizer = cfg.data.tokenizer is not None and missing == Path(cfg.data.tokenizer)
            (tokenizers if tokenizer else folders).add(str(missing))
            marks[r.path] = f"[{'tokenizer' if tokenizer else 'raw data'} missing: expects {missing}]"
    lines = _commands(table, added, marks) if commands else _grids(table, {
        path: "no tokenizer" if mark.startswith("[tokenizer") else "no data" for path, mark in marks.items()})
    count = len(marks)
    waiting = [r for r in table.runs if (r.setting, r.method) in table.pending]
    if waiting:
        pairs = sorted({(r.setting, r.method) for r in waiting})
        lines.append(f"{len(waiting)} runs of {len(pairs)} setting x method pairs wait for their search to finish "
                     f"(--tune N, or --run N which searches first)")
    if folders:
        lines.append("runs lack their raw data; put it in (or point data.dataset.root "
                     "at): " + ", ".join(sorted(folders)))
    if tokenizers:
        lines.append("runs lack their tokenizer folder; save the tokenizer there (docs/text.md), or point "
                     "data.tokenizer at one: " + ", ".join(sorted(tokenizers)))
    if count:
        lines.append(f"{count} of {len(table.runs) + len(table.search)} runs cannot start until then")
    if archived:
        lines.append(f"{archived} of {len(table.runs) + len(table.search)} runs are finished (archived): each "
                     f"settled (finished or diverged) in the runs root, its raw data absent on this machine, which "
                     f"only running it again would need")
    eta = estimate(table)
    if eta:
        lines.append(eta)
    if not commands:
        lines.append("(--list --commands: each run's state and mpifed arguments)")
    return "\n".join(lines)


def _listed(table: Table) -> list[TableRun]:
    """The runs a listing shows: the search's, then the table's whose search has finished."""
    return table.search + [r for r in table.runs if (r.setting, r.method) not in table.pending]


def _commands(table: Table, added: list[str], marks: dict[Path, str]) -> list[str]:
    return [f"{status(r):>9}  {'search ' if r.candidate is not None else ''}{shlex.join(r.args(added))}"
            + (f"  {marks[r.path]}" if r.path in marks else "") for r in _listed(table)]


def _grids(table: Table, no_data: dict[Path, str]) -> list[str]:
    """The search's grid (while it has runs to make) and the table's: a cell per run."""
    out: list[str] = []
    if table.tuning is not None and any(not settled(r.path) for r in table.search):
        rows: dict[tuple[str, ...], dict[int, str]] = {}
        for r in table.search:
            rows.setdefault((r.setting, r.method, r.candidate or ""), {})[r.seed] = _cell(r, table.tuning.select,
                                                                                           no_data)
        out += [f"The search: {table.tuning.select.label} of each candidate (in points where a fraction), or its "
                f"state", *_aligned(("setting", "method", "candidate"), sorted({r.seed for r in table.search}), rows),
                ""]
    rows = {}
    for r in table.runs:
        cell = "search" if (r.setting, r.method) in table.pending else _cell(r, table.metric, no_data)
        rows.setdefault((r.setting, r.method), {})[r.seed] = cell
    out += [f"{table.title}: {table.metric.label} of each finished run (in points where a fraction), or its state",
            *_aligned(("setting", "method"), sorted({r.seed for r in table.runs}), rows)]
    return out


def _cell(r: TableRun, metric: results.Metric, no_data: dict[Path, str]) -> str:
    state = status(r)
    if state != RunState.FINISHED:
        return no_data.get(r.path, state) if state == RunState.NEW else state
    value = run_value(metric, r.path)
    return f"{value:.2f}" if value is not None else "finished"


def _aligned(names: tuple[str, ...], seeds: list[int], rows: dict[tuple[str, ...], dict[int, str]]) -> list[str]:
    header = [*names, *(f"s{s}" for s in seeds)]
    body = [[*key, *(cells.get(s, "") for s in seeds)] for key, cells in rows.items()]
    widths = [max(len(line[i]) for line in [header, *body]) for i in range(len(header))]
    return ["  ".join(text.ljust(w) if i < len(names) else text.rjust(w) for i, (text, w) in
                      enumerate(zip(line, widths))).rstrip() for line in [header, *body]]
