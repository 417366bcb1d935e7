"""A table's runs made (``python -m mpifed.table TABLE --run N``, ``--tune N``): the search first where the table
has one still to choose, then the runs and the summary; what that would run (:func:`dry_run`); the runs as lines
for a job array (:func:`write_runs`); runs taken from other folders instead (:func:`reuse`); a search across
machines run again on this one (:func:`recheck`). ``reload`` reads the table again (its search's choice written
down), as the command line selected it."""
from __future__ import annotations

import shlex
import sys
from pathlib import Path
from typing import Callable

from mpifed.settings import config
from mpifed.tables import machine_check
from mpifed.tables.run_queue import Job, launcher, run_jobs
from mpifed.tables.summarize import search_notes, summary_table
from mpifed.tables.table_file import Table, TableRun, settled, status
from mpifed.tables.table_store import reuse_runs, settled_runs_under


def run_all(runs: list[TableRun], ranks: int, added: list[str], again: str, parallel: int = 1) -> tuple[int, int]:
    """Run the unfinished ``runs`` (``parallel`` at a time); returns (exit code, runs skipped because
    another process is running them). A stop signal ends the table after the runs in progress
    have stopped cleanly; a failure, after they have finished."""
    todo = [r for r in runs if not settled(r.path)]
    jobs = [Job(r.path, r.args(added), r.root / "logs" / f"{r.name}.txt" if r.candidate is None
                else r.root.parent / "logs" / "tuning" / f"{r.name}.txt") for r in todo]
    out = run_jobs(jobs, ranks, parallel, say=lambda text: print(f"[mpifed.table] {text}", flush=True))
    if out.received:
        print(f"[mpifed.table] {', '.join(dict.fromkeys(out.received))} received: the table stopped after the runs in "
              f"progress (exit code {out.code}). Continue it with:\n  {again}", file=sys.stderr, flush=True)
    elif out.failed:
        print(f"[mpifed.table] stopping after {len(out.failed)} failed run(s). Continue the table with:\n  {again}",
              file=sys.stderr, flush=True)
    return out.code, out.skipped


def write_runs(table: Table, added: list[str], path: str) -> str:
    """Write one line of mpifed arguments per run to ``path`` (the search's unfinished runs while it has a
    choice to make, else the table's), for slurm/array.sbatch; what to submit, in words."""
    if table.pending:
        runs = [r for r in table.search if not settled(r.path)]
        Path(path).write_text("".join(shlex.join(r.args(added)) + "\n" for r in runs))
        return (f"{len(runs)} search runs written to {path}; submit them with:\n{_submit(len(runs), path)}\n"
                f"when they have finished, run --write-runs again: it makes the choice and writes the table's runs")
    Path(path).write_text("".join(shlex.join(r.args(added)) + "\n" for r in table.runs))
    return f"{len(table.runs)} runs written to {path}; submit with:\n{_submit(len(table.runs), path)}"


def _submit(count: int, path: str) -> str:
    """The sbatch command of an array of ``count`` runs listed in ``path``, after the command that
    writes the job scripts where a pip install has none (``mpifed slurm``)."""
    made = "" if Path("slurm/array.sbatch").is_file() else \
        "  mpifed slurm        # writes the job scripts into ./slurm\n"
    return f"{made}  sbatch --array=0-{count - 1} slurm/array.sbatch {path}"


def reuse(table: Table, folders: list[str], reload: Callable[[], Table]) -> int:
    """--reuse: copy identical runs in from ``folders``, again after each search they complete, until none is left."""
    found: dict[str, list[Path]] = {}
    for folder in map(Path, folders):
        if not folder.is_dir():
            raise config.ConfigError(f"--reuse {folder}: no such folder")
        for digest, paths in settled_runs_under(folder).items():
            found.setdefault(digest, []).extend(paths)
    reused = 0
    while copied := reuse_runs(table, found):
        for source, r in copied:
            print(f"[mpifed.table] reused {source} as {r.path}", flush=True)
        reused += len(copied)
        table = reload()
    left = sum(not settled(r.path) for r in table.search + table.runs)
    waiting = sum((r.setting, r.method) in table.pending for r in table.runs)
    print(f"[mpifed.table] {reused} runs reused from {', '.join(folders)}; {left} of the table's runs still to make"
          + (f", {waiting} of them after their search" if waiting else "") + " (--list shows them)")
    return 0


