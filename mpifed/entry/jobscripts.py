"""``mpifed slurm [--force]``: write the Slurm job scripts shipped with mpifed (the repository's
``slurm/``: cpu, gpu-node, multi-node and array sbatch scripts and their common.sh) into
``./slurm``, for a pip-installed mpifed without a clone. Submit them from the folder that
holds ``slurm/`` (they source ``slurm/common.sh`` from the submit folder), e.g.
``sbatch slurm/cpu.sbatch configs/quickstart.yaml``; docs/operations.md describes them.
"""
from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

from mpifed import __version__

SCRIPTS = Path(__file__).resolve().parents[1] / "slurm"
DEST = Path("slurm")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="mpifed slurm", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--force", action="store_true", help="overwrite scripts that already exist in ./slurm")
    p.add_argument("--version", action="version", version=f"mpifed {__version__}")
    args = p.parse_args(argv)
    files = sorted(f for f in SCRIPTS.iterdir() if f.suffix in (".sbatch", ".sh"))
    clashes = [DEST / f.name for f in files if (DEST / f.name).exists()]
    if clashes and not args.force:
        print(f"[mpifed slurm] {len(clashes)} scripts already exist (e.g. {clashes[0]}); use --force to overwrite them",
              file=sys.stderr)
        return 2
    try:
        DEST.mkdir(exist_ok=True)
        for f in files:
            shutil.copy2(f, DEST / f.name)
    except OSError as exc:
        print(f"[mpifed slurm] cannot write {DEST}/ ({exc.strerror}): run it in a folder you can write to",
              file=sys.stderr)
        return 2
    print(f"wrote {', '.join(str(DEST / f.name) for f in files)}; submit from here, e.g.\n"
          f"  sbatch slurm/cpu.sbatch configs/quickstart.yaml")
    return 0


if __name__ == "__main__":
    sys.exit(main())
