"""``mpifed check-method FILE...``: whether each method a file registers keeps its local step right when captured.

Under ``resources.cuda_graphs`` a method's local step is captured once and replayed: a value its loss
reads that is not a declared input (``inputs()``) is replayed as it was when captured. This command
loads each file as ``--plugin`` does and runs every method it registers on tiny data, captured and
eagerly (:mod:`mpifed.round.capture_check`), e.g.

    mpifed check-method my_method.py

Exit status 0 when every captured step equals the eager one; 1 when one does not, with the method,
the line of the step that reads the value, the round where the replay left the eager step, and what
to do; 2 when a file cannot be loaded, registers no method, or a method does not run at all.
"""
from __future__ import annotations

import argparse
import sys

from mpifed.files.pipes import quiet_when_pipe_closes
from mpifed.plugin.registry import ALGORITHMS
from mpifed.round.capture_check import check_method
from mpifed.settings import plugins


@quiet_when_pipe_closes
def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="mpifed check-method", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("files", nargs="+", metavar="FILE", help="a Python file (or module) that registers methods")
    p.add_argument("--rounds", type=int, default=4,
                   help="rounds to run, at least 2 (a method with a buffer_size option runs buffer_size + 2: its "
                        "warm-up, then rounds past it)")
    args = p.parse_args(argv)
    if args.rounds < 2:
        print(f"mpifed check-method: --rounds {args.rounds}: a captured step can only leave the eager one in a round "
              f"after the one it was captured in; give 2 or more", file=sys.stderr)
        return 2
    failed = False
    for spec in args.files:
        try:
            plugin = plugins.load(spec)
        except plugins.PluginError as exc:
            print(f"mpifed check-method: {exc}", file=sys.stderr)
            return 2
        names = [name for kind, name in plugin.provides if kind == "algorithm"]
        if not names:
            print(f"mpifed check-method: {spec} registers no method (only {plugin.provides}); register an Algorithm "
                  f"with @ALGORITHMS.register(\"name\")", file=sys.stderr)
            return 2
        for name in names:
            try:
                result = check_method(name, ALGORITHMS.get(name), rounds=args.rounds)
            except Exception as exc:
                print(f"mpifed check-method: method {name} did not run on the check's tiny data (a small network on "
                      f"1 x 2 x 2 inputs, 3 classes, 4 clients): {type(exc).__name__}: {exc}. Fix the method, or "
                      f"check what it needs of the data or the network", file=sys.stderr)
                return 2
            if result.ok:
                print(f"{name}: the captured step equals the eager step over {result.rounds} rounds")
            else:
                failed = True
                print(result.problem, file=sys.stderr)
    return 1 if failed else 0
