"""Results from several machines or clusters in one tree, so that one table is summarised from all
of them: ``mpifed merge SOURCE... --into RESULTS``.

Each SOURCE is a runs root, a table's folder or an archive (``--archive``'s copy). Every settled
run under it (finished or diverged) is copied, as its record (:mod:`mpifed.tables.archive`: the
run without its weights; its provenance, metrics and plugins' copies kept), to the same place under
RESULTS; a table's recorded choices (``choices.yaml``) go with its runs. Runs are matched by their
result fingerprint (which holds the seed), wherever they sit:

* the same run with the same numbers (its metrics rows, times aside) is there already: nothing to do;
* the same run with other numbers, recorded on one machine (the CPU, BLAS, GPU and torch that
  :func:`mpifed.run.provenance.hardware` reads agree): refused, and nothing is merged. One machine
  computes a run one way, so the two cannot both be its record (other code, or an edited record);
* the same run with other numbers from another machine (or a machine not recorded): both are kept.
  The one already there stays the table's; the other goes to ``RESULTS/other-machines/<machine>/``
  at the same relative place, and ``RESULTS/merged.json`` lists it, so that the table's
  ``--summary`` says which of its runs were also made elsewhere and by how much they differ.
"""
from __future__ import annotations

import hashlib
import json
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mpifed.run import provenance, results
from mpifed.run.rundir import atomic_write
from mpifed.tables.archive import copy_record
from mpifed.tables.table_store import settled_runs_under
from mpifed.tables.tuning import CHOICES

OTHER = "other-machines"
LISTED = "merged.json"


class MergeError(ValueError):
    """Two records of one run that cannot both be true, or a SOURCE that is not a folder."""


@dataclass
class Merged:
    """What a merge did: runs copied, runs already there, runs kept from another machine (their place
    under RESULTS), and notes (choices that differ)."""

    copied: list[Path] = field(default_factory=list)
    same: int = 0
    other_machine: list[Path] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def numbers(run: Path) -> list[dict[str, Any]]:
    """A run's numbers: its metrics rows without their times (which differ from run to run)."""
    return [{k: v for k, v in row.items() if k != "time"} for row in results.read_rows(run)]


def machine_tag(run: Path) -> str:
    """A short, stable name of the machine a run recorded: ``<first host>-<digest of its hardware>``,
    ``unrecorded`` where it has no provenance."""
    found = provenance.read(run)
    if found is None:
        return "unrecorded"
    hosts = sorted({str(r.get("host")) for s in found["segments"] for r in s.get("ranks", []) if r.get("host")})
    digest = hashlib.sha256(provenance.machine(found).encode()).hexdigest()[:8]
    return f"{hosts[0] if hosts else 'host'}-{digest}"


def _same_machine(a: Path, b: Path) -> bool:
    """Whether two runs recorded one machine: both recorded its hardware, and nothing of it differs."""
    ha, hb = (provenance.hardware(provenance.read(p) or {}) for p in (a, b))
    recorded = any(ha.values()) and any(hb.values())
    return recorded and provenance.hardware_conflict(ha, hb) is None


