"""Expand a paper table into its runs (settings x methods x seeds), run them, collect the results.

    python -m mpifed.table configs/papers/fedntd/table1.table.yaml --list
    python -m mpifed.table TABLE --run 3 [--set train.rounds=20 ...]   # here, one run after another, 3 ranks each
    python -m mpifed.table TABLE --write-runs runs.txt                  # for slurm/array.sbatch (one run per task)
    python -m mpifed.table TABLE --summary [--set ...]                  # the paper's metric, mean +- sample std over seeds

A table file lists ``settings`` and ``methods`` (config files relative to it, each run is
``--config <setting> --config <method>``), ``seeds`` and the ``metric`` its paper reports
(see :mod:`mpifed.results`). Runs go to ``runs/<paper>-<table>/<setting>-<method>-s<seed>``
when they use the table's own configuration; a run with ``--set`` overrides that change its
results goes beside it, in ``<setting>-<method>-s<seed>-<hash of its configuration>``. A run
counts as done only when its directory holds a finished run of the same configuration;
stopped ones are resumed, so ``--run`` and array jobs can be repeated safely, and
``--summary`` reports only runs of the configuration asked for, naming those it left out.
"""
from __future__ import annotations

import argparse
import copy
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from mpifed import __version__, config, results
from mpifed.packaged import find_config
from mpifed.pipes import quiet_when_pipe_closes
from mpifed.rundir import RunDir


@dataclass
class TableRun:
    setting: str
    method: str
    seed: int
    configs: list[Path]
    root: Path
    name: str
    resolved: dict[str, Any] = field(default_factory=dict)   # its config with the overrides, as a dict
    identity: dict[str, Any] = field(default_factory=dict)   # config.result_fingerprint(resolved)

    @property
    def plain_name(self) -> str:
        return f"{self.setting}-{self.method}-s{self.seed}"

    @property
    def path(self) -> Path:
        return self.root / self.name

    def args(self, extra: list[str]) -> list[str]:
        out: list[str] = []
        for c in self.configs:
            out += ["--config", str(c)]
        return out + ["--set", f"run.seed={self.seed}", f"run.root={self.root}", f"run.name={self.name}", *extra, "--resume"]


@dataclass
class Table:
    title: str
    metric: results.Metric
    runs: list[TableRun]


def load_table(path: str | Path, runs_root: str = "runs") -> Table:
    path = find_config(path)
    try:
        spec = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise config.ConfigError(f"table {path}: {exc}") from None
    missing = {"settings", "methods", "seeds", "metric"} - set(spec or {})
    if missing:
        raise config.ConfigError(f"table {path} lacks {', '.join(sorted(missing))}")
    unknown = set(spec) - {"title", "settings", "methods", "seeds", "metric"}
    if unknown:
        raise config.ConfigError(f"table {path}: unknown keys {', '.join(sorted(unknown))}")
    try:
        metric = results.Metric.parse(spec["metric"])
    except results.MetricError as exc:
        raise config.ConfigError(f"table {path}: {exc}") from None
    table = path.name.removesuffix(".table.yaml")
    root = Path(runs_root) / f"{path.parent.name}-{table}"
    runs = []
    for setting in spec["settings"]:
        for method in spec["methods"]:
            for seed in spec["seeds"]:
                s, m = Path(setting).stem, Path(method).stem
                runs.append(TableRun(s, m, int(seed), [path.parent / setting, path.parent / method], root, f"{s}-{m}-s{seed}"))
    return Table(spec.get("title", table), metric, runs)


def resolve(table: Table, extra: list[str]) -> None:
    """Load every run's config with the overrides ``extra`` (raises ConfigError naming the first
    bad one) and pick its directory: the plain name when its configuration is the table's own
    (or the plain directory already holds it), else the plain name plus a hash of the configuration."""
    own_keys = [o.split("=", 1)[0].strip() for o in extra if o.split("=", 1)[0].strip() in ("run.seed", "run.name", "run.root")]
    if own_keys:
        raise config.ConfigError(f"--set {', '.join(own_keys)}: the table sets run.seed, run.name and run.root of its runs "
                                 "itself; change the table's seeds, or use --runs-root")
    loaded: dict[tuple[Path, ...], tuple[dict[str, Any], dict[str, Any]]] = {}
    for r in table.runs:
        key = tuple(r.configs)
        if key not in loaded:
            try:
                _, d = config.load([str(c) for c in r.configs], extra)
                own = config.load([str(c) for c in r.configs], [])[1] if extra else d
            except config.ConfigError as exc:
                raise config.ConfigError(f"{r.setting} x {r.method}: {exc}") from None
            loaded[key] = (d, own)
        d, own = loaded[key]
        d, own = _with_seed(d, r.seed), _with_seed(own, r.seed)
        r.resolved = d
        r.identity = config.result_fingerprint(d)
        hashed = f"{r.plain_name}-{config.digest(r.identity)}"
        home = r.plain_name if r.identity == config.result_fingerprint(own) else hashed
        held = stored_identity(r.root / home)
        r.name = home if held is None or held == r.identity else hashed


