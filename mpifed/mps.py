"""``python -m mpifed.mps``: the public path of :mod:`mpifed.entry.cuda_mps` (see docs/architecture.md)."""
import sys

from mpifed.entry import cuda_mps as _home
from mpifed.entry.cuda_mps import *  # noqa: F403  (its names, for type checkers)

if __name__ == "__main__":
    sys.exit(_home.main())
sys.modules[__name__] = _home