def recheck(table: Table, folder: Path, added: list[str], again: str, parallel: int = 1) -> int:
    """--recheck: each mixed-machine search's other machines' best candidates run here, into ``folder``
    (``parallel`` at a time), then the verdicts."""
    if folder.resolve() == table.root.parent.resolve():
        raise config.ConfigError(f"--recheck {folder}: that is the table's own runs folder; name another")
    here, held = machine_check.this_machine(), machine_check.rechecked_on(table, folder)
    if held is not None and not machine_check.same_cpu(held, here):
        cpu = " + ".join(sorted(held["cpu_id"])) or "no CPU identity"
        print(f"[mpifed.table] {folder}'s re-runs ran on another machine ({cpu}): their verdicts, nothing run here "
              f"(a recheck of this machine needs a folder of its own)", flush=True)
        print(machine_check.report(machine_check.plan(table, folder, held), table, held))
        return 0
    reruns = [r for check in machine_check.plan(table, folder, held or here) for g in check.groups for r in g.reruns]
    if reruns:
        code, _ = run_all(reruns, 0, added, again, parallel)
        if code != 0:
            return code
    here = machine_check.rechecked_on(table, folder) or here        # as the re-runs recorded it (their GPU)
    print(machine_check.report(machine_check.plan(table, folder, here), table, here))
    return 0


def run_table(table: Table, ranks: int, tune_only: bool, added: list[str], again: str, reload: Callable[[], Table],
              parallel: int = 1, reference: str | None = None) -> int:
    """--tune (``tune_only``) and --run: the search first (where the table has one still to choose, or with
    --tune), with ``ranks`` ranks a run (0: the debug mode), then (--run) the table's runs and its summary
    against ``reference``; the exit code."""
    skipped = 0
    if table.tuning is not None and (table.pending or tune_only):
        tried: set[Path] = set()
        while True:
            tried |= {r.path for r in table.search}
            code, skipped = run_all(table.search, ranks, added, again, parallel)
            if code != 0:
                return code
            table = reload()
            # a choice at an end of an extended key (tuning.extend) adds candidates: run those too
            if skipped or not table.pending or {r.path for r in table.search} <= tried:
                break
        for line in search_notes(table):
            print(f"[mpifed.table] {line}", flush=True)
        if tune_only or table.pending:
            if skipped:
                print(f"[mpifed.table] {skipped} search runs are running elsewhere; the choice is made once they "
                      f"finish", flush=True)
            return 0
    code, more = run_all(table.runs, ranks, added, again, parallel)
    skipped += more
    if code != 0:
        return code
    if skipped:
        print(f"[mpifed.table] {skipped} runs were skipped because other processes are running them; --summary "
              f"counts them once they finish", flush=True)
    print(summary_table(table, reference))
    return 0


def dry_run(table: Table, ranks: int, tune_only: bool, added: list[str], parallel: int = 1) -> str:
    """What ``--run``/``--tune`` (``tune_only``) would do now, written nothing: the runs it would make (the
    search's first, where it has one still to choose), each with its directory and command."""
    searching = table.tuning is not None and (table.pending or tune_only)
    todo = [r for r in (table.search if searching else table.runs) if not settled(r.path)]
    how = f"{ranks} ranks each" if ranks else "the debug mode (one process each)"
    lines = [f"# dry run: nothing was written. Now {len(todo)} {'search ' if searching else ''}runs would run, with "
             f"{how}, {parallel} at a time:"]
    start = shlex.join(["python", *launcher(ranks)[1:]])
    lines += [f"{r.path}  ({status(r)}): {start} {shlex.join(r.args(added))}" for r in todo]
    if searching and not tune_only:
        waiting = sum((r.setting, r.method) in table.pending for r in table.runs)
        lines.append(f"# then the choice of each search, and the table's {waiting} runs that wait for it")
    elif not todo:
        lines.append("# nothing to run: every run is settled (finished or diverged); --summary reports them")
    return "\n".join(lines)
