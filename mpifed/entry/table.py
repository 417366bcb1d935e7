"""Expand a table into its runs (settings x methods x seeds), tune, run them, compare the methods.

    python -m mpifed.table configs/papers/fedntd/table1.table.yaml --list
    python -m mpifed.table TABLE --tune 3                             # the search only (if the table has one)
    python -m mpifed.table TABLE --run 3 [--set train.rounds=20 ...]  # search, then the runs; 3 ranks each (0: debug)
    python -m mpifed.table TABLE --run 0 --parallel 8                 # 8 runs at once (a GPU with MPS, many cores)
    python -m mpifed.table TABLE --write-runs runs.txt                # for slurm/array.sbatch (one run per task)
    python -m mpifed.table TABLE --summary [--reference fedprox]      # the metric, each method against the reference
    python -m mpifed.table TABLE --summary --by-seed                  # ... the search's scores, every seed's values
    python -m mpifed.table TABLE --summary --diverged 10              # ... a diverged run counted at chance (or 'out')
    python -m mpifed.table TABLE --archive results                    # settled runs without weights (tables/archive.py)
    python -m mpifed.table TABLE --reuse results                      # take identical runs from another table's folder
    python -m mpifed.table TABLE --recheck /tmp/here --runs-root results   # a search across machines, on this one
    python -m mpifed.table TABLE --prune                              # free the disk: settled runs' checkpoints, state
    ... --methods fedavg fedntd --seeds 0 1 --settings fmnist-shard2  # any command, on part of the table
    ... --run 3 --dry-run                                             # what --run would run, writing nothing

A sweep is a table made on the command line (see :mod:`mpifed.tables.sweep`): one config, the
product of the values given, each point a run per seed; every command above works on it::

    python -m mpifed.table --config configs/quickstart.yaml --sweep train.lr=0.01,0.1 \
        data.partition.beta=0.1,0.5 --seeds 0 1 2 --run 3 --parallel 2     # then the same with --summary

A table file::

    title: "FedNTD Table 1, scaled"
    plugins: [../my_method.py]            # optional: code of your own (relative to the table), for every run
    metric: {kind: last_k, k: 5}          # the primary metric, declared before any run: the comparisons use it
    paper_metric: {kind: final, forgetting: true}   # optional: the paper's metric, shown beside
    reference: fedavg                     # optional: the row the others are compared with (default: FedAvg's)
    claims: ["fedntd > fedavg"]           # optional: the claims the table tests, declared before any run
    diverged: 10.0                        # optional: a diverged final run counts as this (default: left out)
    settings: [fmnist-shard2.yaml]        # config files relative to the table
    methods: [methods/fedavg.yaml, methods/fedntd.yaml]
    seeds: [0, 1, 2, 3, 4]
    tuning: {grid: {train.lr: [0.01, 0.03, 0.1]}, seeds: [0], rounds: 20}   # optional, see mpifed.tables.tuning

Each run is ``--config <setting> --config <method>`` (plus the tuned values). A setting's or
method's label is its file name without ``.yaml`` (with its folder when two share a name).
Runs go to ``runs/<folder>-<table>/<setting>-<method>-s<seed>`` when they use the table's own
configuration; a run with ``--set`` overrides that change its results goes beside it, in
``<setting>-<method>-s<seed>-<hash of its configuration>``; search runs go to ``tuning/``.
A run counts as done only when its directory holds a finished run of the same configuration;
stopped ones are resumed, so ``--run`` and array jobs can be repeated safely, and ``--summary``
reports only runs of the configuration asked for, naming those it left out.

``--summary`` gives each cell as mean ± sample std over seeds, and for each method its paired
difference from the reference over the seeds both have (runs of one seed share partition,
initial model and client sampling): the mean difference with its 95% confidence interval,
the seeds it is ahead in, and the paired t-test's p-value (:mod:`mpifed.tables.stats`). Each declared
claim is tested the same way in every setting and labelled by its interval, with Holm's adjustment
over all of them (:mod:`mpifed.tables.summary`).
"""
from __future__ import annotations

import argparse
import math
import shlex
import sys
from pathlib import Path

