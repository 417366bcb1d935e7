"""A table's settled runs without their weights: the record that lets a reader check every number.

    python -m mpifed.table TABLE --archive results                # copy the records of the settled runs
    python -m mpifed.table TABLE --runs-root results --summary    # the same summary, from the copy

A run's record is its directory without the weights (:meth:`RunDir.record_files`): the
configuration, every round's metrics, the clients' log, the summary, the status, the provenance,
the log and the copies of its plugins' source (symbolic links are never followed: they are left
out, and the archive says so); tens of kilobytes where the weights take megabytes, so a repository or a paper's
supplement can hold a whole table. Only settled runs are copied: finished ones, and those whose
loss diverged (a search scores them, a summary names them). The table's recorded choices go with
them, so the copy resolves to the same runs as the source.

Each run is written to a temporary folder and renamed into place, so an interrupted archive holds
whole runs only; a run already in the archive is rewritten only when its record changed. An
archive can be continued: copy it under a runs root (``cp -r results/<table folder> runs/``) and
``--run`` runs only what it lacks.
"""
from __future__ import annotations

import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from mpifed.run.rundir import MARKER, RunDir, atomic_write


@dataclass
class Archived:
    copied: int      # runs written (new, or their record changed)
    unchanged: int   # runs the archive already held as they are
    size: int        # bytes of the archived runs' records
    links: list[Path] = field(default_factory=list)   # symbolic links in the runs, left out


def _record(run: Path) -> dict[Path, bytes]:
    """The run's record files by relative path (its marker aside: every copy gets one, see :func:`_write`)."""
    return {rel: (run / rel).read_bytes() for rel in RunDir(run).record_files() if rel != Path(MARKER)}


def _replace_folder(tmp: Path, target: Path) -> None:
    """Put the folder ``tmp`` at ``target``, moving what was there aside first and deleting it after
    (only a run folder mpifed made, or an empty one: anything else is refused, :class:`NotOurs`)."""
    RunDir(target).check_ours()
    old = target.with_name(f".{target.name}.old{os.getpid()}")
    if target.exists():
        os.replace(target, old)
    os.replace(tmp, target)
    shutil.rmtree(old, ignore_errors=True)


def _write(record: dict[Path, bytes], target: Path) -> None:
    tmp = target.with_name(f".{target.name}.tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        for rel, data in record.items():
            (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
            (tmp / rel).write_bytes(data)
        (tmp / MARKER).touch()   # a folder mpifed made: a later archive or reuse may replace it
        _replace_folder(tmp, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def copy_record(run: Path, target: Path) -> None:
    """Write the record of the run folder ``run`` as the run folder ``target`` (whole or not at all)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    _write(_record(run), target)


def archive_runs(runs: list[Path], source: Path, dest: Path, files: list[Path]) -> Archived:
    """Copy the record of each run folder in ``runs`` (under ``source``) to the same place under
    ``dest``, and each of ``files`` (under ``source``) likewise."""
    copied = unchanged = size = 0
    links: list[Path] = []
    for run in runs:
        links += RunDir(run).links()
        record = _record(run)
        size += sum(len(b) for b in record.values())
        target = dest / run.relative_to(source)
        if target.is_dir() and _record(target) == record:
            unchanged += 1
            continue
        _write(record, target)
        copied += 1
    for f in files:
        target = dest / f.relative_to(source)
        target.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(target, f.read_bytes())
    return Archived(copied, unchanged, size, links)