def validate(table: Table, extra: list[str]) -> None:
    """Every run's config is valid (raises ConfigError naming the first bad one)."""
    resolve(table, extra)


def _with_seed(d: dict[str, Any], seed: int) -> dict[str, Any]:
    out = copy.deepcopy(d)
    out["run"]["seed"] = seed
    return out


def stored_identity(path: Path) -> dict[str, Any] | str | None:
    """The result fingerprint of the run in ``path``; None when it holds no run; a message when
    its config.yaml cannot be read as a valid configuration."""
    try:
        stored = yaml.safe_load((path / "config.yaml").read_text())
    except FileNotFoundError:
        return None
    except (OSError, yaml.YAMLError) as exc:
        return f"its config.yaml is unreadable ({exc})"
    try:
        return config.result_fingerprint(config.build(stored).to_dict())
    except (config.ConfigError, TypeError, AttributeError) as exc:
        return f"its config.yaml is not a valid configuration of this mpifed version ({exc})"


def status(run: TableRun) -> str:
    """The run's state as :meth:`RunDir.status` reads it (a dead ``running`` run is ``failed``); ``new`` without one."""
    found = RunDir(run.path).status()
    return found["state"] if found else "new"


def _siblings(run: TableRun) -> list[Path]:
    """Directories of this run's other configurations: the plain name and the hashed ones."""
    if not run.root.is_dir():
        return []
    pattern = re.compile(re.escape(run.plain_name) + r"(-[0-9a-f]{10})?")
    return sorted(p for p in run.root.iterdir() if p.is_dir() and p != run.path and pattern.fullmatch(p.name))


def _difference(held: dict[str, Any] | str, want: dict[str, Any]) -> str:
    if isinstance(held, str):
        return held
    keys = config.diff_keys(held, want)
    shown = ", ".join(f"{k}={config.lookup(held, k)!r} (here {config.lookup(want, k)!r})" for k in keys[:4])
    return f"made with {shown}" + (f" and {len(keys) - 4} more differences" if len(keys) > 4 else "")


@dataclass
class Summary:
    """The cells of a table (setting, method, column) -> Stat, and the runs left out, with why."""

    title: str
    metric: results.Metric
    settings: list[str]
    methods: list[str]
    columns: list[str]
    cells: dict[tuple[str, str, str], results.Stat]
    left_out: list[str]
    not_run: int
    percent: bool

    def markdown(self) -> str:
        unit = " (%)" if self.percent else ""
        lines = [f"{self.title}: {self.metric.label}{unit}, mean ± sample std over finished seeds (n)", ""]
        heads = [s if len(self.columns) == 1 else f"{s}: {c}" for s in self.settings for c in self.columns]
        lines += ["| method | " + " | ".join(heads) + " |", "| --- |" + " --- |" * len(heads)]
        for m in self.methods:
            row = [self.cell_text(s, m, c) for s in self.settings for c in self.columns]
            lines.append(f"| {m} | " + " | ".join(row) + " |")
        if self.not_run:
            lines += ["", f"Not run yet: {self.not_run} of the table's runs."]
        if self.left_out:
            lines += ["", f"Left out ({len(self.left_out)}):"] + [f"  {line}" for line in self.left_out]
        return "\n".join(lines)

    def cell_text(self, setting: str, method: str, column: str) -> str:
        stat = self.cells.get((setting, method, column), results.Stat([]))
        if column.startswith("T("):
            return stat.text(1, "not reached")
        return stat.text(2)


def finished_runs(table: Table) -> tuple[dict[tuple[str, str], list[Path]], list[str], int]:
    """The finished runs of the resolved configuration (see :func:`resolve`) per (setting, method);
    the runs left out, with why; how many were not run yet."""
    groups: dict[tuple[str, str], list[Path]] = {}
    left_out: list[str] = []
    not_run = 0
    for r in table.runs:
        runs = groups.setdefault((r.setting, r.method), [])
        for other in _siblings(r):
            held = stored_identity(other)
            if held is not None and held != r.identity:
                left_out.append(f"{other}: {_difference(held, r.identity)}")
        state = status(r)
        if state != "finished":
            if state == "new":
                not_run += 1
            else:
                left_out.append(f"{r.path}: not finished ({state})")
            continue
        runs.append(r.path)
    return groups, left_out, not_run


def summarize(table: Table) -> Summary:
    """The table in its metric from the finished runs of the resolved configuration (see :func:`resolve`)."""
    groups, left_out, not_run = finished_runs(table)
    return tabulate(table.title, table.metric, groups, left_out, not_run)


