"""The configs shipped inside the package (the repository's ``configs/``, installed as package
data, with the files they name, such as a tokenizer's vocab.txt), so that a pip-installed
mpifed runs the quick start and the paper configs without a clone.

``--config configs/papers/fedntd/cifar10-shard2.yaml`` (or the path without ``configs/``)
reads the file from the current directory when it exists there, else the shipped copy; a
``configs/...`` folder in a config (``data.tokenizer``) is found the same way.
``mpifed config list`` prints the shipped configs; ``mpifed config copy [DEST]`` copies them
into DEST (default ``./configs``) for editing.
"""
from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

from mpifed import __version__
from mpifed.pipes import quiet_when_pipe_closes

CONFIGS = Path(__file__).resolve().parent / "configs"


def find_config(path: str | Path) -> Path:
    """``path`` if it exists, else the shipped config it names (with or without the leading
    ``configs/``), else ``path`` unchanged (for the caller's 'does not exist' message)."""
    found = _shipped(path)
    return found if found.is_file() else Path(path)


def find_folder(path: str | Path) -> Path:
    """``path`` if it exists, else the shipped folder it names (a ``configs/...`` path), else ``path``."""
    found = _shipped(path)
    return found if found.is_dir() else Path(path)


def _shipped(path: str | Path) -> Path:
    path = Path(path)
    if path.exists() or path.is_absolute():
        return path
    parts = path.parts[1:] if path.parts and path.parts[0] == "configs" else path.parts
    return CONFIGS.joinpath(*parts) if parts else CONFIGS


def shipped() -> list[str]:
    """Every shipped config, as the ``configs/...`` path that ``--config`` accepts."""
    return sorted(f"configs/{p.relative_to(CONFIGS).as_posix()}" for p in CONFIGS.rglob("*.yaml"))


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
