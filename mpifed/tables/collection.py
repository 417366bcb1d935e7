"""The runs a report reads (``python -m mpifed.report``): table files' finished runs and folders of run
directories, grouped into settings and methods (methods by their display names), a setting whose runs hold
different data split into one setting per data (:func:`collect`)."""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from mpifed.files import safe_yaml
from mpifed.plugin.registry import ALGORITHMS
from mpifed.run import results
from mpifed.run.record import RunRecord
from mpifed.run.rundir import CONFIG, RunDir
from mpifed.run.state import RunState
from mpifed.settings import config
from mpifed.tables.merge import OTHER
from mpifed.tables.table_file import Table, finished_runs, load_table, resolve, stored_identity


_SEED_SUFFIX = re.compile(r"-s\d+(-[0-9a-f]{10})?$")


class ReportError(ValueError):
    """An input cannot be reported on."""


@dataclass
class Collection:
    """Finished run directories per (setting, method), the runs left out and why, the metric;
    ``title`` names the inputs and the overrides, ``figure_title`` the tables and the overrides."""

    title: str
    metric: results.Metric
    groups: dict[tuple[str, str], list[Path]] = field(default_factory=dict)
    left_out: list[str] = field(default_factory=list)
    figure_title: str = ""
    notes: list[str] = field(default_factory=list)        # settings split because their runs hold different data
    starts: dict[Path, str] = field(default_factory=dict)  # each run's initial model, in words (pairing needs one)
    identities: dict[Path, dict[str, Any]] = field(default_factory=dict)   # each run's result fingerprint
    table: Table | None = None     # the input, when it is one table file: its tables are what --summary prints


def collect(inputs: list[str], runs_root: str, added: list[str], metric: results.Metric | None,
            plugins: list[str] | None = None) -> Collection:
    """Group the runs of every input (see the module docstring), methods by their display names;
    a setting whose runs hold different data is split, one setting per data (:func:`split_by_data`)."""
    titles, tables = [], []
    out = Collection("", metric or results.Metric())
    for item in inputs:
        path = Path(item)
        if path.name.endswith(".table.yaml"):
            table = load_table(path, runs_root, plugins)
            resolve(table, added)
            groups, left_out, _, _ = finished_runs(table)
            out.identities.update({r.path: r.identity for r in table.runs})
            for key, runs in groups.items():
                out.groups.setdefault(key, []).extend(runs)
            out.left_out += left_out
            titles.append(table.title)
            tables.append(table.title)
            if metric is None:
                out.metric = table.metric
        elif path.is_dir():
            _collect_dirs(path, out)
            titles.append(str(path))
        else:
            raise ReportError(f"{item} is neither a table file (*.table.yaml) nor a folder of runs")
    if not any(out.groups.values()):
        raise ReportError("no finished runs found in " + ", ".join(inputs)
                          + (f" (left out: {'; '.join(out.left_out)})" if out.left_out else ""))
    overrides = f" (--set {' '.join(added)})" if added else ""
    out.title = "; ".join(titles) + overrides
    out.figure_title = "; ".join(tables) + overrides if tables else ""
    split_by_data(out)
    out.groups = with_display_names(out.groups)
    if len(inputs) == 1 and tables:
        out.table = table
    return out


def split_by_data(c: Collection) -> None:
    """Give each data a setting of its own: a setting whose runs hold different data (another data
    set, class set, partition, number of clients, subset or hold-out, or another plugin's code for
    them) becomes one setting per data, named by what differs, with a note; and note each run's
    initial model (``c.starts``), so that only runs that share it are paired."""
    found = c.identities
    c.starts = {run: _start(found[run]) for runs in c.groups.values() for run in runs if run in found}
    datas: dict[str, dict[str, dict[str, Any]]] = {}
    for (setting, _), runs in c.groups.items():
        for run in runs:
            if run in found:
                data = _data(found[run])
                datas.setdefault(setting, {})[config.digest(data)] = data
    groups: dict[tuple[str, str], list[Path]] = {}
    for (setting, method), runs in c.groups.items():
        kinds = datas.get(setting, {})
        for run in runs:
            name = setting
            if len(kinds) > 1 and run in found:
                name = f"{setting} ({_described(kinds, config.digest(_data(found[run])))})"
            groups.setdefault((name, method), []).append(run)
    c.groups = groups
    for setting, kinds in datas.items():
        if len(kinds) > 1:
            differ = ", ".join(k.removeprefix("data.") for k in _differing(kinds))
            c.notes.append(f"The runs of {setting} hold different data ({differ}): they are "
                           f"reported as {len(kinds)} settings, and no method is compared across them.")


def _data(identity: dict[str, Any]) -> dict[str, Any]:
    """What a run's clients and evaluation sets hold, from its result fingerprint."""
    code = identity.get("code") or {}
    data = {k: v for k, v in (identity.get("data") or {}).items() if k != "augment"}   # training-time only
    return {"data": data, "code": {k: code.get(k) for k in ("dataset", "partition")}}


def _start(identity: dict[str, Any]) -> str:
    """A run's initial model in words: the model with its options (and its plugin's hash)."""
    model = dict(identity.get("model") or {})
    name = model.pop("name", "?")
    sha = (identity.get("code") or {}).get("model")
    options = ", ".join(f"{k}={v}" for k, v in sorted(model.items()))
    return f"{name}" + (f" ({options})" if options else "") + (f" [code {sha[:8]}]" if sha else "")