def tabulate(title: str, metric: results.Metric, groups: dict[tuple[str, str], list[Path]],
             left_out: list[str] | None = None, not_run: int = 0) -> Summary:
    """A table in ``metric`` of the run directories in ``groups`` ((setting, method) -> runs)."""
    columns = [metric.label] + [f"T({100 * t:g}%)" for t in metric.rounds_to] + (["forgetting"] if metric.forgetting else [])
    percent = metric.kind != "key" or "acc" in metric.column or metric.column == "forgetting"
    cells: dict[tuple[str, str, str], results.Stat] = {}
    for (setting, method), paths in groups.items():
        stats = [cells.setdefault((setting, method, c), results.Stat([])) for c in columns]
        for path in paths:
            _add_run(metric, columns, percent, path, stats)
    return Summary(title, metric, list(dict.fromkeys(s for s, _ in groups)), list(dict.fromkeys(m for _, m in groups)),
                   columns, cells, list(left_out or []), not_run, percent)


def _add_run(metric: results.Metric, columns: list[str], percent: bool, path: Path, stats: list[results.Stat]) -> None:
    rows, summary = results.read_rows(path), results.read_json(path / "summary.json")
    values = [results.value(metric, rows, summary)]
    values += [results.rounds_to(rows, t) for t in metric.rounds_to]
    values += [results.forgetting(rows)] if metric.forgetting else []
    for i, (stat, v) in enumerate(zip(stats, values)):
        if v is None:
            stat.missing += 1
        else:
            stat.values.append(float(v) if columns[i].startswith("T(") or not percent else 100 * v)


def summary_table(table: Table) -> str:
    return summarize(table).markdown()


def listing(table: Table, extra: list[str]) -> str:
    """Each run's status, directory and mpifed arguments; runs whose raw data is missing are
    marked with the folder they expect."""
    from mpifed.data.prepared import raw_data_missing
    lines = []
    folders: set[str] = set()
    tokenizers: set[str] = set()
    count = 0
    for r in table.runs:
        cfg = config.build(r.resolved)
        missing = raw_data_missing(cfg)
        mark = ""
        if missing is not None:
            count += 1
            tokenizer = cfg.data.tokenizer is not None and missing == Path(cfg.data.tokenizer)
            (tokenizers if tokenizer else folders).add(str(missing))
            mark = f"  [{'tokenizer' if tokenizer else 'raw data'} missing: expects {missing}]"
        lines.append(f"{status(r):>9}  {shlex.join(r.args(extra))}{mark}")
    if folders:
        lines.append("runs lack their raw data; put it in (or point data.dataset.root at): " + ", ".join(sorted(folders)))
    if tokenizers:
        lines.append("runs lack their tokenizer folder; save the tokenizer there (docs/text.md), or point data.tokenizer "
                     "at one: " + ", ".join(sorted(tokenizers)))
    if count:
        lines.append(f"{count} of {len(table.runs)} runs cannot start until then")
    return "\n".join(lines)


@quiet_when_pipe_closes
def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m mpifed.table", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("table", help="the table file (*.table.yaml); a configs/... path also finds the tables shipped with mpifed")
    p.add_argument("--runs-root", default="runs", help="folder that holds the table's run folder (default: runs)")
    p.add_argument("--version", action="version", version=f"mpifed {__version__}")
    p.add_argument("--set", action="append", nargs="+", default=[], metavar="KEY=VALUE",
                   help="added to every run; runs with other results go to their own directories")
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--list", action="store_true", help="print each run's status and mpifed arguments; mark missing raw data")
    g.add_argument("--write-runs", metavar="FILE", help="one line of mpifed arguments per run (for slurm/array.sbatch)")
    g.add_argument("--run", type=int, metavar="N", help="run here, one after another, with N ranks each (0: debug mode)")
    g.add_argument("--summary", action="store_true", help="the table of results in the table's metric")
    a = p.parse_args(argv)
    extra = [o for group in a.set for o in group]
    try:
        table = load_table(a.table, a.runs_root)
        resolve(table, extra)
    except config.ConfigError as exc:
        print(f"[mpifed.table] {exc}", file=sys.stderr)
        return 2
    if a.list:
        print(listing(table, extra))
    elif a.write_runs:
        Path(a.write_runs).write_text("".join(shlex.join(r.args(extra)) + "\n" for r in table.runs))
        print(f"{len(table.runs)} runs written to {a.write_runs}; submit with:\n"
              f"  sbatch --array=0-{len(table.runs) - 1} slurm/array.sbatch {a.write_runs}")
    elif a.run is not None:
        for i, r in enumerate(table.runs):
            if status(r) == "finished":
                continue
            print(f"[mpifed.table] run {i + 1}/{len(table.runs)}: {r.name}", flush=True)
            launcher = [sys.executable, "-m", "mpifed.main"] if a.run == 0 else [sys.executable, "-m", "mpifed.launch", "-n", str(a.run)]
            code = subprocess.call(launcher + r.args(extra))
            if code != 0:
                print(f"[mpifed.table] {r.name} ended with exit code {code}; stopping", file=sys.stderr)
                return code
        print(summary_table(table))
    else:
        print(summary_table(table))
    return 0


if __name__ == "__main__":
    sys.exit(main())
