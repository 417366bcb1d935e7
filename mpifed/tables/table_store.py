"""A table's settled runs on disk: archived without weights for a repository, reused by another
table whose runs have the same configuration, and pruned of their checkpoints and client state."""
from __future__ import annotations

import os
from pathlib import Path

from mpifed.tables import archive
from mpifed.settings import config
from mpifed.run.rundir import CONFIG, RunDir, RunLocked
from mpifed.tables.table_file import Table, TableRun, settled, status, stored_identity
from mpifed.tables.tuning import CHOICES
from mpifed.run.state import RunState
from mpifed.run.record import RunRecord


def archive_table(table: Table, dest: Path, summary_command: str) -> str:
    """Copy the record of the table's settled runs, its search runs and its choices to ``dest``
    (see :mod:`mpifed.tables.archive`); what was copied, and ``summary_command``, which summarises the copy."""
    target = dest / table.root.name
    if target.resolve() == table.root.resolve():
        raise config.ConfigError(f"--archive {dest}: that is where the table's runs are; name another folder")
    every = table.search + table.runs
    kept = [r.path for r in every if settled(r.path)]
    places = [(p, target / p.relative_to(table.root)) for p in kept]
    clash = [(p, held) for p, held in places if settled(held) and stored_identity(held) != stored_identity(p)]
    if clash:
        run, held = clash[0]
        raise config.ConfigError(
            f"--archive {dest}: {held} holds a settled run of another configuration, which archiving "
            f"{run} would overwrite ({len(clash)} runs like it): archive into another folder, or, to keep "
            f"both, copy the archive's runs into the table's before making the new ones (cp -r {target} "
            f"{table.root.parent}/), so that the new runs take names of their own beside them")
    choices = [table.root / CHOICES] if (table.root / CHOICES).is_file() else []
    done = archive.archive_runs(kept, table.root, target, choices)
    lines = [f"archived {len(kept)} runs to {target} ({done.copied} written, {done.unchanged} already there as "
             f"they are; {done.size / 1e6:.1f} MB without their weights)"]
    if len(kept) < len(every):
        lines.append(f"{len(every) - len(kept)} runs not settled (not run, running, stopped or failed) were left out")
    if done.links:
        lines.append(f"{len(done.links)} symbolic links were left out, not "
                     "followed: " + ", ".join(map(str, done.links)))
    lines.append(f"its summary: {summary_command}")
    return "\n".join(lines)


def settled_runs_under(folder: Path) -> dict[str, list[Path]]:
    """The settled runs anywhere under ``folder`` (a runs root, a table's runs, an archive), by the
    digest of their result fingerprint, in name order (hidden folders, an interrupted copy's, left out)."""
    found: dict[str, list[Path]] = {}
    for here, dirs, files in os.walk(folder):
        path = Path(here)
        if CONFIG not in files:
            dirs[:] = sorted(d for d in dirs if not d.startswith("."))
            continue
        dirs[:] = []
        held = stored_identity(path) if settled(path) else None
        if isinstance(held, dict):
            found.setdefault(config.digest(held), []).append(path)
    return found


def _stands_for(path: Path, run: TableRun) -> bool:
    """Whether a settled run's record can stand for ``run`` of its configuration: for a search run, a
    search's record (validation only: a table run of the same configuration evaluated the test set,
    which a search's record must not hold); for a table run, a run that evaluated the test set; for
    either, a run that diverged, before any evaluation perhaps (a run of its configuration diverges the
    same way)."""
    record = RunRecord(path)
    if record.state == RunState.DIVERGED:
        return True
    if run.candidate is not None:
        return record.config.get("run", {}).get("eval_test") is False
    return any("test_acc" in row for row in record.metrics())


def reuse_runs(table: Table, found: dict[str, list[Path]]) -> list[tuple[Path, TableRun]]:
    """Copy into the table, for each of its runs not made yet (search runs, and runs whose choice is
    made), the record of the first run in ``found`` (settled runs by identity) of its configuration and
    its kind (:func:`_stands_for`); (source, run) copied."""
    copied = []
    for r in table.search + table.runs:
        if ((r.setting, r.method) in table.pending and r.candidate is None) or status(r) != RunState.NEW:
            continue
        sources = found.get(config.digest(r.identity), [])
        source = next((p for p in sources if _stands_for(p, r)), None)
        if source is not None:
            archive.copy_record(source, r.path)
            copied.append((source, r))
    return copied


def prune(table: Table) -> str:
    """Delete the checkpoints and per-client state of the table's settled runs (search runs too),
    skipping any run another process holds; what was freed."""
    freed = pruned = busy = 0
    for r in table.search + table.runs:
        if not settled(r.path):
            continue
        rd = RunDir(r.path)
        if not (rd.checkpoints.exists() or rd.client_state.exists()):
            continue
        try:
            rd.lock()
        except RunLocked:
            busy += 1
            continue
        try:
            freed += rd.drop_state()
            pruned += 1
        finally:
            rd.unlock()
    size = f"{freed / 1e9:.2f} GB" if freed >= 1e9 else f"{freed / 1e6:.1f} MB"
    return (f"freed {size}: the checkpoints and client state of {pruned} settled runs (they keep their "
            f"record and final model; they can no longer be trained further)"
            + (f"; {busy} runs held by another process were left alone" if busy else ""))