def _differing(kinds: dict[str, dict[str, Any]]) -> list[str]:
    """The dotted keys on which the data of a setting's runs differ (a choice whose name differs
    counts once, by its name)."""
    first, *others = kinds.values()
    keys = list(dict.fromkeys(k for other in others for k in config.diff_keys(first, other)))
    renamed = [k.removesuffix(".name") for k in keys if k.endswith(".name")]
    return [k for k in keys if not any(k.startswith(f"{r}.") and k != f"{r}.name" for r in renamed)]


def _described(kinds: dict[str, dict[str, Any]], digest: str) -> str:
    return ", ".join(f"{k.removeprefix('data.')}={config.lookup(kinds[digest], k)}" for k in _differing(kinds)[:3])


def display_name(label: str) -> str:
    """A method label as papers write it: a registered method's name (or one followed by ``-``,
    ``_`` or a space, a variant) in its display form, e.g. fedntd: FedNTD, fedprox-mu0.01:
    FedProx-mu0.01; any other label as it is."""
    base = max((n for n in ALGORITHMS.names() if label == n or label.startswith((f"{n}-", f"{n}_", f"{n} "))),
               key=len, default=None)
    return label if base is None else ALGORITHMS.display_name(base) + label[len(base):]


def with_display_names(groups: dict[tuple[str, str], list[Path]]) -> dict[tuple[str, str], list[Path]]:
    """``groups`` with each method's display name, unless two of its labels would show as one."""
    labels = list(dict.fromkeys(m for _, m in groups))
    shown = {m: display_name(m) for m in labels}
    if len(set(shown.values())) < len(labels):
        return groups
    return {(s, shown[m]): runs for (s, m), runs in groups.items()}


def _collect_dirs(folder: Path, out: Collection) -> None:
    """Every run under ``folder`` (itself, or any folder below holding config.yaml), grouped by the
    folder that holds it (a table's search runs apart: :func:`_setting`), by its ``run.label`` or name
    without the seed, and by configuration without the seed."""
    found = [folder] if (folder / CONFIG).exists() else sorted(p.parent for p in folder.rglob(CONFIG))
    keyed: dict[tuple[str, str, str], list[Path]] = {}
    for run in found:
        held = stored_identity(run)
        if isinstance(held, str) or held is None:
            out.left_out.append(f"{run}: {held or 'no config.yaml'}")
            continue
        state = RunDir(run).state()  # a dead "running" run reads as failed
        if state != RunState.FINISHED:
            out.left_out.append(f"{run}: {RunDir(run).why_left_out(state)}")
            continue
        out.identities[run] = held
        seedless = {**held, "run": {k: v for k, v in held["run"].items() if k != "seed"}}
        keyed.setdefault((_setting(run), _label(run), config.digest(seedless)), []).append(run)
    labels: dict[tuple[str, str], int] = {}
    for setting, label, _ in keyed:
        labels[(setting, label)] = labels.get((setting, label), 0) + 1
    for (setting, label, digest), runs in keyed.items():
        method = label if labels[(setting, label)] == 1 else f"{label} [{digest[:6]}]"
        out.groups.setdefault((setting, method), []).extend(runs)


def _setting(run: Path) -> str:
    """A folder's run's setting: the folder that holds it; a table's search runs (its ``tuning/``
    folder) a setting of their own, apart from the table's final runs; and so are the runs a merge
    kept from another machine (``other-machines/<machine>/``, :mod:`mpifed.tables.merge`)."""
    setting = run.parent.name
    if run.parent.name == "tuning" and run.parent.parent != run.parent:
        setting = f"{run.parent.parent.name} (search runs)"
    parts = run.parts
    if OTHER in parts[:-2]:
        setting += f" (on {parts[parts.index(OTHER) + 1]})"
    return setting


def _label(run: Path) -> str:
    """A folder's run's method label: its ``run.label`` where set, else its name without the seed."""
    try:
        given = safe_yaml.read(run / CONFIG)["run"].get("label")
    except (OSError, KeyError, TypeError, AttributeError, yaml.YAMLError):
        given = None
    return given if isinstance(given, str) and given.strip() else _SEED_SUFFIX.sub("", run.name)


def check_metric(c: Collection, given: str) -> None:
    """Refuse a ``--metric`` that none of the collected runs has a value for, listing those they have."""
    runs = [r for group in c.groups.values() for r in group]
    records = [(RunRecord(r).metrics(), RunRecord(r).summary) for r in runs]
    if any(results.value(c.metric, rows, summary) is not None for rows, summary in records):
        return
    held = set().union(*(_numeric(row) for rows, summary in records for row in [summary, *rows]))
    raise ReportError(f"--metric {given}: none of the runs has a value for it. Allowed: {', '.join(results.KINDS)} "
                      f"(of test_acc, or of a column: {{kind: best, column: ...}}), or a summary.json key or metrics "
                      f"column the runs hold: {', '.join(sorted(held))}")


def _numeric(d: dict[str, Any]) -> set[str]:
    """The keys of ``d`` that hold a number."""
    return {k for k, v in d.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
