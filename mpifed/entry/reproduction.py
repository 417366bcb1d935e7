"""``python -m mpifed.entry.reproduction --write docs/REPRODUCTION.md`` rewrites the parts of the
report generated from the archived runs (:mod:`mpifed.tables.reproduction`); ``--check`` fails when
one is stale (so does tests/test_reproduction.py).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from mpifed.tables.reproduction import blocks, load, rewrite, summaries


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m mpifed.entry.reproduction", description=__doc__.split("\n\n")[0])
    p.add_argument("report", nargs="?", default="docs/REPRODUCTION.md", help="the report (docs/REPRODUCTION.md)")
    p.add_argument("--runs-root", default="results", help="the archived runs (results)")
    mode = p.add_mutually_exclusive_group(required=True)
    mode.add_argument("--write", action="store_true", help="rewrite the report's generated parts")
    mode.add_argument("--check", action="store_true", help="fail when a generated part is stale")
    a = p.parse_args(argv)
    path = Path(a.report)
    text = path.read_text()
    try:
        new = rewrite(text, blocks(summaries(load(a.runs_root))))
    except ValueError as e:
        print(f"{path}: {e}", file=sys.stderr)
        return 2
    if a.write:
        path.write_text(new)
        return 0
    if new != text:
        print(f"{path}: its generated parts are stale: python -m mpifed.entry.reproduction {path} --write",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