from mpifed import __version__
from mpifed.settings import config
from mpifed.files.packaged import find_config
from mpifed.files.pipes import quiet_when_pipe_closes
from mpifed.tables.listing import listing
from mpifed.tables.running import dry_run, recheck, reuse, run_table, write_runs
from mpifed.tables.pivot import PivotError
from mpifed.tables.summarize import LEAVE_OUT, summarize, summary_table, tex_or_pivot
from mpifed.tables.sweep import DEFAULT_METRIC, load_sweep
from mpifed.tables.table_file import Table, load_table, resolve
from mpifed.tables.table_store import archive_table, prune


def _loaded(a: argparse.Namespace, added: list[str], record: bool) -> Table:
    """The table file of the command line, its runs resolved with the --set overrides ``added``
    (``record``: its search's choice written down) and selected by --settings, --methods and --seeds;
    a :class:`~mpifed.settings.config.ConfigError` for a bad table, --reference or --tune."""
    if a.sweep:
        table = load_sweep(a.config, [w for group in a.sweep for w in group], a.base, a.seeds, a.runs_root, a.plugin,
                           a.name, a.metric or DEFAULT_METRIC)
    else:
        table = load_table(a.table, a.runs_root, a.plugin)
    if a.reference is not None and a.reference not in {r.method for r in table.runs}:
        raise config.ConfigError(f"--reference {a.reference}: not a method of this table "
                                 f"({', '.join(dict.fromkeys(r.method for r in table.runs))})")
    if a.tune is not None and table.tuning is None:
        raise config.ConfigError(f"--tune: {a.table} declares no search (a tuning section)")
    resolve(table, added, record=record)
    table.select(a.settings, a.methods, None if a.sweep else a.seeds)
    return table


def _family_table(path: str, a: argparse.Namespace, added: list[str]) -> Table:
    """Another table of the report (--family), its runs under the same --runs-root and --set."""
    other = load_table(path, a.runs_root, a.plugin)
    resolve(other, added)
    return other


def _source(a: argparse.Namespace) -> list[str]:
    """The words of the command line that name the table: its file, or the sweep's configs and values."""
    if not a.sweep:
        return [a.table]
    words = [w for c in a.config for w in ("--config", c)] + ["--sweep", *(w for group in a.sweep for w in group)]
    words += ["--set", *a.base] if a.base else []
    return words + (["--name", a.name] if a.name else []) + (["--metric", a.metric] if a.metric else [])


def _archive(table: Table, a: argparse.Namespace, added: list[str]) -> int:
    """--archive: copy the settled runs to the folder, and print the command that summarises the copy."""
    filters = [w for flag, v in (("--settings", a.settings), ("--methods", a.methods), ("--seeds", a.seeds)) if v
               for w in (flag, *map(str, v))]
    set_again = ["--set", *added] if added else []
    code = [w for spec in a.plugin for w in ("--plugin", spec)]
    summary = shlex.join(["python", "-m", "mpifed.table", *_source(a), "--runs-root", a.archive, *code, *filters,
                          *set_again, "--summary"])
    print(archive_table(table, Path(a.archive), summary))
    return 0


def _print(text: str) -> int:
    print(text)
    return 0


