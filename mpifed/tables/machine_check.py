"""Whether a table's searches choose the same when every candidate they compare ran on one machine.

A search whose candidates ran on different machines (a table resumed on a new machine, a grid
extended later with ``tuning.extend``) compares scores that differ between machines by more than
rounding: CPU kernels differ with the CPU's vector units. ``--recheck FOLDER`` groups each
search's scored candidates by the machine their runs recorded (:func:`mpifed.run.provenance.hardware`;
runs recorded before mpifed wrote the CPU's identity form one group, ``unrecorded``), runs the best
candidate of every group but this machine's again here, into ``FOLDER``, and says whether the
search, with this machine's scores only, chooses what it chose; a re-run whose metrics repeat its
run's round by round says that the two machines computed that candidate identically. The table's
runs and choices are not touched; the re-runs resume like any run, so the command can be repeated.
A folder whose re-runs ran on another machine (an archived recheck) is read as that machine's:
its verdicts are printed, and nothing is run.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mpifed.run import provenance, results
from mpifed.run.rundir import PROVENANCE, RunDir
from mpifed.settings.config import ConfigError
from mpifed.tables.table_file import Table, TableRun, stored_identity
from mpifed.tables.tuning import Candidate, SearchChoice, choose, label, score_candidate
from mpifed.run.state import RunState

HERE = "this machine"
UNRECORDED = "unrecorded"


def this_machine() -> dict[str, frozenset[str]]:
    """This machine as :func:`mpifed.run.provenance.hardware` reads a CPU run's record (a run on a GPU
    records its GPU too: :func:`rechecked_on` reads that from the re-runs)."""
    import torch
    found = {"cpu_id": provenance.cpu_id(), "blas": provenance.blas(), "gpu": None, "torch": torch.__version__}
    return {k: frozenset([v]) if v else frozenset() for k, v in found.items()}


def rechecked_on(table: Table, folder: Path) -> dict[str, frozenset[str]] | None:
    """The machine the re-runs already under ``folder`` for ``table`` ran on (an archived recheck, read
    on any machine), None where there are none; an error where they come from several."""
    found = {tuple(sorted(provenance.hardware(provenance.read(p.parent) or {}).items()))
             for p in (folder / table.root.name / "tuning").glob(f"*/{PROVENANCE}")}
    if len(found) > 1:
        raise ConfigError(f"--recheck {folder}: its re-runs of {table.root.name} come from {len(found)} machines; a "
                          f"recheck is made on one: give each machine a folder of its own")
    return dict(found.pop()) if found else None


def same_cpu(a: dict[str, frozenset[str]], b: dict[str, frozenset[str]]) -> bool:
    """Whether two :func:`mpifed.run.provenance.hardware` records name the same CPU, BLAS and torch
    (the GPU aside: a machine's CPU runs record none)."""
    return all(a.get(k, frozenset()) == b.get(k, frozenset()) for k in ("cpu_id", "blas", "torch"))


def machine_of(run_dir: Path, here: dict[str, frozenset[str]]) -> str:
    """The machine a run recorded: :data:`HERE`, :data:`UNRECORDED` (no CPU identity), or its CPU
    identity (with its GPU, BLAS or torch where those differ from this machine's)."""
    found = provenance.read(run_dir)
    held = provenance.hardware(found) if found else {}
    if held == here:
        return HERE
    if not held.get("cpu_id"):
        return UNRECORDED
    parts = [" + ".join(sorted(held["cpu_id"]))]
    parts += [f"{k} {' + '.join(sorted(held[k])) or 'none'}" for k in ("gpu", "blas", "torch")
              if held.get(k, frozenset()) != here[k]]
    return "; ".join(parts)


@dataclass
class Group:
    """A search's candidates from one machine: the best of them, its score there, and its re-runs
    here (none for this machine's own group)."""

    machine: str
    best: dict[str, Any]
    score: float
    reruns: list[TableRun] = field(default_factory=list)
    sources: list[Path] = field(default_factory=list)     # the runs there, one per re-run


@dataclass
class Recheck:
    """One search whose candidates come from more than one machine."""

    choice: SearchChoice
    groups: list[Group]
    here_scores: list[tuple[dict[str, Any], float]]      # this machine's own candidates, as recorded
    missing: list[str] = field(default_factory=list)     # candidates' runs the table no longer lists


def plan(table: Table, folder: Path, here: dict[str, frozenset[str]]) -> list[Recheck]:
    """Each search of ``table`` whose scored candidates ran on more than one machine, with the runs
    to make on ``here`` (:func:`this_machine`, or the machine of archived re-runs), under
    ``folder``/<table folder>/tuning, for the best candidate of each other machine."""
    if table.tuning is None:
        return []
    search_runs = {r.path: r for r in table.search}
    target = folder / table.root.name / "tuning"
    lower = "loss" in table.tuning.select.column
    out = []
    for choice in table.choices.values():
        groups: dict[str, list[dict[str, Any]]] = {}
        for c in choice.record.get("candidates", []):
            if isinstance(c.get("score"), (int, float)) and c.get("runs"):
                machines = sorted({machine_of(table.root / p, here) for p in c["runs"]})
                groups.setdefault(" + ".join(machines), []).append(c)
        if len(groups) < 2:
            continue
        found: list[Group] = []
        here_scores: list[tuple[dict[str, Any], float]] = []
        missing = []
        for machine, cands in groups.items():
            best = min(cands, key=lambda c: c["score"] if lower else -c["score"])
            if machine == HERE:
                here_scores = [(c["values"], c["score"]) for c in cands]
                found.append(Group(machine, best["values"], best["score"]))
                continue
            runs = [search_runs.get(table.root / p) for p in best["runs"]]
            if any(r is None for r in runs):
                missing.append(label(best["values"]))
                continue
            reruns = [dataclasses.replace(r, root=target) for r in runs if r is not None]
            for r in reruns:
                held = stored_identity(r.path)
                if held is not None and held != r.identity:
                    raise ConfigError(f"--recheck {folder}: {r.path} holds a run of another configuration than "
                                      f"{r.name}'s; give --recheck a folder of its own for this table")
            found.append(Group(machine, best["values"], best["score"], reruns,
                               [table.root / p for p in best["runs"]]))
        out.append(Recheck(choice, found, here_scores, missing))
    return out


def _trained_alike(group: Group) -> bool:
    """Whether every re-run wrote the same metrics, round by round, as its run there (timings aside):
    the two machines computed this candidate identically."""
    def rows(path: Path) -> list[dict[str, Any]]:
        return [{k: v for k, v in row.items() if k != "time"} for row in results.read_rows(path)]
    return all(rows(r.path) == rows(src) for r, src in zip(group.reruns, group.sources))


def _rescored(group: Group, table: Table) -> Candidate:
    assert table.tuning is not None
    return score_candidate(group.best, [(r.path, RunDir(r.path).state() or RunState.NEW) for r in group.reruns],
                           table.tuning.select)


def report(checks: list[Recheck], table: Table, here: dict[str, frozenset[str]]) -> str:
    """The checks as a table: each machine's best candidate with its score there and on ``here``, and
    the choice the search makes from ``here``'s scores only (where every re-run has settled)."""
    assert table.tuning is not None
    percent = "acc" in table.tuning.select.column

    def shown(score: float | None) -> str:
        if score is None:
            return "-"
        return f"{100 * score:.2f}" if percent else f"{score:.4g}"

    if not checks:
        return (f"every search of {table.root.name} compared candidates from one machine (or from runs that "
                f"recorded none): nothing to recheck")
    lines = [f"Searches whose candidates ran on more than one machine ({table.tuning.select.label}"
             f"{', in %' if percent else ''}); each machine's best candidate run again on this machine "
             f"({' + '.join(sorted(here['cpu_id'])) or 'CPU identity unknown'}):", "",
             "| setting | method | chosen | each machine's best: there -> here | chosen on this machine |",
             "| --- | --- | --- | --- | --- |"]
    held = moved = waiting = identical = reran = 0
    for check in checks:
        one_machine = [Candidate(values, [], [score]) for values, score in check.here_scores]
        reran += sum(g.machine != HERE for g in check.groups)
        cells, settled = [], True
        for g in check.groups:
            if g.machine == HERE:
                cells.append(f"{label(g.best)} ({HERE}): {shown(g.score)}")
                continue
            again = _rescored(g, table)
            settled = settled and again.settled
            alike = again.settled and _trained_alike(g)
            cells.append(f"{label(g.best)} ({g.machine}): {shown(g.score)} -> "
                         f"{shown(again.score) if again.score is not None else ('diverged' if again.failed else '-')}"
                         + (", every round identical" if alike else ""))
            identical += alike
            one_machine.append(again)
        cells += [f"{name}: its runs are not in the table any more, not re-run" for name in check.missing]
        if check.missing:
            verdict = "not checked: a machine's best is not re-run"
        elif not settled:
            verdict, waiting = "not run yet", waiting + 1
        else:
            chosen = choose(one_machine, table.tuning.select)
            if chosen == check.choice.chosen:
                verdict, held = "the same", held + 1
            else:
                verdict, moved = (f"**{label(chosen)}**" if chosen else "none (all failed)"), moved + 1
        lines.append(f"| {check.choice.setting} | {check.choice.method} | {label(check.choice.chosen)} | "
                     f"{'; '.join(cells)} | {verdict} |")
    unchecked = sum(bool(c.missing) for c in checks)
    lines += ["", f"{len(checks)} searches compared candidates from more than one machine: {held} choose the same "
                  f"on this machine, {moved} another" + (f", {waiting} wait for their re-runs" if waiting else "")
              + (f", {unchecked} cannot be checked" if unchecked else "")
              + f"; {identical} of the {reran} re-run candidates trained identically, round by round, on both machines"]
    return "\n".join(lines)