def merge(sources: list[Path], into: Path) -> Merged:
    """Merge the settled runs of ``sources`` into ``into`` (see the module's description); checked
    whole before anything is written: a MergeError leaves ``into`` as it was."""
    for source in sources:
        if not source.is_dir():
            raise MergeError(f"{source}: no such folder; give runs roots, tables' folders or archives")
    held = {digest: paths[0] for digest, paths in settled_runs_under(into).items()} if into.is_dir() else {}
    plan: list[tuple[Path, Path, str]] = []      # (run, target, "copy" | "other")
    done = Merged()
    for source in sources:
        for digest, runs in settled_runs_under(source).items():
            for run in runs:
                there = held.get(digest)
                if there is None:
                    target = into / _place(run, source)
                    plan.append((run, target, "copy"))
                    held[digest] = run
                elif numbers(there) == numbers(run):
                    done.same += 1
                elif _same_machine(there, run):
                    raise MergeError(f"{run} and {there} are the same run (result fingerprint {digest}, its seed "
                                     f"included) recorded on one machine ({provenance.machine(provenance.read(run))})"
                                     f", with other numbers: one machine computes a run one way, so one of the two "
                                     f"records is not that run's (other code, or an edited record). Nothing was "
                                     f"merged: leave one of them out")
                else:
                    plan.append((run, into / OTHER / machine_tag(run) / _place(run, source), "other"))
    listed = _read_listed(into)
    for run, target, how in plan:
        copy_record(run, target)
        if how == "copy":
            done.copied.append(target)
        else:
            done.other_machine.append(target)
            listed.append({"run": str(target.relative_to(into)), "source": str(run),
                           "machine": provenance.machine(provenance.read(run) or {})})
    for source in sources:
        done.notes += _choices(source, into)
    if done.other_machine:
        atomic_write(into / LISTED, json.dumps(listed, indent=1) + "\n")
    return done


def _place(run: Path, source: Path) -> Path:
    """Where ``run`` goes under the results tree: its place under ``source``, or, for a SOURCE that is
    a run itself, its own name."""
    rel = run.relative_to(source)
    return rel if rel != Path(".") else Path(run.name)


def _choices(source: Path, into: Path) -> list[str]:
    """Copy each table's recorded choices under ``source`` where the results tree has none; a note
    for those that differ from the tree's (the tree's are kept)."""
    notes = []
    for found in sorted(source.rglob(CHOICES)):
        target = into / found.relative_to(source)
        if not target.exists():
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(found, target)
        elif target.read_bytes() != found.read_bytes():
            notes.append(f"{found} differs from {target}: the merged tree keeps {target} (a search chose otherwise "
                         f"on one machine; --summary names the choice it uses)")
    return notes


def _read_listed(into: Path) -> list[dict[str, Any]]:
    try:
        found = json.loads((into / LISTED).read_text())
    except (OSError, json.JSONDecodeError):
        return []
    return found if isinstance(found, list) else []


def other_machine_notes(root: Path, runs: list[Path]) -> list[str]:
    """For a table's ``--summary``: which of its ``runs`` (under the results tree ``root``) a merge kept
    a second record of, made on another machine, and how far their final test accuracies differ."""
    listed = _read_listed(root)
    if not listed:
        return []
    mine = {p.resolve().relative_to(root.resolve()): p for p in runs if p.resolve().is_relative_to(root.resolve())}
    found = []
    for entry in listed:
        other = root / entry["run"]
        rel = Path(*Path(entry["run"]).parts[2:])    # other-machines/<machine>/<place>
        if rel in mine:
            a, b = results.final(results.read_rows(mine[rel])), results.final(results.read_rows(other))
            gap = f"{100 * abs(a - b):.2f} points" if a is not None and b is not None else "unknown"
            found.append((mine[rel].name, entry.get("machine", "?"), gap))
    if not found:
        return []
    shown = "; ".join(f"{name} ({gap}, on {machine})" for name, machine, gap in found[:5])
    more = f" and {len(found) - 5} more" if len(found) > 5 else ""
    return [f"{len(found)} of these runs were also made on another machine, with other numbers (kept in "
            f"{root / OTHER}, listed in {root / LISTED}; this summary uses the first record): final test accuracy "
            f"differs by {shown}{more}"]


def merge_summary(done: Merged, into: Path) -> str:
    """What a merge did, in a few lines."""
    lines = [f"merged into {into}: {len(done.copied)} runs copied, {done.same} already there with the same numbers, "
             f"{len(done.other_machine)} kept from another machine (under {into / OTHER}; listed in "
             f"{into / LISTED})"]
    lines += [f"note: {n}" for n in done.notes]
    return "\n".join(lines)

