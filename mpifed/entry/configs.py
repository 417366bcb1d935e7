"""``mpifed config list`` prints the configs shipped with mpifed (paths that ``--config`` accepts
anywhere); ``mpifed config copy [DEST]`` copies them into DEST (default ``./configs``) for editing.
"""
from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

from mpifed import __version__
from mpifed.files.packaged import CONFIGS, shipped
from mpifed.files.pipes import quiet_when_pipe_closes


@quiet_when_pipe_closes
def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="mpifed config", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--version", action="version", version=f"mpifed {__version__}")
    sub = p.add_subparsers(dest="action", required=True, metavar="{list,copy}")
    sub.add_parser("list", help="print the shipped configs (paths that --config accepts anywhere)")
    copy = sub.add_parser("copy", help="copy the shipped configs into a folder, to edit them")
    copy.add_argument("dest", nargs="?", default="configs", help="the folder to copy into (default: ./configs)")
    copy.add_argument("--force", action="store_true", help="overwrite files that already exist there")
    args = p.parse_args(argv)
    if args.action == "list":
        print("\n".join(shipped()))
        return 0
    dest = Path(args.dest)
    if dest.exists() and not dest.is_dir():
        print(f"[mpifed config] {dest} is a file, not a folder: give a folder to copy the configs into "
              f"(e.g. mpifed config copy my-configs)", file=sys.stderr)
        return 2
    clashes = [f for f in shipped() if (dest / Path(f).relative_to("configs")).exists()]
    if clashes and not args.force:
        print(f"[mpifed config] {len(clashes)} files already exist in {dest} (e.g. {clashes[0]}); "
              "use --force to overwrite them, or another folder", file=sys.stderr)
        return 2
    try:
        shutil.copytree(CONFIGS, dest, dirs_exist_ok=True)
    except OSError as exc:
        print(f"[mpifed config] cannot copy the configs to {dest} ({exc}): give a folder you can write to",
              file=sys.stderr)
        return 2
    print(f"copied {len(shipped())} configs to {dest}/")
    return 0


if __name__ == "__main__":
    sys.exit(main())
