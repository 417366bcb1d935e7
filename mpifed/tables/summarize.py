"""A table file's runs summarized: the table in its metric with each method against the reference and the
declared claims tested (:func:`summarize`), the search's scores as a report quotes them (:func:`search_table`),
and the text ``python -m mpifed.table TABLE --summary`` prints (:func:`summary_table`), or its pivot and LaTeX
(:func:`tex_or_pivot`)."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from mpifed.tables.latex import latex_table
from mpifed.tables.merge import other_machine_notes
from mpifed.tables.pivot import pivot
from mpifed.tables.summary import ClaimFamily, Runs, Summary, tabulate
from mpifed.tables.table_file import Table, finished_runs
from mpifed.tables.tuning import grid_cells, grid_columns


LEAVE_OUT = "out"      # --diverged out: leave diverged runs out, whatever the table declares


def summarize(table: Table, reference: str | None = None, diverged_as: float | str | None = None,
              mixed_machines: bool = False) -> Summary:
    """The table in its metric from the finished runs of the resolved configuration (see
    :func:`resolve`), with each method against ``reference`` (default: the table's, else FedAvg's row).
    A diverged final run counts as the table declares (its ``diverged`` value, else left out), or,
    as a sensitivity check, as ``diverged_as`` (a value, or :data:`LEAVE_OUT`). Runs of one seed made
    on machines that differ are not paired unless ``mixed_machines``."""
    if diverged_as is None:
        counted_as = table.diverged_value
    else:
        counted_as = None if diverged_as == LEAVE_OUT else float(diverged_as)
    counting = counted_as is not None
    groups, left_out, not_run, taken = finished_runs(table, with_diverged=counting)
    whole = table.whole or table
    seeds = {r.seed for r in table.runs}
    if len(table.runs) != len(whole.runs):
        family, _, _, taken = finished_runs(whole, lambda r: r.seed in seeds, with_diverged=counting)
    else:
        family = groups
    counted = dict.fromkeys(taken, counted_as)
    why = ("the table's declared value" if diverged_as is None
           else "--diverged on the command line: a sensitivity check, not the table's declaration")
    if diverged_as == LEAVE_OUT and table.diverged_value is not None:
        left_out.append(f"diverged runs left out by --diverged {LEAVE_OUT} (a sensitivity check: the table counts them "
                        f"as {table.diverged_value:g})")
    title = table.title + (f" (with --set {' '.join(table.added)})" if table.added else "")
    claims = ClaimFamily(table.claims, list(dict.fromkeys(r.setting for r in whole.runs)), family, table.claim_seeds,
                         table.not_a_test)
    return tabulate(title, table.metric, Runs(groups, left_out, not_run, counted_at=counted, counted_why=why,
                                              mixed_machines=mixed_machines),
                    paper_metric=table.paper_metric, reference=reference or table.reference,
                    declared_seeds=len(table.seeds), claims=claims,
                    notes=search_notes(table) + other_machine_notes(table.root.parent, [r.path for r in table.runs]),
                    paper_local_steps=table.paper_local_steps)


def search_notes(table: Table) -> list[str]:
    if table.tuning is None:
        return []
    percent = "acc" in table.tuning.select.column
    lines = [f"Tuned on the validation set ({table.tuning.describe()}); each method's choice and every candidate's "
             "score:"]
    for (setting, method), choice in table.choices.items():
        if choice.setting != setting:
            lines.append(f"  {setting} x {method}: the choice made on {choice.setting} (tuning.setting)")
            continue
        if not choice.search:
            lines.append(f"  {setting} x {method}: nothing to search (no grid)")
            continue
        edges = choice.edges()
        grown = choice.record.get("extended", [])
        lines.append(f"  {setting} x {method}: {choice.text(percent)}"
                     + (f"; the grid extended (tuning.extend): {'; '.join(grown)}" if grown else "")
                     + (f"; at the grid's edge ({'; '.join(edges)}): a value beyond it was not tried"
                        + (" (for an extended key: the next value would leave its bounds)" if grown else "")
                        if edges else ""))
    for setting, method in sorted(table.pending):
        if table.tuning.setting not in (None, setting):
            lines.append(f"  {setting} x {method}: waits for the search on {table.tuning.setting}")
            continue
        partial = table.searching.get((setting, method), [])
        lines.append(f"  {setting} x {method}: search not finished, {sum(c.settled for c in partial)} of "
                     f"{len(partial)} candidates scored (python -m mpifed.table ... --tune N)")
    return lines


def search_table(table: Table) -> str:
    """The search as a report quotes it: a row per setting and method, a column per value of the
    table-wide grid, the method's own candidates inside its cells, the choice in bold; a search not
    finished shows the scores it has so far, marked; empty before any candidate has its score."""
    if table.tuning is None:
        return ""
    grid = list(table.tuning.grid)
    percent = "acc" in table.tuning.select.column
    rows: dict[tuple[str, str], dict[str, str]] = {}
    shown: list[dict[str, Any]] = []
    for pair in dict.fromkeys((r.setting, r.method) for r in table.runs):
        choice, partial = table.choices.get(pair), table.searching.get(pair, [])
        if choice is not None and choice.search and choice.setting == pair[0]:
            rows[pair] = choice.grid_cells(grid, percent)
            shown += choice.record.get("candidates", [])
        elif any(c.settled for c in partial):
            done = sum(c.settled for c in partial)
            entries = [c.entry() for c in partial]
            rows[(pair[0], f"{pair[1]} (search not finished: {done} of {len(partial)} candidates)")] = grid_cells(
                entries, None, grid, percent)
            shown += entries
    if not rows:
        return ""
    columns = grid_columns(shown, grid)
    lines = [f"The search ({table.tuning.describe()}{', in %' if percent else ''}); the choice in bold", "",
             "| setting | method | " + " | ".join(columns) + " |", "| --- | --- |" + " --- |" * len(columns)]
    lines += [f"| {s} | {m} | " + " | ".join(cells.get(c, "-") for c in columns) + " |"
              for (s, m), cells in rows.items()]
    return "\n".join(lines)


def summary_table(table: Table, reference: str | None = None, by_seed: bool = False,
                  diverged_as: float | str | None = None, family: list[Table] | None = None,
                  mixed_machines: bool = False) -> str:
    """The table's summary (``by_seed``: with the search's scores and every seed's values); with
    ``family``, the other tables of a report, each claim also adjusted over all their claims."""
    s = summarize(table, reference, diverged_as, mixed_machines)
    if family:
        s.with_report_family([summarize(other, diverged_as=diverged_as, mixed_machines=mixed_machines)
                              for other in family])
    if not by_seed:
        return s.markdown()
    return "\n\n".join(part for part in (s.markdown(), search_table(table), s.seed_tables()) if part)


def tex_or_pivot(s: Summary, given: str | None, latex: str | None) -> str:
    """The summary ``s`` as a pivot (``given``: ``DOWN,ACROSS`` or empty for the first two keys), else
    as it prints; with ``latex``, also written there as a LaTeX table (what is printed says so)."""
    shown = s.markdown()
    tex = None
    if given is not None:
        down, _, across = given.partition(",")
        found = pivot(s, down.strip() or None, across.strip() or None)
        shown, tex = found.markdown(), found.latex() if latex else None
    if latex:
        Path(latex).write_text(tex or latex_table(s))
        shown += f"\n\nwrote {latex}"
    return shown
