"""``python -m mpifed.launch``: the public path of :mod:`mpifed.entry.launch` (see docs/architecture.md)."""
import sys

from mpifed.entry import launch as _home
from mpifed.entry.launch import *  # noqa: F403  (its names, for type checkers)

if __name__ == "__main__":
    sys.exit(_home.main())
sys.modules[__name__] = _home
