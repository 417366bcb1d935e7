"""Expand a paper table into its runs (settings x methods x seeds), run them, collect the results.

    python -m mpifed.table configs/papers/fedntd/table1.table.yaml --list
    python -m mpifed.table TABLE --run 3 [--set train.rounds=20 ...]   # here, one run after another, 3 ranks each
    python -m mpifed.table TABLE --write-runs runs.txt                  # for slurm/array.sbatch (one run per task)
    python -m mpifed.table TABLE --summary                              # mean +- std over seeds per setting x method

A table file lists ``settings`` and ``methods`` (config files relative to it, each run is
``--config <setting> --config <method>``), ``seeds`` and the ``metric`` its paper reports.
Runs go to ``runs/<paper>-<table>/<setting>-<method>-s<seed>``; finished runs are skipped and
stopped ones resumed, so ``--run`` and array jobs can be repeated safely.
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import yaml

from mpifed import config
from mpifed.rundir import RunDir

REPO = Path(__file__).resolve().parents[1]


@dataclass
class TableRun:
    setting: str
    method: str
    seed: int
    configs: list[Path]
    root: Path
    name: str

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
    metric: str
    runs: list[TableRun]


def load_table(path: str | Path, runs_root: str = "runs") -> Table:
    path = Path(path)
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
    table = path.name.removesuffix(".table.yaml")
    root = Path(runs_root) / f"{path.parent.name}-{table}"
    runs = []
    for setting in spec["settings"]:
        for method in spec["methods"]:
            for seed in spec["seeds"]:
                s, m = Path(setting).stem, Path(method).stem
                runs.append(TableRun(s, m, int(seed), [path.parent / setting, path.parent / method], root, f"{s}-{m}-s{seed}"))
    return Table(spec.get("title", table), spec["metric"], runs)


def validate(table: Table, extra: list[str]) -> None:
    """Every run's config is valid (raises ConfigError naming the first bad one)."""
    for r in table.runs:
        try:
            config.load([str(c) for c in r.configs], extra)
        except config.ConfigError as exc:
            raise config.ConfigError(f"{r.setting} x {r.method}: {exc}") from None


def status(run: TableRun) -> str:
    """The run's state as :meth:`RunDir.status` reads it (a dead ``running`` run is ``failed``); ``new`` without one."""
    found = RunDir(run.path).status()
    return found["state"] if found else "new"


def result(run: TableRun, metric: str) -> float | None:
    try:
        summary = json.loads((run.path / "summary.json").read_text())
    except (OSError, ValueError):
        return None
    if metric in summary:
        return summary[metric]
    rows = [json.loads(line) for line in (run.path / "metrics.jsonl").read_text().splitlines()]
    values = [r[metric] for r in rows if metric in r]
    return values[-1] if values else None


def summary_table(table: Table) -> str:
    cells: dict[tuple[str, str], list[float]] = {}
    for r in table.runs:
        v = result(r, table.metric)
        cells.setdefault((r.setting, r.method), [])
        if v is not None and status(r) == "finished":
            cells[(r.setting, r.method)].append(100 * v)
    settings = list(dict.fromkeys(r.setting for r in table.runs))
    methods = list(dict.fromkeys(r.method for r in table.runs))
    lines = [f"{table.title}: {table.metric} (%), mean +- std over finished seeds (n)", "",
             "| method | " + " | ".join(settings) + " |", "| --- |" + " --- |" * len(settings)]
    for m in methods:
        row = []
        for s in settings:
            v = cells[(s, m)]
            row.append("-" if not v else f"{statistics.fmean(v):.2f} +- {statistics.pstdev(v):.2f} ({len(v)})")
        lines.append(f"| {m} | " + " | ".join(row) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m mpifed.table", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("table")
    p.add_argument("--runs-root", default="runs")
    p.add_argument("--set", action="append", nargs="+", default=[], metavar="KEY=VALUE", help="added to every run")
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--list", action="store_true", help="print each run's mpifed arguments and status")
    g.add_argument("--write-runs", metavar="FILE", help="one line of mpifed arguments per run (for slurm/array.sbatch)")
    g.add_argument("--run", type=int, metavar="N", help="run here, one after another, with N ranks each (0: debug mode)")
    g.add_argument("--summary", action="store_true", help="the table of results")
    a = p.parse_args(argv)
    extra = [o for group in a.set for o in group]
    try:
        table = load_table(a.table, a.runs_root)
        validate(table, extra)
    except config.ConfigError as exc:
        print(f"[mpifed.table] {exc}", file=sys.stderr)
        return 2
    if a.list:
        for r in table.runs:
            print(f"{status(r):>9}  {shlex.join(r.args(extra))}")
    elif a.write_runs:
        Path(a.write_runs).write_text("".join(shlex.join(r.args(extra)) + "\n" for r in table.runs))
        print(f"{len(table.runs)} runs written to {a.write_runs}; submit with:\n"
              f"  sbatch --array=0-{len(table.runs) - 1} slurm/array.sbatch {a.write_runs}")
    elif a.run is not None:
        for i, r in enumerate(table.runs):
            if status(r) == "finished":
                continue
            print(f"[mpifed.table] run {i + 1}/{len(table.runs)}: {r.name}", flush=True)
            launcher = [sys.executable, "-m", "mpifed.main"] if a.run == 0 else [str(REPO / "launch" / "local.sh"), str(a.run)]
            code = subprocess.call(launcher + r.args(extra), env={**os.environ, "PYTHON": sys.executable})
            if code != 0:
                print(f"[mpifed.table] {r.name} ended with exit code {code}; stopping", file=sys.stderr)
                return code
        print(summary_table(table))
    else:
        print(summary_table(table))
    return 0


if __name__ == "__main__":
    sys.exit(main())
