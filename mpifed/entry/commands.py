"""mpifed COMMAND [arguments...] (also python -m mpifed): one entry point for every mpifed tool.

commands:
  run      train, in this process (the debug mode) or as one rank of mpirun    (= python -m mpifed.main)
  launch   run with N ranks on this machine: mpifed launch -n N ...            (= python -m mpifed.launch)
  prepare  write a config's client shards; --download fetches the raw data     (= python -m mpifed.prepare)
  table    expand a paper table into runs, run them, summarise them            (= python -m mpifed.table)
  report   curves, per-class heatmaps and tables from finished runs            (= python -m mpifed.report)
  evaluate a finished run's model on its test set, validation set or a config's (= python -m mpifed.evaluate)
  config   list the configs shipped with mpifed, or copy them to edit
  slurm    write the Slurm job scripts shipped with mpifed into ./slurm
  check-method  check that each method a file registers is right when its step is captured (CUDA graphs)
  merge    several machines' runs in one results tree, for one table's summary

`mpifed COMMAND --help` shows a command's own arguments. `mpifed --config X ...` (options
without a command) is `mpifed run --config X ...`.
"""
from __future__ import annotations

import argparse
import importlib
import sys
from typing import Callable

from mpifed import __version__

COMMANDS = {"run": "mpifed.entry.main", "launch": "mpifed.entry.launch", "prepare": "mpifed.entry.prepare",
            "table": "mpifed.entry.table", "report": "mpifed.entry.report", "evaluate": "mpifed.entry.evaluate",
            "config": "mpifed.entry.configs", "slurm": "mpifed.entry.jobscripts",
            "check-method": "mpifed.entry.check_method", "merge": "mpifed.entry.merge"}


def command_main(name: str) -> Callable[[list[str]], int] | None:
    """The ``main`` of a command's module; None when that module is not installed."""
    module = COMMANDS[name]
    try:
        return importlib.import_module(module).main
    except ModuleNotFoundError as exc:
        if exc.name != module:
            raise
        return None


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and argv[0].startswith("-") and argv[0] not in ("-h", "--help", "--version"):
        argv = ["run", *argv]
    if argv and argv[0] in COMMANDS:
        run = command_main(argv[0])
        if run is None:
            print(f"mpifed {argv[0]}: not available in this installation (no module {COMMANDS[argv[0]]}); "
                  "update mpifed to a version that has it", file=sys.stderr)
            return 2
        return run(argv[1:])
    p = argparse.ArgumentParser(prog="mpifed", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("command", choices=sorted(COMMANDS), help="what to do (see the list above)")
    p.add_argument("--version", action="version", version=f"mpifed {__version__}")
    if not argv:
        p.print_help()
        return 0
    p.parse_args(argv)
    return 2


if __name__ == "__main__":
    sys.exit(main())