def _diverged_arg(text: str) -> float | str:
    if text == LEAVE_OUT:
        return text
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"a finite number (e.g. 10 for chance on ten classes, in points) or "
                                         f"'{LEAVE_OUT}', got {text!r}")
    return value


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m mpifed.table", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("table", nargs="?", help="the table file (*.table.yaml); a configs/... path also finds the tables "
                                            "shipped with mpifed. Without one: a sweep (--config, --sweep)")
    s = p.add_argument_group("a sweep instead of a table file (mpifed.tables.sweep)")
    s.add_argument("--config", action="append", default=[], metavar="YAML", help="the sweep's config file "
                   "(repeatable; later files override earlier ones)")
    s.add_argument("--sweep", action="append", nargs="+", default=[], metavar="KEY=V1,V2",
                   help="the values of a key to sweep, e.g. train.lr=0.01,0.1; several keys: every combination")
    s.add_argument("--name", help="the sweep's folder under --runs-root (default: <config>-sweep-<keys>)")
    s.add_argument("--metric", help=f"the sweep's primary metric, as a table file declares it (default: "
                                    f"{DEFAULT_METRIC!r}, the final test accuracy)")
    p.add_argument("--runs-root", default="runs", help="folder that holds the table's run folder (default: runs)")
    p.add_argument("--plugin", action="append", default=[], metavar="FILE_OR_MODULE", help="load a Python file or "
                   "module of your own first (a method, model, data set or partition), for every run of the table "
                   "too; repeatable. A table file can name its own under plugins:")
    p.add_argument("--version", action="version", version=f"mpifed {__version__}")
    p.add_argument("--set", action="append", nargs="+", default=[], metavar="KEY=VALUE",
                   help="added to every run; runs with other results go to their own directories")
    p.add_argument("--settings", nargs="+", metavar="LABEL", help="only these settings (their labels, as --list shows "
                                                                  "them)")
    p.add_argument("--methods", nargs="+", metavar="LABEL", help="only these methods")
    p.add_argument("--seeds", nargs="+", type=int, metavar="SEED", help="only these seeds (the search keeps its own); "
                   "a sweep's seeds (default: its config's run.seed)")
    p.add_argument("--reference", metavar="LABEL", help="--summary: compare every method with this one "
                   "(default: the table's reference, else the FedAvg row)")
    p.add_argument("--family", nargs="+", metavar="TABLE", help="--summary: the other tables of a report, whose "
                   "declared claims join this table's in one more Holm adjustment, shown beside the table's own "
                   "(each table read under the same --runs-root and --set)")
    p.add_argument("--by-seed", action="store_true", help="--summary: also the search's scores as a table, and each "
                   "method's metric seed by seed with its difference from the reference on each seed")
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--list", action="store_true",
                   help="print each run's status and mpifed arguments; mark missing raw data")
    g.add_argument("--write-runs", metavar="FILE",
                   help="one line of mpifed arguments per run (for slurm/array.sbatch): the search runs while a search "
                        "is unfinished, then the table's runs")
    g.add_argument("--tune", type=int, metavar="N",
                   help="run the search here (N ranks each, 0: debug mode) and record the choice")
    g.add_argument("--run", type=int, metavar="N",
                   help="run here, one after another, with N ranks each (0: debug mode); a declared search runs first")
    g.add_argument("--summary", action="store_true",
                   help="the table in its metric, and each method against the reference")
    g.add_argument("--archive", metavar="FOLDER", help="copy the settled runs (finished or diverged, the search's "
                   "too) without their weights to FOLDER/<table folder>, for a repository; --runs-root FOLDER reads "
                   "them")
    g.add_argument("--reuse", metavar="FOLDER", nargs="+", help="copy into the table the records of the settled runs "
                   "under FOLDER (another table's runs, an archive) whose configuration is one of this table's runs "
                   "(the search's too), instead of making them again")
    g.add_argument("--recheck", metavar="FOLDER", help="for each search whose candidates ran on different machines: "
                   "run the best candidate of each other machine again here, into FOLDER, and say whether the search "
                   "chooses the same from this machine's scores alone (the table's runs are not touched; "
                   "mpifed.tables.machine_check)")
    g.add_argument("--prune", action="store_true", help="delete the checkpoints and per-client state of the settled "
                   "runs (finished or diverged), keeping their record and final model: gigabytes a run for methods "
                   "with per-client state over many clients (FedCurv, SCAFFOLD, MOON)")
    p.add_argument("--dry-run", action="store_true", help="--run/--tune: print the runs they would make now, with "
                   "their directories and commands, and write nothing")
    p.add_argument("--commands", action="store_true", help="--list: a line per run with its state and mpifed "
                   "arguments, instead of the grid")
    p.add_argument("--parallel", type=int, default=1, metavar="P", help="--run/--tune: P runs at once (a GPU, or a "
                   "machine with cores to spare; each run's output goes to <table runs>/logs/)")
    p.add_argument("--pivot", nargs="?", const="", metavar="DOWN,ACROSS", help="--summary of a sweep of two keys or "
                   "more: its metric as a pivot, one key down and another across (default: the first two keys)")
    p.add_argument("--latex", metavar="FILE", help="--summary: also write it (or the --pivot) to FILE as a LaTeX table "
                   "that compiles as it is (booktabs and siunitx; see mpifed.tables.latex)")
    p.add_argument("--mixed-machines", action="store_true",
                   help="--summary: pair runs of one seed even where they come from machines whose CPU, BLAS, GPU or "
                        "torch differ (refused by default: CPU numbers differ by more than rounding across machines)")
    p.add_argument("--diverged", type=_diverged_arg, metavar="VALUE",
                   help=f"--summary: count each diverged final run as VALUE in the primary metric (e.g. 10 for chance "
                        f"on ten classes), or '{LEAVE_OUT}' to leave them out: a check beside what the table declares "
                        f"(its 'diverged' key; without one they are left out)")
    return p


