"""Figures and tables from finished runs: ``python -m mpifed.report RUNS_OR_TABLE... --out DIR``.

    python -m mpifed.report configs/repro/fedntd/table1.table.yaml --out report/     # a table's runs
    python -m mpifed.report runs/fedntd-table1 runs/my-run --out report/ --format pdf

Each input is a table file (its runs under ``--runs-root``, with ``--set`` picking the
configuration as ``python -m mpifed.table`` does), a run directory, or a folder of run
directories. Runs are grouped into methods: a table's methods, or for directories the run's
name without ``-s<seed>``; runs of different configurations are never put in one group.
For every setting (a table's setting, or the folder that holds the runs) it writes:

    <setting>-curves.<fmt>      test accuracy (%) and loss (or the --y metrics) against round (or
                                --x wall_time, sim_time, bytes), one line per method: the mean over
                                the seeds, with the 95% t interval of that mean as a band (--band)
    <setting>-per-class.<fmt>   the final model's per-class test accuracy (methods x classes,
                                named where the data set names them)
    <setting>-async.<fmt>       where the setting holds asynchronous runs (aggregation fedbuff or
                                fedasync): the first --y metric against simulated time, one panel per
                                algorithm, one line per aggregation (sync, FedBuff (K=..), FedAsync)
    <setting>-staleness.<fmt>   and their staleness histogram: updates taken per run at each
                                staleness, those dropped as stale in the legend

and beside each figure a CSV of its numbers (``<setting>-curves.csv``, ...), to replot elsewhere.
Each method has one look (colour, line style, marker) in every figure; ``--greyscale`` for black
and white print, ``--legend``, ``--label METHOD=TEXT`` and ``--order`` for a paper's figure.

and for all inputs ``table.md``, ``table.csv`` and ``table.tex``: the table in its metric
(``--metric`` where given, else a table file's own, else final test accuracy), mean ± sample
std (n - 1) with n; for one table file what ``python -m mpifed.table TABLE --summary`` prints,
claims and Holm's adjustment included; the CSV with each method's paired difference with the
reference; the LaTeX a table float that compiles as it is (booktabs, siunitx-aligned numbers or
``--numbers plain``, ``--caption``, ``--tex-label``), in each setting the best in bold with every
method the seeds cannot tell from it (:mod:`mpifed.tables.latex`). Methods are shown as papers
write them (fedntd: FedNTD), each in one colour in every figure; titles carry the table's title
and the ``--set`` overrides the runs were made with. Without matplotlib the tables are still written.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import yaml

from mpifed.settings import config
from mpifed.run import results
from mpifed.files import safe_yaml
from mpifed.files.pipes import quiet_when_pipe_closes
from mpifed.tables.collection import Collection, ReportError, check_metric, collect
from mpifed.tables.curves import BANDS, X_AXES, FigureError, figure_options
from mpifed.tables.figures import FORMATS, figures
from mpifed.tables.latex import NUMBERS
from mpifed.tables.report_tables import tables_of, write_tables


@quiet_when_pipe_closes
def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m mpifed.report", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("inputs", nargs="+", metavar="RUNS_OR_TABLE", help="table files, run directories or folders of runs")
    p.add_argument("--out", required=True, metavar="DIR", help="folder the figures and tables are written to")
    p.add_argument("--format", choices=FORMATS, default="png", help="figure format (default: png)")
    p.add_argument("--size", choices=("column", "page"), default="page",
                   help="figure width: one column (3.35 in) or a two-column paper's full width (6.9 in; default); "
                        "no text smaller than 7 pt at that size")
    p.add_argument("--width", type=float, metavar="INCHES", help="figure width in inches (instead of --size)")
    p.add_argument("--title", metavar="TEXT", help="the figures' title (default: the table's title and the setting)")
    p.add_argument("--no-title", action="store_true", help="figures without a title (a paper's caption says it)")
    p.add_argument("--caption", metavar="TEXT", help="table.tex's caption (default: the table's title, metric and "
                   "what the numbers and bold say)")
    p.add_argument("--tex-label", default="tab:results", metavar="LABEL", help="table.tex's \\label (default: "
                   "tab:results)")
    p.add_argument("--numbers", choices=NUMBERS, default="siunitx", help="table.tex's numbers: aligned on the decimal "
                   "point by siunitx (default; the document loads siunitx and booktabs) or plain (booktabs alone)")
    p.add_argument("--x", choices=tuple(X_AXES), default="round", help="the curves' x axis: rounds (default), wall "
                   "time, or the simulated time and data sent that runs with system.clock=true record")
    p.add_argument("--y", default="test_acc,test_loss", metavar="METRICS", help="the metrics drawn, one panel each, "
                   "comma-separated: any the runs record (test_acc, test_loss, val_acc, train_loss, ...; default "
                   "test_acc,test_loss)")
    p.add_argument("--band", choices=tuple(BANDS), default="t95", help="the band around each mean: the 95%% t "
                   "interval of the mean over seeds (default), the sample std, or none")
    p.add_argument("--greyscale", action="store_true", help="lines in black and greys, told apart by line style and "
                   "marker (for black-and-white printing)")
    p.add_argument("--legend", choices=("inside", "outside", "none"), default="inside",
                   help="where the legend goes: inside the first panel (default), outside beside the last, or none")
    p.add_argument("--label", action="append", default=[], metavar="METHOD=TEXT",
                   help="show a method under another name in figures, e.g. --label 'fedntd=FedNTD (ours)'")
    p.add_argument("--order", metavar="M1,M2,...", help="list these methods first, in this order (figures)")
    p.add_argument("--versus", metavar="METHOD", help="a panel more per metric: each method's difference to METHOD, "
                   "seed by seed, its band the paired one (the 95%% t interval of the mean difference)")
    p.add_argument("--runs-root", default="runs", help="where a table file's runs are (as for python -m mpifed.table)")
    p.add_argument("--plugin", action="append", default=[], metavar="FILE_OR_MODULE", help="load a Python file or "
                   "module of your own first (as for python -m mpifed.table); runs made with plugins need none, "
                   "they keep a copy of their code")
    p.add_argument("--set", action="append", nargs="+", default=[], metavar="KEY=VALUE",
                   help="a table file's overrides: report the runs made with them (as for python -m mpifed.table)")
    p.add_argument("--mlflow", action="store_true", help="also add the tables and each setting's figures to the MLflow "
                   "run of every reported run that has one (made with run.mlflow=true), under report/")
    p.add_argument("--metric", metavar="YAML", help="the metric to report, e.g. best or "
                   "'{kind: final, rounds_to: [0.8]}' (default: a table file's own metric, for folders final test "
                   "accuracy; a given --metric replaces a table's)")
    a = p.parse_args(argv)
    if a.width is not None and not 1.0 <= a.width <= 20.0:
        print(f"[mpifed.report] --width {a.width:g}: give the figure's width in inches, from 1 to 20 (a column is "
              f"3.35, a page 6.9)", file=sys.stderr)
        return 2
    from mpifed.tables import plots
    try:
        options = figure_options(a.x, a.y, a.band, a.greyscale, a.label, a.order, a.versus)
        metric = None
        if a.metric:
            spec = safe_yaml.load(a.metric, f"--metric {a.metric!r}")
            metric = results.Metric.parse({"kind": spec} if spec in results.KINDS else spec)
        c = collect(a.inputs, a.runs_root, [o for group in a.set for o in group], metric, a.plugin)
        if metric is not None:
            check_metric(c, a.metric)
    except (ReportError, FigureError, results.MetricError, config.ConfigError, yaml.YAMLError) as exc:
        print(f"[mpifed.report] {exc}", file=sys.stderr)
        return 2
    out = Path(a.out)
    summary = tables_of(c)
    for note in c.notes:
        print(f"[mpifed.report] warning: {note}", file=sys.stderr)
    drawn: dict[str, list[Path]] = {}
    try:
        tables = write_tables(summary, out, a.caption, a.tex_label, a.numbers)
        try:
            plots.require()
            layout = plots.Layout(a.width or plots.SIZES[a.size], title=not a.no_title, legend=a.legend)
            drawn = figures(c, out, a.format, layout, a.title, options)
        except plots.PlotsUnavailable as exc:
            print(f"[mpifed.report] no figures: {exc}", file=sys.stderr)
        except FigureError as exc:
            print(f"[mpifed.report] {exc}", file=sys.stderr)
            return 2
    except OSError as exc:
        where = f"{exc.filename}: " if exc.filename and str(exc.filename) != str(out) else ""
        print(f"[mpifed.report] cannot write the report to --out {out} ({where}{exc.strerror}): give a folder you "
              f"can write to (a new or existing folder, not a file, not under /proc)", file=sys.stderr)
        return 2
    print(summary.markdown())
    print("\nwrote " + ", ".join(str(w) for w in tables + [f for fs in drawn.values() for f in fs]))
    if a.mlflow:
        return _to_mlflow(c, tables, drawn)
    return 0


def _to_mlflow(c: Collection, tables: list[Path], drawn: dict[str, list[Path]]) -> int:
    from mpifed.run.mlflow_log import log_report
    try:
        logged = [run_id for (setting, _), runs in c.groups.items()
                  for run_id in log_report(runs, tables + drawn.get(setting, []))]
    except RuntimeError as exc:
        print(f"[mpifed.report] --mlflow: {exc}", file=sys.stderr)
        return 2
    if not logged:
        print("[mpifed.report] --mlflow: none of these runs was tracked with MLflow (run.mlflow=true)", file=sys.stderr)
        return 2
    print(f"added the tables and figures to {len(logged)} MLflow runs, under report/")
    return 0


if __name__ == "__main__":
    sys.exit(main())
