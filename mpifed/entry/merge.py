"""``mpifed merge SOURCE... --into RESULTS``: the settled runs of several machines' or clusters' runs
roots (or archives) in one results tree, provenance kept, so that a table is summarised from all of
them (``mpifed table TABLE --runs-root RESULTS --summary``). See :mod:`mpifed.tables.merge` for
what is matched, refused and kept.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from mpifed import __version__
from mpifed.files.pipes import quiet_when_pipe_closes
from mpifed.tables.merge import MergeError, merge, merge_summary


@quiet_when_pipe_closes
def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="mpifed merge", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("sources", nargs="+", metavar="SOURCE", help="runs roots, tables' folders or archives, e.g. "
                   "copies of each cluster's runs/ folder")
    p.add_argument("--into", required=True, metavar="RESULTS", help="the results tree to merge them into (made if "
                   "absent; runs already there are matched, never overwritten)")
    p.add_argument("--version", action="version", version=f"mpifed {__version__}")
    a = p.parse_args(argv)
    into = Path(a.into)
    try:
        done = merge([Path(s) for s in a.sources], into)
    except (MergeError, OSError) as exc:
        print(f"[mpifed merge] {exc}", file=sys.stderr)
        return 2
    print(merge_summary(done, into))
    return 0


if __name__ == "__main__":
    sys.exit(main())