@quiet_when_pipe_closes
def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    p = _parser()
    a = p.parse_args(argv)
    if a.parallel < 1:
        p.error("--parallel must be at least 1")
    for flag, given in (("--by-seed", a.by_seed), ("--diverged", a.diverged is not None), ("--family", a.family),
                        ("--pivot", a.pivot is not None), ("--latex", a.latex)):
        if given and not a.summary:
            p.error(f"{flag} goes with --summary")
    if a.commands and not a.list:
        p.error("--commands goes with --list")
    if a.dry_run and a.run is None and a.tune is None:
        p.error("--dry-run goes with --run or --tune (--list shows every run's state)")
    if a.table is not None and (a.sweep or a.config or a.name or a.metric):
        p.error("--config, --sweep, --name and --metric make a sweep without a table file (a table file searches "
                "values with its tuning section); give one or the other")
    if not a.sweep and (a.config or a.name or a.metric):
        p.error("--config, --name and --metric go with --sweep KEY=V1,V2 ...")
    if a.sweep and not a.config:
        p.error("--sweep needs the config it sweeps: --config X.yaml")
    if a.table is None and not a.sweep:
        p.error("give a table file, or a sweep: --config X.yaml --sweep KEY=V1,V2 ...")
    added = [o for group in a.set for o in group]
    a.base = []
    if a.sweep:        # a sweep's --set is part of its configuration, as its config files are
        a.base, added = added, []
    again = shlex.join(["python", "-m", "mpifed.table", *argv])
    try:
        record = not a.dry_run and (a.tune is not None or a.run is not None or a.write_runs is not None
                                    or a.reuse is not None)
        table = _loaded(a, added, record)
        ranks = a.tune if a.tune is not None else a.run
        if a.dry_run:
            return _print(dry_run(table, ranks, a.tune is not None, added, a.parallel))
        if a.list:
            return _print(listing(table, added, a.commands))
        if a.write_runs:
            return _print(write_runs(table, added, a.write_runs))
        if a.summary:
            mine = find_config(a.table).resolve() if a.table else None
            family = [_family_table(path, a, added) for path in dict.fromkeys(a.family or [])
                      if find_config(path).resolve() != mine]          # the table itself is in the family already
            if a.pivot is not None or a.latex:
                return _print(tex_or_pivot(summarize(table, a.reference, a.diverged, a.mixed_machines), a.pivot,
                                           a.latex))
            return _print(summary_table(table, a.reference, a.by_seed, a.diverged, family, a.mixed_machines))
        if a.archive:
            return _archive(table, a, added)
        if a.prune:
            return _print(prune(table))
        if a.reuse:
            return reuse(table, a.reuse, lambda: _loaded(a, added, record=True))
        if a.recheck:
            return recheck(table, Path(a.recheck), added, again, a.parallel)
        return run_table(table, ranks, a.tune is not None, added, again, lambda: _loaded(a, added, record=True),
                         a.parallel, a.reference)
    except (config.ConfigError, OSError, PivotError) as exc:
        if isinstance(exc, BrokenPipeError):
            raise       # the reader went away: quiet_when_pipe_closes ends the command quietly
        print(f"[mpifed.table] {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
