"""``mpifed evaluate RUN_DIR... [--data test|val|CONFIG]`` (also ``python -m mpifed.evaluate``): rebuild
each run's trained model from its directory (network, weights, input normalisation, its own plugin
code) and print its figures on a data set: the run's test set (by default; the accuracy the run
recorded), its validation set, or the data set of a config file (same classes and input shape), e.g.

    mpifed evaluate runs/quickstart-20261201-120000
    mpifed evaluate runs/mytable-mine/*-s0 --data val
    mpifed evaluate runs/my-run --data configs/other-test-set.yaml --set data.test_subset=0

A run made with code of your own (a plugin) is rebuilt with that code only when you give it
(``--plugin FILE``, an installed package) or allow the run's recorded copy (``--trust-run-code``).
"""
from __future__ import annotations

import argparse
import json
import sys

from mpifed import __version__
from mpifed.settings import config, plugins
from mpifed.data.partitions import PartitionError
from mpifed.data.prepared import PreparedDataError
from mpifed.data.raw import DataMissing
from mpifed.files.pipes import quiet_when_pipe_closes
from mpifed.tables.trained import TrainedError, evaluate, load
from mpifed.run.record import RunRecord


def report(path: str, data: str, figures: dict, names: list[str], recorded: float | None) -> str:
    """The figures as lines of text: accuracy and loss, the recorded accuracy beside, per class."""
    lines = []
    if "test_acc" in figures:
        lines.append(f"{path}: test accuracy {figures['test_acc']:.4f}, loss {figures['test_loss']:.4f} on "
                     f"{figures['samples']} samples" + ("" if data == "test" else f" of {data}'s data set"))
        if data == "test" and recorded is not None:
            same = "the same" if abs(recorded - figures["test_acc"]) < 5e-7 else (
                "differs: evaluated on another machine, torch version or thread count, the last digits can move")
            lines.append(f"  recorded final_test_acc {recorded:.4f} ({same})")
        per_class = [f"{n} {a:.3f}" if a is not None else f"{n} -" for n, a in zip(names, figures["per_class_acc"])]
        lines.append("  per class: " + ", ".join(per_class))
    if "val_acc" in figures:
        lines.append(f"{path}: validation accuracy {figures['val_acc']:.4f}, loss {figures['val_loss']:.4f}"
                     + (f" on {figures['samples']} samples" if data == "val" else ""))
    return "\n".join(lines)


@quiet_when_pipe_closes
def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="mpifed evaluate", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("runs", nargs="+", metavar="RUN_DIR", help="run directories holding model.pt (finished runs)")
    p.add_argument("--data", default="test", metavar="test|val|CONFIG",
                   help="the run's test set (default), its validation set, or a config file's data set")
    p.add_argument("--set", action="append", nargs="+", default=[], metavar="KEY=VALUE",
                   help="with --data CONFIG: overrides of that config, e.g. data.test_subset=0")
    p.add_argument("--device", default="cpu", help="where the model runs (cpu, cuda, cuda:1)")
    p.add_argument("--json", action="store_true", help="print each run's figures as one JSON object a line")
    p.add_argument("--plugin", action="append", default=[], metavar="FILE_OR_MODULE",
                   help="load a Python file or module of your own first: a run made with that code (by its SHA-256) "
                        "is rebuilt with it; repeatable")
    p.add_argument(plugins.TRUST_FLAG, action="store_true",
                   help="rebuild each run with the code from outside mpifed that it records (its plugins, from the "
                        "run's copy), which mpifed otherwise runs only when given by --plugin or an installed "
                        "package (only for run folders from someone you trust)")
    p.add_argument("--version", action="version", version=f"mpifed {__version__}")
    a = p.parse_args(argv)
    overrides = [o for group in a.set for o in group]
    if overrides and a.data in ("test", "val"):
        p.error("--set goes with --data CONFIG")
    try:
        for spec in a.plugin:
            plugins.load(spec)
    except plugins.PluginError as exc:
        print(f"[mpifed.evaluate] {exc}", file=sys.stderr)
        return 2
    code = 0
    for run in a.runs:
        try:
            trained = load(run, a.device, trust=a.trust_run_code, allow=f"add {plugins.TRUST_FLAG}, or give the same "
                           f"code yourself (--plugin FILE, or its installed package)")
            figures = evaluate(trained, a.data, overrides)
        except (TrainedError, config.ConfigError, DataMissing, PartitionError, PreparedDataError) as exc:
            print(f"[mpifed.evaluate] {exc}", file=sys.stderr)
            code = 2
            continue
        recorded = RunRecord(trained.path).summary.get("final_test_acc")
        if a.json:
            print(json.dumps({"run": run, **figures, "recorded_final_test_acc": recorded}))
        else:
            print(report(run, a.data, figures, trained.class_names, recorded), flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
